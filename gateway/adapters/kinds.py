"""Backend kind -> adapter class. Adding a kind is one adapter module plus one line here."""

from __future__ import annotations

from typing import Final

from gateway.adapters.base import Adapter
from gateway.adapters.dynamo import DynamoAdapter
from gateway.adapters.kvfence import KvfenceAdapter
from gateway.adapters.unscoped import LlamacppAdapter, OpenaiAdapter, TgiAdapter
from gateway.adapters.vllm import MaxAdapter, SglangAdapter, TrtllmAdapter, VllmAdapter

ADAPTERS: Final[dict[str, type[Adapter]]] = {
    cls.kind: cls
    for cls in (
        VllmAdapter,
        SglangAdapter,
        TrtllmAdapter,
        MaxAdapter,
        DynamoAdapter,
        KvfenceAdapter,
        TgiAdapter,
        LlamacppAdapter,
        OpenaiAdapter,
    )
}
