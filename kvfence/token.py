"""The signed-token core that handles and attestations share: `prefix.b64url(payload).b64url(sig)`
with an Ed25519 signature over `prefix.b64url(payload)` (docs/protocol.md has the format).

Invariant: `open_token` returns claims only for a token whose signature verified under a key of
the given trust store, parsed from exactly the bytes that were signed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvfence.keys.keyfile import TrustStore, b64url, b64url_decode

MAX_TOKEN_CHARS: Final = 8192

Clock = Callable[[], float]


class TokenError(Exception):
    """Base of every handle and attestation failure. `.code` is a short machine code for logs
    and error bodies; which answer it becomes is the receiving side's to decide."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


def sign_token(prefix: str, claims: dict[str, Any], key: Ed25519PrivateKey) -> str:
    """`prefix.b64url(payload).b64url(signature)`; the signature covers `prefix.b64url(payload)`
    (so the version and, inside the payload, the key id)."""
    payload = orjson.dumps(claims, option=orjson.OPT_SORT_KEYS)
    signed = f"{prefix}.{b64url(payload)}"
    return f"{signed}.{b64url(key.sign(signed.encode('ascii')))}"


def open_token(
    prefix: str, token: str | None, trust: TrustStore, error: type[TokenError]
) -> dict[str, Any]:
    """Check format, key id and signature; return the signed claims (not yet validated)."""
    if not token:
        raise error("missing", "no token")
    if len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise error("malformed", "token too long or not ASCII")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != prefix:
        raise error("malformed", f"expected {prefix}.<payload>.<signature>")
    try:
        payload = b64url_decode(parts[1])
        signature = b64url_decode(parts[2])
        claims = orjson.loads(payload)
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise error("malformed", "bad base64url or JSON") from exc
    if not isinstance(claims, dict) or not isinstance(claims.get("kid"), str):
        raise error("malformed", "payload is not an object with a key id")
    key = trust.get(claims["kid"])
    if key is None:
        raise error("unknown_key", "key id not trusted")
    try:
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except InvalidSignature as exc:
        raise error("bad_signature", "signature does not verify") from exc
    return claims


def claim(
    claims: dict[str, Any], name: str, types: type | tuple[type, ...], error: type[TokenError]
) -> Any:
    value = claims.get(name)
    # bool is an int subclass; no claim is ever a bool.
    if not isinstance(value, types) or isinstance(value, bool):
        raise error("malformed", f"claim {name!r} missing or of the wrong type")
    return value
