"""The probe's exception tree and the mapping of an endpoint's HTTP answer onto it.

Invariant: every message is safe to print: it names a credential only as "A" or "B", and any
text quoted from the server passes `redact` with that credential's secrets first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import orjson

MAX_QUOTE: Final = 300  # characters of a server's error message worth showing
TRANSIENT_STATUSES: Final = frozenset(
    {408, 409, 425, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529}
)


class ProbeError(Exception):
    """Base of everything the probe raises on purpose; `str()` is safe to print."""


class UsageError(ProbeError):
    """The command line cannot work: an unreadable credential, a malformed header or field,
    a URL that is not http(s), settings that contradict each other."""


class EndpointError(ProbeError):
    """The endpoint cannot be probed as configured."""


class AuthRefused(EndpointError):
    """401/403 for one credential."""


class ModelNotServed(EndpointError):
    """The endpoint does not serve the model asked for."""


class RequestRejected(EndpointError):
    """Another 4xx: the request itself is wrong for this endpoint (a body field, the URL)."""


class ProtocolError(EndpointError):
    """The answer is not an OpenAI-style event stream."""


class GaveUp(EndpointError):
    """Transient failures (429, 5xx, timeouts, resets) outlasted the bounded retries."""


class Retryable(Exception):
    """One failed attempt that may succeed later; `wait_s` is the server's Retry-After."""

    def __init__(self, reason: str, wait_s: float | None = None) -> None:
        super().__init__(reason)
        self.wait_s = wait_s


MIN_REDACTED = 4  # shorter values are not secrets worth garbling every message for


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if len(secret) >= MIN_REDACTED:
            text = text.replace(secret, "<redacted>")
    return text


def server_message(raw: bytes, secrets: Iterable[str]) -> str:
    """The error message a server sent (OpenAI `error.message`, `detail`, or the text)."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        found = err.get("message") if isinstance(err, dict) else err
        found = found or doc.get("message") or doc.get("detail")
        if isinstance(found, str):
            text = found
    text = " ".join(redact(text, secrets).split())
    return text[:MAX_QUOTE] + ("..." if len(text) > MAX_QUOTE else "")


def _about_model(status: int, message: str) -> bool:
    lowered = message.lower()
    return "model" in lowered and (
        status == 404
        or any(w in lowered for w in ("not found", "does not exist", "not served", "unknown"))
    )


def failure(status: int, raw: bytes, who: str, model: str, secrets: Iterable[str]) -> EndpointError:
    """The error for a non-retryable answer to credential `who`."""
    message = server_message(raw, secrets)
    said = f": {message}" if message else ""
    if status in (401, 403):
        return AuthRefused(f"credential {who} was refused ({status}){said}")
    if _about_model(status, message):
        return ModelNotServed(f"the endpoint does not serve model {model!r} ({status}){said}")
    if status == 404:
        return RequestRejected(f"404 from the endpoint: is the base URL right?{said}")
    return RequestRejected(f"the endpoint rejected credential {who}'s request ({status}){said}")


class MissingExtra(ProbeError):
    """An optional feature needs a package that is not installed."""
