"""OpenAI request parsing for the backend (the answers' shapes: backend.shapes). Pure functions,
no I/O.

Invariant: anything a client sends is validated here into a frozen `GenerationRequest`; a bad
field is a `BadRequest` (HTTP 400) naming the field, never an exception from deep inside.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backend.engine.plan import SamplingParams
from backend.errors import BadRequest
from backend.fields import check_fields

MAX_TOKENS_DEFAULT = 256
MAX_TOKENS_LIMIT = 4096
N_LIMIT = 8  # each choice is a sequence of its own in the engine: its own blocks and batch slot
TOP_LOGPROBS_LIMIT = 20  # OpenAI's, on chat
COMPLETION_LOGPROBS_LIMIT = 5  # OpenAI's, on completions


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
    n: int = 1  # choices

    @property
    def logprobs(self) -> bool:
        return self.sampling.logprobs is not None

    def choice_sampling(self, index: int) -> SamplingParams:
        """Choice `index`'s sampling: with a seed, each choice draws from a seed of its own
        (choice 0 from the request's, so n=1 answers are those of n=1)."""
        seed = self.sampling.seed
        if seed is None or index == 0:
            return self.sampling
        digest = hashlib.sha256(f"{seed}:choice:{index}".encode()).digest()
        return replace(self.sampling, seed=int.from_bytes(digest[:8], "little") >> 1)


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
    n = _integer(body, "n", 1, 1, N_LIMIT)
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
        logprobs=_logprobs(body) if endpoint == "chat" else _completion_logprobs(body),
    )
    stop = _stop(body.get("stop"))
    ignore_eos = _bool(body, "ignore_eos", False)
    check_fields(body, endpoint)  # last: a missing required field is the better message
    return GenerationRequest(
        endpoint, model, messages, prompt, sampling, stop, stream, include_usage, ignore_eos, n
    )


def _logprobs(body: dict[str, Any]) -> int | None:
    """Chat's `logprobs` and `top_logprobs`: None (off) or how many alternatives to list."""
    top = body.get("top_logprobs")
    if not _bool(body, "logprobs", False):
        if top is not None:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return _integer(body, "top_logprobs", 0, 0, TOP_LOGPROBS_LIMIT)


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    """The completions endpoint's `logprobs`: None (off) or how many alternatives to list."""
    if body.get("logprobs") is None:
        return None
    return _integer(body, "logprobs", 0, 0, COMPLETION_LOGPROBS_LIMIT)


def _messages(value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty array", "messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", "messages")
        role, content = message.get("role"), message.get("content")
        if (
            role in {"tool", "function"}
            or message.get("tool_calls")
            or message.get("function_call")
        ):
            raise BadRequest(
                f"messages[{i}] holds a tool call or its result: tool calling is not "
                "implemented by this backend",
                "messages",
            )
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
