"""The gpukit Terraform provider: `provider "gpukit" { backend = "local" }`.

Credentials (a cloud API key, bucket keys) are read from the environment by the backend and never
become provider attributes, so they never reach Terraform state or plan files.
"""

from __future__ import annotations

import os
from pathlib import Path

from tf import schema, types
from tf.iface import Config, DataSource, Resource
from tf.provider import Provider
from tf.utils import Diagnostics

from glue.cloud import BACKENDS, get_backend
from glue.cloud.base import Backend
from glue.errors import GlueError
from glue.tfprovider.bucket_data import BucketDataSource
from glue.tfprovider.identity import SOURCE
from glue.tfprovider.vm_resource import VMResource


class GpukitProvider(Provider):
    def __init__(self) -> None:
        self._backend: Backend | None = None

    def full_name(self) -> str:
        return SOURCE

    def get_model_prefix(self) -> str:
        return "gpukit_"

    def get_provider_schema(self, diags: Diagnostics) -> schema.Schema:
        return schema.Schema(
            version=1,
            attributes=[
                schema.Attribute(
                    "backend", types.String(), required=True,
                    description=f"Where VMs are created: one of {', '.join(BACKENDS)}.",
                ),
            ],
        )

    def validate_config(self, diags: Diagnostics, config: Config) -> None:
        backend = config.get("backend")
        if isinstance(backend, str) and backend not in BACKENDS:
            diags.add_error(
                f"unknown backend {backend!r}",
                f"Set backend to one of: {', '.join(BACKENDS)}.",
                path=["backend"],
            )

    def configure_provider(self, diags: Diagnostics, config: Config) -> None:
        home = os.environ.get("GPUKIT_HOME")
        if not home:
            diags.add_error("GPUKIT_HOME is not set", "Run terraform through `glue up`, which sets it.")
            return
        try:
            self._backend = get_backend(str(config["backend"]), Path(home))
        except GlueError as exc:
            diags.add_error(str(exc))

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise GlueError("the gpukit provider was used before it was configured")
        return self._backend

    def get_data_sources(self) -> list[type[DataSource]]:
        return [BucketDataSource]

    def get_resources(self) -> list[type[Resource]]:
        return [VMResource]

