"""Tenant API keys: minting, checksum, and the peppered digest a policy stores.

Invariant: a key is never stored; only `key_digest(pepper, key)` is, and a key whose checksum
fails is rejected before any lookup.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import Final

PREFIX: Final = "kvf_"
_BODY_LEN: Final = 52  # 32 random bytes, base32 without padding
_CHECK_LEN: Final = 6
KEY_LEN: Final = len(PREFIX) + _BODY_LEN + _CHECK_LEN
DIGEST_PREFIX: Final = "hmac-sha256:"
MIN_PEPPER_BYTES: Final = 16
_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"  # RFC 4648 base32, lower case
# A tenant id, in the policy and on the command line: no spaces, nothing a log could misread.
TENANT_ID_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_SHAPE: Final = re.compile(f"{PREFIX}[a-z2-7]{{{_BODY_LEN + _CHECK_LEN}}}")


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def _checksum(body: str) -> str:
    """The first 6 base32 characters of sha256(prefix + body): its leading 30 bits."""
    digest = hashlib.sha256((PREFIX + body).encode("ascii")).digest()
    n = int.from_bytes(digest[:4], "big") >> 2
    a = _ALPHABET
    return (
        a[n >> 25]
        + a[n >> 20 & 31]
        + a[n >> 15 & 31]
        + a[n >> 10 & 31]
        + a[n >> 5 & 31]
        + a[n & 31]
    )


def mint_key() -> str:
    """A fresh key: `kvf_` + 52 base32 characters (256 bits) + a 6-character checksum."""
    body = _b32(secrets.token_bytes(32))
    return PREFIX + body + _checksum(body)


def is_well_formed(key: str) -> bool:
    """Prefix, length, alphabet and checksum; cheap, so a typo never reaches the lookup."""
    if _SHAPE.fullmatch(key) is None:
        return False
    body, check = key[len(PREFIX) : -_CHECK_LEN], key[-_CHECK_LEN:]
    return hmac.compare_digest(_checksum(body), check)


def key_digest(pepper: bytes, key: str) -> str:
    """`hmac-sha256:<hex>` of the key under the pepper; what the policy's `api_keys` hold."""
    if len(pepper) < MIN_PEPPER_BYTES:
        raise ValueError(f"the API key pepper must be at least {MIN_PEPPER_BYTES} bytes")
    return DIGEST_PREFIX + hmac.digest(pepper, key.encode("utf-8"), "sha256").hex()


def is_digest(text: str) -> bool:
    hex_part = text[len(DIGEST_PREFIX) :]
    return (
        text.startswith(DIGEST_PREFIX)
        and len(hex_part) == 64
        and all(c in "0123456789abcdef" for c in hex_part)
    )
