"""Everything the backend can answer with an error, as one tree; `error_body` is the one place an
error becomes OpenAI-style JSON, and `backend.server`'s middleware the one place it becomes HTTP.

BackendError (500)
├── BadRequest (400)            ├── ContextLengthExceeded (400)   ├── BadChat (400)
├── HandleRefused (401/403/503, by the kind of the handle verifier's refusal: `handle_status`)
├── ModelNotFound (404)         ├── EngineDown (503)              └── GenerationFailed (503)

Not answered, so not here: the block pool's AllocationError (scheduling flow control) and
IntegrityError (a bug), ModelLoadError (start-up), the model's template errors (turned into
BadChat where a prompt is built). Invariant: a message never carries a prompt or a handle.
"""

from __future__ import annotations

import orjson

from kvfence.handle_errors import HandleForbidden, HandleUnavailable
from kvfence.token import TokenError


class BackendError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field to blame, when there is one


class BadRequest(BackendError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class ContextLengthExceeded(BadRequest):
    code = "context_length_exceeded"


class BadChat(BadRequest):
    code = "bad_chat"


class ModelNotFound(BackendError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class EngineDown(BackendError):
    status, type, code = 503, "server_error", "engine_down"


class GenerationFailed(BackendError):
    status, type, code = 503, "server_error", "engine_error"


def handle_status(exc: TokenError) -> int:
    """The answer to a refused handle: 403 for a genuine handle used for something it does not
    allow, 503 when the verifier cannot decide now (fail closed), else 401."""
    if isinstance(exc, HandleUnavailable):
        return 503
    if isinstance(exc, HandleForbidden):
        return 403
    return 401


class HandleRefused(BackendError):
    """A missing or invalid handle; the code is the verifier's, the status `handle_status`."""

    def __init__(self, exc: TokenError) -> None:
        super().__init__(str(exc) if exc.code != "missing" else "a signed handle is required")
        self.status = handle_status(exc)
        self.code = "missing_handle" if exc.code == "missing" else exc.code
        self.type = {401: "authentication_error", 403: "permission_error"}.get(
            self.status, "server_error"
        )


def error_body(error: BackendError) -> bytes:
    """The JSON body of an error answer (also the `data:` of an SSE error event)."""
    body = {"message": error.message, "type": error.type, "code": error.code, "param": error.param}
    return orjson.dumps({"error": body})
