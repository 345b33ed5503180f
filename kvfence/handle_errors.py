"""Why a handle is refused: the verifier's exception tree and the codes each class carries
(`.code`, for logs and error bodies). The backend maps each class to its answer
(`backend.errors`).

HandleError ├── HandleForbidden └── HandleUnavailable
"""

from __future__ import annotations

from kvfence.token import TokenError


class HandleError(TokenError):
    """Not a handle this verifier accepts: missing, malformed, unknown_key, bad_signature,
    expired, not_yet_valid, bad_lifetime, replayed."""


class HandleForbidden(HandleError):
    """A genuine handle used for something it does not allow: wrong_audience, wrong_scope,
    wrong_model, wrong_action, body_mismatch, public_mismatch."""


class HandleUnavailable(HandleError):
    """The verifier cannot decide now: replay_store_full (too many live handles to remember;
    fail closed)."""
