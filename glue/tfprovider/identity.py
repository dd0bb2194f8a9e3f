"""The provider's registry address and version: what terraform's configuration, the filesystem mirror and
`glue doctor` name it by. Apart from provider.py so that naming it does not import the provider (tf, grpc)."""

SOURCE = "local/gpukit/gpukit"
VERSION = "0.1.0"
