"""Integration tests use the kit fixtures registered in tests/conftest.py (defined in tests/kit.py)."""

from tests.kit import Kit

__all__ = ["Kit"]
