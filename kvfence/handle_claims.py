"""A request handle's claims beyond the token core: the body digest (`bd`), the capacity share
(`grp`, `sh`), the public parts (`pub`) and request scope (`eph`), written and read only here.

Invariant: `read_*` gives back what `write` put in, and refuses (HandleError `malformed`) what
`write` could not have written; a request-scoped handle never carries public parts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Final

from kvfence.handle_errors import HandleError
from kvfence.keys.keyfile import b64url
from kvfence.public import PublicPart, parse_parts
from kvfence.share import Share
from kvfence.token import claim

_DIGEST_RE: Final = re.compile(r"^[A-Za-z0-9_-]{43}$")  # base64url of 32 bytes, unpadded


def body_digest(body: bytes) -> str:
    """The `bd` claim: base64url (unpadded) of SHA-256 of the exact request body bytes."""
    return b64url(hashlib.sha256(body).digest())


def write(
    claims: dict[str, Any],
    body: bytes,
    share: Share | None,
    public: Sequence[PublicPart],
    ephemeral: bool,
) -> None:
    """Add the body digest, and the share, public parts and request scope when given."""
    if ephemeral and public:
        raise ValueError("a request-scoped namespace reads nothing public")
    claims["bd"] = body_digest(body)
    if share is not None:
        claims.update(grp=share.group, sh=[share.ceiling, share.floor])
    if public:
        claims["pub"] = [part.claim() for part in public]
    if ephemeral:
        claims["eph"] = True


def read_body_digest(claims: dict[str, Any]) -> str:
    digest: str = claim(claims, "bd", str, HandleError)
    if not _DIGEST_RE.fullmatch(digest):
        raise HandleError("malformed", "claim 'bd' is not a SHA-256 digest")
    return digest


def read_share(claims: dict[str, Any]) -> Share | None:
    """The capacity share (`grp`, `sh`), or None when the handle carries neither."""
    if "grp" not in claims and "sh" not in claims:
        return None
    group = claim(claims, "grp", str, HandleError)
    share = claim(claims, "sh", list, HandleError)
    if len(share) != 2 or not all(isinstance(x, int | float) and not isinstance(x, bool)
                                  for x in share):  # fmt: skip
        raise HandleError("malformed", "claim 'sh' is not [ceiling, floor]")
    try:
        return Share(group, float(share[0]), float(share[1]))
    except ValueError as exc:
        raise HandleError("malformed", f"claims 'grp'/'sh': {exc}") from None


def read_public(claims: dict[str, Any]) -> tuple[tuple[PublicPart, ...], bool]:
    """The public parts (`pub`) and whether the namespace is a request's own (`eph`, only
    `true`); a request-scoped namespace reads nothing public."""
    ephemeral = "eph" in claims
    if ephemeral and claims["eph"] is not True:
        raise HandleError("malformed", "claim 'eph' is true when present")
    if "pub" not in claims:
        return (), ephemeral
    if ephemeral:
        raise HandleError("malformed", "a request-scoped handle has no public parts")
    try:
        return parse_parts(claims["pub"], claims["ns"]), False
    except ValueError as exc:
        raise HandleError("malformed", f"claim 'pub': {exc}") from None
