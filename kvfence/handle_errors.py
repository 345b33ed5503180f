"""Why a handle is refused: the verifier's exception tree, each class with the HTTP status the
backend answers with and the codes it carries (`.code`, for logs and error bodies).

HandleError (401) ├── HandleForbidden (403) └── HandleUnavailable (503)
"""

from __future__ import annotations

from kvfence.token import TokenError


class HandleError(TokenError):
    """401: missing, malformed, unknown_key, bad_signature, expired, not_yet_valid,
    bad_lifetime, replayed."""


class HandleForbidden(HandleError):
    """403: a genuine handle used for something it does not allow: wrong_audience,
    wrong_scope, wrong_model, wrong_action, body_mismatch, public_mismatch."""

    status = 403


class HandleUnavailable(HandleError):
    """503: replay_store_full (too many live handles to remember; fail closed)."""

    status = 503
