"""The e2e tests share the session's cluster with the integration tests (tests/kit.py)."""

from tests.kit import Kit

__all__ = ["Kit"]
