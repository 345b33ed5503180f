"""NVIDIA Dynamo: the `x-tenant-id` header wins over body salts, so the namespace goes there."""

from __future__ import annotations

from typing import Any

from gateway.adapters.base import Adapter
from gateway.inputs.paths import CHAT, COMPLETIONS, RESPONSES


class DynamoAdapter(Adapter):
    kind = "dynamo"
    paths = frozenset({CHAT, COMPLETIONS, RESPONSES})  # where its x-tenant-id is documented

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        headers["x-tenant-id"] = ns
