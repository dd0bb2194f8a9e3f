"""Integration tests use the kit fixtures registered in tests/conftest.py (defined in tests/kit.py)."""

from collections.abc import Iterator

import pytest

from tests.kit import Kit

__all__ = ["Kit"]


@pytest.fixture
def qemu_kit(kit: Kit) -> Iterator[Kit]:
    """`kit`, and every qemu VM it made deleted afterwards (test_qemu*.py)."""
    from glue.cloud.qemu.backend import QemuBackend

    yield kit
    backend = QemuBackend(kit.home)
    for vm_id in backend.owned_vm_ids():
        backend.delete_vm(vm_id)
