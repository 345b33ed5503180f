"""Everything the gateway can answer with an error, as one tree; `error_body` is the one place
an error becomes OpenAI-style JSON, and `error_response` the one place it becomes an HTTP
answer (the app's middleware, the edge, the connection caps and the exchange all call it).

GatewayError
├── BadRequest (400): ClientInputRejected, MissingScopeValue, MalformedRequest (edge),
│   MalformedBody, UnknownField, PublicMarkRefused, CosignatureRefused
├── Unauthenticated (401)
├── NotFound (404): ModelNotFound (unknown and forbidden models alike), PathNotServed,
│   ReceiptNotFound (unknown, expired and other tenants' receipts alike), ProofPending,
│   LogNotFound
├── MethodNotAllowed (405, edge), RequestTimeout (408), BodyTooLarge (413)
├── RateLimited (429): BudgetExceeded
├── UnsupportedEncoding (415), NotSupported (501), VersionNotSupported (505, edge)
├── UpstreamUnavailable, AttestationRefused, AnswerTooLarge, HandleRefused (502)
├── AuditWriteFailed (502): ReceiptUnavailable
├── Overloaded, BackendQuarantined, SharedStateUnavailable, ControlUnavailable, NotReady (503)
└── UpstreamTimeout (504)

The edge's errors (`gateway.listener.edge`) are answered with `Connection: close`, and the
connection is closed after them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import ClassVar

import orjson
from aiohttp import web

from kvfence.verdict import VERDICT_HEADER, Verdict

CLIENT_CLOSED = 499  # recorded when the client left before its answer ended (no error is sent)


class GatewayError(Exception):
    """A local answer. `message` is shown to the client: never put a key or prompt in it.
    `retry_after_s`, when set, is sent as `Retry-After` (whole seconds, rounded up). `cause`
    is for the operator's log only (which URL failed, and how), never sent to the client.
    `param` is the request field the error is about (OpenAI's `param`), None when none is."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        retry_after_s: float | None = None,
        *,
        cause: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.cause = cause
        self.param = param


class BadRequest(GatewayError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class ClientInputRejected(BadRequest):
    code = "cache_scoping_input_rejected"


class MissingScopeValue(BadRequest):
    code = "missing_scope_value"


class MalformedRequest(BadRequest):
    """The listener cannot frame the request unambiguously; `reason` is the metric label."""

    code = "malformed_request"
    reason: str

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class MalformedBody(BadRequest):
    """The body's framing broke while it was read (a bad chunk, a cut body)."""

    code = "malformed_body"


class UnknownField(BadRequest):
    """A body field the gateway does not forward to this backend (unknown, or refused), under
    `gateway.unknown_fields: reject` (the default); `param` names it."""

    code = "unknown_field"


class PublicMarkRefused(BadRequest):
    """`x-kvfence-public-messages` from a tenant the policy does not let mark its own messages
    public, or that does not name leading plain-text chat messages."""

    code = "public_mark_refused"


class Unauthenticated(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class NotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class ModelNotFound(NotFound):
    """Unknown and forbidden models alike, as OpenAI answers both: a tenant learns nothing
    about the models of others."""

    code = "model_not_found"

    def __init__(self, model: str) -> None:
        shown = model if len(model) <= 128 else model[:128] + "..."
        super().__init__(
            f"The model `{shown}` does not exist or you do not have access to it.", param="model"
        )


class PathNotServed(NotFound):
    """A path no backend of the model serves (or can scope): the message names those it does,
    as OpenAI answers a model asked on a path it does not serve."""

    code = "path_not_served"


class RateLimited(GatewayError):
    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class ReceiptNotFound(NotFound):
    """Unknown, expired and other tenants' receipts alike: ids cannot be probed."""

    code = "receipt_not_found"

    def __init__(self) -> None:
        super().__init__("no such receipt (unknown, expired, or not yours)")


class ProofPending(NotFound):
    """No checkpoint covers the receipt's record yet (another worker's chain: retry shortly)."""

    code = "proof_pending"


class LogNotFound(NotFound):
    code = "log_not_found"


class CosignatureRefused(BadRequest):
    code = "cosignature_refused"


class BudgetExceeded(RateLimited):
    """A tenant's or key's token budget for the period is spent (`Retry-After`: until it
    renews)."""

    code = "budget_exceeded"


class MethodNotAllowed(GatewayError):
    """A method the listener does not serve; `allow` is sent as `Allow`."""

    status, type, code = 405, "invalid_request_error", "method_not_allowed"
    reason = "method"

    def __init__(self, message: str, allow: Iterable[str]) -> None:
        super().__init__(message)
        self.allow = ", ".join(sorted(allow))


class RequestTimeout(GatewayError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class BodyTooLarge(GatewayError):
    status, type, code = 413, "invalid_request_error", "body_too_large"


class UnsupportedEncoding(GatewayError):
    """A request body in a Content-Encoding other than identity, gzip or deflate."""

    status, type, code = 415, "invalid_request_error", "unsupported_content_encoding"


class NotSupported(GatewayError):
    status, type, code = 501, "server_error", "not_supported"


class VersionNotSupported(GatewayError):
    status, type, code = 505, "invalid_request_error", "http_version_not_supported"
    reason = "version"


class UpstreamUnavailable(GatewayError):
    status, type, code = 502, "server_error", "upstream_unavailable"


class AnswerTooLarge(GatewayError):
    """A plain upstream answer over `limits.max_answer_bytes` (it must be judged whole)."""

    status, type, code = 502, "server_error", "answer_too_large"


class AttestationRefused(GatewayError):
    """The answer was withheld: its attestation verdict is not clean (`audit: enforce`)."""

    status, type, code = 502, "server_error", "attestation_refused"


class AuditWriteFailed(GatewayError):
    """The answer's audit record could not be written, so the answer fails closed."""

    status, type, code = 502, "server_error", "audit_write_failed"


class ReceiptUnavailable(AuditWriteFailed):
    """A stream's receipt, whose id its head already carried, could not be stored: the stream
    ends with this instead of `[DONE]`, and its message names the id that does not exist."""

    code = "receipt_unavailable"


class HandleRefused(GatewayError):
    """Our backend refused the gateway's own handle: a key or audience misconfiguration."""

    status, type, code = 502, "server_error", "upstream_refused_handle"


class Overloaded(GatewayError):
    """The gateway holds as many requests as it may (`limits.max_in_flight`)."""

    status, type, code = 503, "server_error", "overloaded"


class BackendQuarantined(GatewayError):
    """Every backend of the model failed an isolation check; an operator or clean canary rounds
    release it."""

    status, type, code = 503, "server_error", "backend_quarantined"


class SharedStateUnavailable(GatewayError):
    """The Redis the gateway replicas share cannot be reached and the policy says
    `gateway.shared.on_failure: closed`."""

    status, type, code = 503, "server_error", "shared_state_unavailable"


class ControlUnavailable(GatewayError):
    """The control-plane database cannot be reached and this worker has nothing to decide a
    request's budget on (it never read that tenant's or key's spend)."""

    status, type, code = 503, "server_error", "control_unavailable"


class NotReady(GatewayError):
    """`/readyz` while a backend the policy marks required is down."""

    status, type, code = 503, "server_error", "not_ready"


class UpstreamTimeout(GatewayError):
    status, type, code = 504, "server_error", "upstream_timeout"


def error_body(error: GatewayError) -> bytes:
    """The JSON body for a local error answer (also the `data:` of an SSE error event), in
    OpenAI's shape: `message`, `type`, `param` (null when no one field is at fault), `code`."""
    shape = {"message": error.message, "type": error.type, "param": error.param, "code": error.code}
    return orjson.dumps({"error": shape})


def error_event(error: GatewayError) -> bytes:
    """The SSE `error` event that ends a stream that has begun (never followed by `[DONE]`)."""
    return b"\n\nevent: error\ndata: " + error_body(error) + b"\n\n"


def error_response(
    error: GatewayError,
    request_id: str | None = None,
    *,
    close: bool = False,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """The HTTP answer for `error`: its JSON body and status, `x-request-id` when there is one,
    `Retry-After` and `Allow` where the error sets them, and `headers`; with `close`, the
    connection is closed after it (`Connection: close`)."""
    # Every answer says its verdict: an answer of the gateway's own generated nothing.
    out = {VERDICT_HEADER: Verdict.UNATTESTED.value}
    if request_id is not None:
        out["x-request-id"] = request_id
    if error.retry_after_s is not None:
        out["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, MethodNotAllowed):
        out["allow"] = error.allow
    if close:
        out["connection"] = "close"
    if headers:
        out.update(headers)
    response = web.Response(
        body=error_body(error), status=error.status, content_type="application/json", headers=out
    )
    if close:
        response.force_close()  # nothing sent after it on this connection is read as a request
    return response
