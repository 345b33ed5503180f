"""The OpenAI shapes of the backend's answers: complete bodies, stream chunks, usage. Pure
functions, no I/O.

Invariant: every choice carries its index, and `logprobs` is null unless the request asked.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from backend.openai_api import GenerationRequest


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def choice_body(
    req: GenerationRequest,
    index: int,
    text: str,
    finish: str,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice of a complete answer; `logprobs` in the endpoint's shape, when asked for."""
    if req.endpoint == "chat":
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


def completion_body(
    req: GenerationRequest, rid: str, choices: list[dict[str, Any]], use: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion" if req.endpoint == "chat" else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
        "usage": use,
    }


def chunk_body(
    req: GenerationRequest,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A stream chunk of one choice; `logprobs`: those of the tokens it carries, shaped."""
    if req.endpoint == "chat":
        delta: dict[str, Any] = {} if text is None else {"content": text}
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice]}


def usage_chunk(req: GenerationRequest, rid: str, created: int, use: dict[str, Any]) -> bytes:
    obj = "chat.completion.chunk" if req.endpoint == "chat" else "text_completion"
    body = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [],
        "usage": use,
    }
    return sse(body)


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"
