"""JSON-lines logging and the one redaction helper every header dict passes before a log line.

Invariant: no log line carries a credential, a handle or a prompt: a header is redacted when its
name is a credential's (any spelling, `_` or `-`, any case) or its value looks like one, at every
log level alike.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable
from typing import Any, Final

import orjson

REDACTED: Final = "<redacted>"
REDACTED_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        "x-kvfence-handle",
        "x-kvfence-attestation",  # names namespaces
    }
)
# A header name with one of these words (split at `-`) is a credential's: `x-auth-token`,
# `ocp-apim-subscription-key`, `x-goog-api-key`, `x-session-secret`, `x-amz-security-token`...
CREDENTIAL_WORDS: Final = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "cookie",
        "session",
        "signature",
        "handle",
        "attestation",
    }
)
# Values that are credentials whatever header carries them: our API keys, handles and
# attestations, and any `Bearer`/`Basic` credential.
_CREDENTIAL_VALUE: Final = re.compile(r"(?i)\s*(kvf_|kvh1\.|kva1\.|bearer\s|basic\s)")
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def is_credential_header(name: str) -> bool:
    form = name.strip().lower().replace("_", "-")
    return form in REDACTED_HEADERS or not CREDENTIAL_WORDS.isdisjoint(form.split("-"))


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A loggable copy: credential and handle headers replaced by `<redacted>`."""
    return {
        str(k): REDACTED
        if is_credential_header(str(k)) or _CREDENTIAL_VALUE.match(str(v))
        else str(v)
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
