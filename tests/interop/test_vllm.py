"""A real vLLM scopes its prefix cache by `cache_salt` the way the vLLM adapter relies on.

Each check pairs a positive control (the same salt hits) with the isolation claim (another salt
misses), because with prefix caching off "another salt misses" would hold trivially.
"""

from __future__ import annotations

import random
import string

import aiohttp
import orjson
import pytest

from tests.interop.probes import (
    BLOCK_TOKENS,
    cached_tokens,
    complete,
    fresh_prompt,
    new_salt,
    stream_chat,
)

pytestmark = pytest.mark.vllm

SALT_ALPHABET = string.ascii_letters + string.digits + "._-"


async def test_same_salt_hits_and_another_salt_misses(
    vllm_url: str, http: aiohttp.ClientSession
) -> None:
    prompt, salt_a, salt_b = fresh_prompt(), new_salt(), new_salt()

    status, first = await complete(http, vllm_url, prompt, salt_a)
    assert status == 200
    assert first["usage"]["prompt_tokens"] > 2 * BLOCK_TOKENS
    assert cached_tokens(first) == 0

    _, repeat = await complete(http, vllm_url, prompt, salt_a)
    assert cached_tokens(repeat) >= 2 * BLOCK_TOKENS  # positive control: caching is on

    _, other = await complete(http, vllm_url, prompt, salt_b)
    assert cached_tokens(other) == 0  # isolation: A's blocks are unreachable under B's salt


async def test_unsalted_request_does_not_reach_salted_blocks(
    vllm_url: str, http: aiohttp.ClientSession
) -> None:
    prompt = fresh_prompt()
    salt = new_salt()
    await complete(http, vllm_url, prompt, salt)
    _, hit = await complete(http, vllm_url, prompt, salt)
    assert cached_tokens(hit) > 0
    _, unsalted = await complete(http, vllm_url, prompt, None)
    assert cached_tokens(unsalted) == 0


@pytest.mark.parametrize(
    "salt",
    ["", "a" * 129, "tenant/acme", "tenant@acme", "tenant\\acme", "tenant\x00acme"],
    ids=["empty", "129-chars", "slash", "at", "backslash", "nul"],
)
async def test_refuses_invalid_salts(vllm_url: str, http: aiohttp.ClientSession, salt: str) -> None:
    status, payload = await complete(http, vllm_url, "hello", salt)
    assert status == 400
    assert "cache_salt" in orjson.dumps(payload).decode()


async def test_accepts_gateway_alphabet_at_full_length(
    vllm_url: str, http: aiohttp.ClientSession
) -> None:
    shuffled = "".join(random.sample(SALT_ALPHABET, len(SALT_ALPHABET)))
    salt = (shuffled * 3)[:128]
    assert set(salt) == set(SALT_ALPHABET)
    prompt = fresh_prompt()
    status, first = await complete(http, vllm_url, prompt, salt)
    assert status == 200
    _, repeat = await complete(http, vllm_url, prompt, salt)
    assert cached_tokens(first) == 0
    assert cached_tokens(repeat) > 0


async def test_streaming_reports_cached_tokens_in_final_usage_chunk(
    vllm_url: str, http: aiohttp.ClientSession
) -> None:
    prompt, salt = fresh_prompt(), new_salt()
    await stream_chat(http, vllm_url, prompt, salt=salt)
    stream = await stream_chat(http, vllm_url, prompt, salt=salt)
    chunks = stream.chunks

    assert stream.done
    final = chunks[-1]
    assert final["choices"] == []
    assert cached_tokens(final) >= 2 * BLOCK_TOKENS
    assert all(chunk.get("usage") is None for chunk in chunks[:-1])
