"""Requests the interop tests send to a vLLM-compatible server, and how they read cache hits.

Invariant: every prompt from `fresh_prompt` starts with a random nonce, so no earlier request can
have cached any of its blocks.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from tests.kit.vllm_server import SERVED_MODEL

BLOCK_TOKENS = 128  # vLLM's CPU backend caches whole blocks of this many tokens
WORD_TEXT = (
    "river stone lantern orbit meadow copper violet harbor signal tundra maple quartz falcon "
    "ember glacier saddle thistle canyon beacon walnut prism cobalt willow marble"
)
WORDS = tuple(WORD_TEXT.split())


def fresh_prompt(words: int = 400) -> str:
    """About `words` tokens (over two blocks at the default) that no cache can hold yet."""
    rng = random.Random(secrets.randbits(64))
    return secrets.token_hex(8) + " " + " ".join(rng.choice(WORDS) for _ in range(words))


def new_salt() -> str:
    return "t-" + secrets.token_urlsafe(16)


async def complete(
    http: aiohttp.ClientSession,
    url: str,
    prompt: str,
    salt: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """POST /v1/completions for one token; returns the status and the JSON answer."""
    body: dict[str, Any] = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    async with http.post(f"{url}/v1/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def cached_tokens(payload: dict[str, Any]) -> int:
    details = payload["usage"]["prompt_tokens_details"]
    assert details is not None, "vLLM must run with --enable-prompt-tokens-details"
    return int(details["cached_tokens"])


@dataclass(frozen=True, slots=True)
class Stream:
    chunks: list[dict[str, Any]]  # every `data:` event's JSON, in order
    done: bool  # the stream ended with `data: [DONE]`


async def stream_chat(
    http: aiohttp.ClientSession,
    url: str,
    prompt: str,
    *,
    salt: str | None = None,
    headers: Mapping[str, str] | None = None,
    include_usage: bool = True,
) -> Stream:
    """A streaming chat completion of a few tokens, read to the end."""
    body: dict[str, Any] = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "stream": True,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if salt is not None:
        body["cache_salt"] = salt
    chunks: list[dict[str, Any]] = []
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            data = raw.strip().removeprefix(b"data:").strip()
            if data == b"[DONE]":
                return Stream(chunks, done=True)
            if raw.startswith(b"data:"):
                chunks.append(orjson.loads(data))
    return Stream(chunks, done=False)
