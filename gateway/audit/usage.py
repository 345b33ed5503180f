"""Usage as the audit reads it: the prompt, cached and total tokens of a usage object (a plain
answer's, or a stream event's: `gateway.audit.answer.usage`), and what an answer that ended
without its usage is charged instead (`estimate`):

    prompt (as reported, else ceil(request body bytes / 4); nothing when it was never sent)
    + the larger of ceil(answer text bytes / 4) and the stream events the client got
    (at least 1 once the request was sent)

where the answer's text is the UTF-8 bytes of its text fields, plain or streamed alike
(`gateway.verify.scan`).

Invariant: pure: reading a usage object never changes an answer; the estimate is never 0 for
a request that was sent.
"""

from __future__ import annotations

from typing import Any

import orjson


def estimate(prompt: int | None, request_bytes: int, text_bytes: int, events: int) -> int:
    """The tokens charged for a sent request whose answer ended without its usage (the rule
    above): high rather than low."""
    if prompt is None:
        prompt = -(-request_bytes // 4)
    return max(1, prompt + max(events, -(-text_bytes // 4)))


def prompt_tokens(usage: Any) -> int | None:
    """`prompt_tokens` (chat/completions) or `input_tokens` (responses), if reported."""
    if not isinstance(usage, dict):
        return None
    for key in ("prompt_tokens", "input_tokens"):
        if isinstance(usage.get(key), int):
            return int(usage[key])
    return None


def total_tokens(usage: Any) -> int | None:
    """Prompt plus completion tokens (what a tokens-per-minute limit charges), if reported."""
    if not isinstance(usage, dict):
        return None
    if isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens",
                                    "output_tokens")]  # fmt: skip
    counted = [p for p in parts if isinstance(p, int)]
    return sum(counted) if counted else None


def parse_usage(body: bytes) -> tuple[Any, Any]:
    """A plain JSON answer parsed (None when it is not JSON), and its usage object."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, None
    return parsed, parsed.get("usage") if isinstance(parsed, dict) else None


def cached_tokens(usage: Any) -> int | None:
    """`cached_tokens` from a chat/completions or responses usage object, if reported."""
    if not isinstance(usage, dict):
        return None
    for details_key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(details_key)
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
    return None
