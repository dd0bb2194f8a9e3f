"""The e2e tests reuse the integration fixtures (a throwaway kit home, a configured cluster)."""

from tests.integration.conftest import Kit, cluster_kit, kit

__all__ = ["Kit", "cluster_kit", "kit"]
