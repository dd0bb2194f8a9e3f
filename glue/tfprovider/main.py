"""Entry point terraform runs (through the launcher in the filesystem mirror)."""

from __future__ import annotations

from tf.runner import run_provider

from glue.tfprovider.provider import GpukitProvider


def main() -> None:
    run_provider(GpukitProvider())


if __name__ == "__main__":
    main()
