"""kvfence's own backend: the namespace will travel in a signed handle; not yet routed."""

from __future__ import annotations

from typing import Any

from gateway.adapters.base import Adapter
from gateway.errors import NotSupported


class KvfenceAdapter(Adapter):
    kind = "kvfence"

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        raise NotSupported("routing to a kvfence backend is not yet supported")
