"""Backends that cannot partition their prefix cache; allowed only with `allow_unscoped: true`."""

from __future__ import annotations

from typing import Any

from gateway.adapters.base import Adapter
from gateway.inputs.paths import OPENAI_PATHS


class UnscopedAdapter(Adapter):
    """Injects nothing: isolation must come from one instance per tenant or no prefix cache."""

    kind = "unscoped"
    scoped = False
    paths = OPENAI_PATHS

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        return


class TgiAdapter(UnscopedAdapter):
    kind = "tgi"


class LlamacppAdapter(UnscopedAdapter):
    kind = "llamacpp"


class OpenaiAdapter(UnscopedAdapter):
    kind = "openai"
    health_path = "/v1/models"  # hosted APIs have no /health; a 401 here still means up
