"""Namespace derivation: HMAC-SHA256 over length-prefixed fields, formatted as a cache salt.

Invariant: the result depends only on the key and the (tenant, scope, scope value, model,
revision) tuple; the same inputs give the same string on every run, worker and host. Canary,
capacity-group and public namespaces have domain tags of their own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Final

DOMAIN_TAG: Final = b"kvfence/namespace/v1"
CANARY_TAG: Final = b"kvfence/canary/v1"  # a separate domain: no tenant input can reach it
GROUP_TAG: Final = b"kvfence/group/v1"
PUBLIC_TAG: Final = b"kvfence/public/v1"  # public namespaces: their own domain
KEY_ID_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
SALT_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MIN_SECRET_BYTES: Final = 32
SCOPES: Final = ("tenant", "user", "session", "request")


@dataclass(frozen=True, slots=True)
class NamespaceKey:
    """One HMAC key. `key_id` is public and travels in the salt; `secret` never leaves here."""

    key_id: str
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not KEY_ID_RE.fullmatch(self.key_id):
            raise ValueError("namespace key id must match [A-Za-z0-9_-]{1,32}")
        if len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"namespace key secret must be at least {MIN_SECRET_BYTES} bytes")


def _field(value: str) -> bytes:
    raw = value.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


def namespace_digest(
    key: NamespaceKey, tenant: str, scope: str, scope_value: str, model: str, revision: str
) -> bytes:
    """The raw 32-byte HMAC. Scope `tenant` must pass an empty scope value, every other scope a
    non-empty one (scope `request`: a fresh random value per request)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if (scope == "tenant") == bool(scope_value):
        raise ValueError("scope 'tenant' takes no scope value, every other scope one")
    fields = (DOMAIN_TAG.decode(), tenant, scope, scope_value, model, revision)
    message = b"".join(_field(f) for f in fields)
    return hmac.new(key.secret, message, hashlib.sha256).digest()


def format_salt(key_id: str, digest: bytes) -> str:
    """`<key id>.<base64url digest, no padding>`: only [A-Za-z0-9._-], at most 128 chars."""
    salt = key_id + "." + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
    if not SALT_RE.fullmatch(salt):
        raise ValueError("salt does not fit [A-Za-z0-9._-]{1,128}")
    return salt


def namespace_label(namespace: str) -> str:
    """The one non-reversible label of a namespace in logs, metrics and audit records (the
    namespace itself is never written anywhere): 32 hex characters of its SHA-256, so a
    backend metric and a gateway audit record of the same namespace carry the same label."""
    return hashlib.sha256(namespace.encode("utf-8")).hexdigest()[:32]


def derive_namespace(
    key: NamespaceKey, tenant: str, scope: str, scope_value: str, model: str, revision: str
) -> str:
    """The namespace value: the salt sent to cache_salt backends and carried by handles."""
    digest = namespace_digest(key, tenant, scope, scope_value, model, revision)
    return format_salt(key.key_id, digest)


def canary_namespace(key: NamespaceKey, backend: str, model: str, arm: str, round_id: str) -> str:
    """A reserved namespace for one arm of one canary round: derived under the gateway's key in
    the canary domain, so no tenant, user or session value can ever produce it."""
    fields = (CANARY_TAG.decode(), backend, model, arm, round_id)
    digest = hmac.new(key.secret, b"".join(_field(f) for f in fields), hashlib.sha256).digest()
    return format_salt(key.key_id, digest)


def public_namespace(key: NamespaceKey, model: str, revision: str, tenant: str = "") -> str:
    """A public namespace of one model and revision: without `tenant`, the one every tenant may
    read for the policy's declared prefixes; with it, the one for that tenant's own leading
    messages it marks public (readable by its users and sessions, never by another tenant).
    Derived in its own domain, so no tenant namespace can equal it."""
    fields = (PUBLIC_TAG.decode(), tenant, model, revision)
    digest = hmac.new(key.secret, b"".join(_field(f) for f in fields), hashlib.sha256).digest()
    return format_salt(key.key_id, digest)


def capacity_group(key: NamespaceKey, tenant: str) -> str:
    """A tenant's capacity group in a backend's KV pool: stable per tenant and key, and opaque
    (a backend learns which namespaces belong together, never whose they are)."""
    digest = hmac.new(key.secret, b"".join(_field(f) for f in (GROUP_TAG.decode(), tenant)),
                      hashlib.sha256).digest()  # fmt: skip
    return "g." + base64.urlsafe_b64encode(digest[:18]).decode("ascii")
