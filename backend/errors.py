"""Everything the backend can answer with an error, as one tree; `error_body` is the one place an
error becomes OpenAI-style JSON, and `backend.server`'s middleware the one place it becomes HTTP.

BackendError (500)
├── BadRequest (400)            ├── ContextLengthExceeded (400)   ├── BadChat (400)
├── HandleRefused (401/403/503, from the handle verifier's code)
├── ModelNotFound (404)         ├── EngineDown (503)              └── GenerationFailed (503)

Not answered, so not here: the block pool's AllocationError (scheduling flow control) and
IntegrityError (a bug), ModelLoadError (start-up), the model's template errors (turned into
BadChat where a prompt is built). Invariant: a message never carries a prompt or a handle.
"""

from __future__ import annotations

import orjson

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


class HandleRefused(BackendError):
    """A missing or invalid handle; status and code are the verifier's (401, 403 or 503)."""

    def __init__(self, exc: TokenError) -> None:
        super().__init__(str(exc) if exc.code != "missing" else "a signed handle is required")
        self.status = exc.status
        self.code = "missing_handle" if exc.code == "missing" else exc.code
        self.type = {401: "authentication_error", 403: "permission_error"}.get(
            exc.status, "server_error"
        )


def error_body(error: BackendError) -> bytes:
    """The JSON body of an error answer (also the `data:` of an SSE error event)."""
    body = {"message": error.message, "type": error.type, "code": error.code, "param": error.param}
    return orjson.dumps({"error": body})
