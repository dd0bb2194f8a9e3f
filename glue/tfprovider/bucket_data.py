"""data "gpukit_bucket": where the persistent bucket is (endpoint, name, region) — never credentials."""

from __future__ import annotations

from tf import schema, types
from tf.iface import Config, DataSource, ReadDataContext, State

from glue.errors import GlueError
from glue.tfprovider.configured import ConfiguredProvider


class BucketDataSource(DataSource):
    def __init__(self, provider: ConfiguredProvider) -> None:
        self._provider = provider

    @classmethod
    def get_name(cls) -> str:
        return "bucket"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            version=1,
            attributes=[
                schema.Attribute("endpoint", types.String(), computed=True, description="S3 endpoint URL."),
                schema.Attribute("name", types.String(), computed=True, description="Bucket name."),
                schema.Attribute("region", types.String(), computed=True, description="Bucket region."),
            ],
        )

    def read(self, ctx: ReadDataContext, config: Config) -> State | None:
        try:
            info = self._provider.backend.bucket()
        except GlueError as exc:
            ctx.diagnostics.add_error(f"bucket: {exc}")
            return None
        return {"endpoint": info.endpoint, "name": info.name, "region": info.region}
