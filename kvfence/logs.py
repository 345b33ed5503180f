"""JSON-lines logging and the one redaction helper every header dict passes before a log line.

Invariant: no log line carries a credential, a handle or a prompt.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, Final

import orjson

REDACTED_HEADERS: Final = frozenset(
    {
        "authorization",
        "x-api-key",
        "cookie",
        "set-cookie",
        "proxy-authorization",
        "x-kvfence-handle",
    }
)
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A loggable copy: credential and handle headers replaced by `<redacted>`."""
    return {
        str(k): "<redacted>" if k.lower().replace("_", "-") in REDACTED_HEADERS else v
        for k, v in headers
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            out["exc"] = record.exc_info[0].__name__
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
