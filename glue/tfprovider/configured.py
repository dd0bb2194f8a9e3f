"""What a resource or data source needs of the provider: the backend it was configured with. A
Protocol, so the resources do not import the provider that lists them (no import cycle)."""

from __future__ import annotations

from typing import Protocol

from glue.cloud.base import Backend


class ConfiguredProvider(Protocol):
    @property
    def backend(self) -> Backend: ...
