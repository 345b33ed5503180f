"""The hardening tier reuses the gateway's fixtures (a fake upstream, the real gateway)."""

from tests.gateway.conftest import gw, upstream

__all__ = ["gw", "upstream"]
