"""vLLM, SGLang, TensorRT-LLM and MAX Serve: the namespace travels as the top-level `cache_salt`
body field. vLLM takes it on every path it caches (chat, completions, responses, and embeddings
on a pooling server) and serves `/tokenize` and `/detokenize`, which cache nothing; SGLang's
salt reaches chat, completions and responses only."""

from __future__ import annotations

from typing import Any

from gateway.adapters.base import Adapter
from gateway.inputs.paths import CHAT, COMPLETIONS, RESPONSES


class VllmAdapter(Adapter):
    kind = "vllm"

    def inject(self, path: str, body: dict[str, Any], headers: dict[str, str], ns: str) -> None:
        body["cache_salt"] = ns


class SglangAdapter(VllmAdapter):
    """SGLang reads the same field (builds before its salt reached the scheduler are unisolated)."""

    kind = "sglang"
    paths = frozenset({CHAT, COMPLETIONS, RESPONSES})


class TrtllmAdapter(VllmAdapter):
    """trtllm-serve takes `cache_salt` on chat only; its completions endpoint refuses the field."""

    kind = "trtllm"
    paths = frozenset({CHAT})


class MaxAdapter(VllmAdapter):
    """Modular's MAX Serve takes the same field, but honours it only when the server was started
    with its cache-salt setting on; started without it, it shares one cache across every salt,
    which the first canary round finds (`shared`) and quarantines."""

    kind = "max"
