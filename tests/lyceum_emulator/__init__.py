"""An emulator of Lyceum's public API for tests: `python -m tests.lyceum_emulator --port N --home DIR`,
or `Emulator(home)` in a pytest fixture. See server.py for routes and test controls."""

from .server import Emulator, Fault

__all__ = ["Emulator", "Fault"]
