"""An upstream error answer in a shape other than OpenAI's (FastAPI's `{"detail": "Not
Found"}`, vLLM's older top-level `{"object": "error", "message": ...}`, plain text) rewritten
into OpenAI's `{"error": {message, type, param, code}}`, its status and message kept, so an
OpenAI client shows what the server said.

Invariant: an answer already in OpenAI's shape passes byte for byte; a rewritten one carries
only the server's message (at most MAX_MESSAGE characters) and names nothing else of it.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Final

import orjson

MAX_MESSAGE: Final = 1024


def _is_openai_error(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


def _message(data: Any, raw: bytes) -> str:
    if isinstance(data, dict):
        for key in ("message", "detail", "error"):
            value = data.get(key)
            if isinstance(value, str) and value:
                return value
            if value is not None and key == "detail":  # FastAPI's validation errors: a list
                return orjson.dumps(value).decode()
    if data is None:
        return raw.decode("utf-8", errors="replace").strip()
    return ""


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def openai_shaped(status: int, raw: bytes) -> bytes | None:
    """`raw`, an error answer with `status`, in OpenAI's shape; None when it already is."""
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if _is_openai_error(data):
        return None
    message = _message(data, raw)[:MAX_MESSAGE] or _phrase(status)
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": kind, "param": None, "code": status}
    return orjson.dumps({"error": error})
