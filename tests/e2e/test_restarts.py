"""What `kvfence backend` chooses as it starts (the dtype, the kernels' row plans, the attention
plan, the thread governor) never changes an answer: the real SmolLM2 over real HTTP, started
twice, gives every greedy question the same tokens and the same logprobs, bit for bit, whether
the questions came all at once (batched) or one at a time (alone)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os

import aiohttp
import orjson

from bench import targets

QUESTIONS = [
    "What is the capital of France?",
    "Explain pallets in one line.",
    "Why is the sky blue?",
    "Write a haiku about customs forms.",
    "Name a prime number.",
    "What does insurance cover?",
    "Describe parcel tracking to a child.",
    "How do refunds usually work when a parcel is lost in transit?",
]
Answer = list[tuple[str, float, list[tuple[str, float]]]]


def _start() -> contextlib.AbstractContextManager[targets.Target]:
    """The backend as the bench starts it: throwaway keys, a fresh signed handle per request."""
    options = argparse.Namespace(
        backend_model="smollm2", model="smollm2", backend_threads=min(os.cpu_count() or 1, 2),
        backend_arg=[], name=None, emulate_avx2=False,
    )  # fmt: skip
    return targets.backend_target(options)


async def _ask(session: aiohttp.ClientSession, target: targets.Target, question: str) -> Answer:
    body = orjson.dumps(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
        }
    )
    headers = {"content-type": "application/json", **target.headers(body)}
    async with session.post(f"{target.base_url}/v1/chat/completions", data=body,
                            headers=headers) as answer:  # fmt: skip
        assert answer.status == 200, await answer.text()
        choice = (await answer.json())["choices"][0]
    return [
        (t["token"], t["logprob"], [(o["token"], o["logprob"]) for o in t["top_logprobs"]])
        for t in choice["logprobs"]["content"]
    ]


async def _together(target: targets.Target) -> list[Answer]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(_ask(session, target, q) for q in QUESTIONS)))


async def _one_at_a_time(target: targets.Target) -> list[Answer]:
    async with aiohttp.ClientSession() as session:
        return [await _ask(session, target, q) for q in QUESTIONS]


def test_two_starts_give_the_same_bits_batched_or_alone() -> None:
    with _start() as first:
        batched = asyncio.run(_together(first))
    with _start() as second:
        alone = asyncio.run(_one_at_a_time(second))
    assert all(answer for answer in batched)  # every question got tokens
    for question, a, b in zip(QUESTIONS, batched, alone, strict=True):
        assert a == b, f"{question!r}: the answers differ from token {_first_difference(a, b)}"


def _first_difference(a: Answer, b: Answer) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))
