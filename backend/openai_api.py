"""OpenAI request parsing and response shapes for the backend. Pure functions, no I/O.

Invariant: anything a client sends is validated here into a frozen `GenerationRequest`; a bad
field is a `BadRequest` (HTTP 400) naming the field, never an exception from deep inside.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from backend.engine.plan import SamplingParams
from backend.errors import BadRequest

MAX_TOKENS_DEFAULT = 256
MAX_TOKENS_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    endpoint: str  # "chat" | "completion"
    model: str
    messages: tuple[dict[str, str], ...]
    prompt: str
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def parse_generation(body: dict[str, Any], endpoint: str) -> GenerationRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", "model")
    messages: tuple[dict[str, str], ...] = ()
    prompt = ""
    if endpoint == "chat":
        messages = _messages(body.get("messages"))
    else:
        prompt = _prompt(body.get("prompt"))
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    include_usage = _bool(options, "include_usage", False, "stream_options")
    if _number(body, "n", 1, 1, 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    newer = body.get("max_completion_tokens") is not None
    limit_key = "max_completion_tokens" if newer else "max_tokens"
    max_tokens = _integer(body, limit_key, MAX_TOKENS_DEFAULT, 1, MAX_TOKENS_LIMIT)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("'seed' must be an integer", "seed")
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        seed=seed,
    )
    stop = _stop(body.get("stop"))
    ignore_eos = _bool(body, "ignore_eos", False)
    return GenerationRequest(
        endpoint, model, messages, prompt, sampling, stop, stream, include_usage, ignore_eos
    )


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", "messages")
        role, content = message.get("role"), message.get("content")
        if role not in {"system", "user", "assistant", "developer"}:
            raise BadRequest(f"messages[{i}].role is not supported", "messages")
        if isinstance(content, list):  # content parts: only text is supported
            parts = [
                p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"
            ]
            if not all(isinstance(p, str) for p in parts) or len(parts) != len(content):
                raise BadRequest(
                    f"messages[{i}].content: only text parts are supported", "messages"
                )
            content = "".join(parts)  # type: ignore[arg-type]
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", "messages")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return tuple(out)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if not isinstance(value, str) or not value:
        raise BadRequest("'prompt' must be a non-empty string", "prompt")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > 4:
        raise BadRequest("'stop' must be a string or up to 4 strings", "stop")
    if not all(isinstance(s, str) and s for s in value):
        raise BadRequest("'stop' entries must be non-empty strings", "stop")
    return tuple(value)


def _bool(body: dict[str, Any], key: str, default: bool, param: str | None = None) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean", param or key)
    return value


def _integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer", key)
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be between {low} and {high}", key)
    return value


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{key}' must be a number", key)
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be between {low:g} and {high:g}", key)
    return float(value)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_body(
    req: GenerationRequest, rid: str, text: str, finish: str, use: dict[str, Any]
) -> dict[str, Any]:
    created = int(time.time())
    if req.endpoint == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": req.model,
            "choices": [choice],
            "usage": use,
        }
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": use,
    }


def chunk_body(
    req: GenerationRequest, rid: str, created: int, text: str | None, finish: str | None
) -> dict[str, Any]:
    if req.endpoint == "chat":
        delta: dict[str, Any] = {} if text is None else {"content": text}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish,
            "logprobs": None,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
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
