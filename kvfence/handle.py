"""Signed handles: the Ed25519 tokens that carry a namespace from the gateway to the backend,
plus the signed-token core that attestations share (docs/protocol.md has the format).

Invariant: `HandleVerifier` is the only production code that mints a `Namespace`, and only after
the signature, key id, lifetime, audience, scope, model and replay checks have all passed.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvfence.capability import Namespace, _mint
from kvfence.keyfile import TrustStore, b64url, b64url_decode, check_key_id

HANDLE_HEADER: Final = "x-kvfence-handle"
ATTESTATION_HEADER: Final = "x-kvfence-attestation"
ATTESTATION_EVENT: Final = "kvfence-attestation"
# The JSON field of that event's data (a valid first chunk) that holds the attestation.
ATTESTATION_FIELD: Final = "kvfence_attestation"
HANDLE_PREFIX: Final = "kvh1"
MAX_TOKEN_CHARS: Final = 8192

Clock = Callable[[], float]


class TokenError(Exception):
    """Base of every handle and attestation failure. `.code` is a short machine code for logs
    and error bodies; `.status` the HTTP status the server answers with."""

    status: int = 401

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code


class HandleError(TokenError):
    """401: missing, malformed, unknown_key, bad_signature, expired, not_yet_valid,
    bad_lifetime, replayed."""


class HandleForbidden(HandleError):
    """403: a genuine handle used for something it does not allow: wrong_audience,
    wrong_scope, wrong_model, wrong_action."""

    status = 403


class HandleUnavailable(HandleError):
    """503: replay_store_full (too many live handles to remember; fail closed)."""

    status = 503


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
    claims: dict[str, Any], name: str, kind: type | tuple[type, ...], error: type[TokenError]
) -> Any:
    value = claims.get(name)
    # bool is an int subclass; no claim is ever a bool.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise error("malformed", f"claim {name!r} missing or of the wrong type")
    return value


@dataclass(frozen=True, slots=True)
class VerifiedHandle:
    namespace: Namespace
    request_id: str
    model: str
    revision: str
    issued_at: float
    expires_at: float
    key_id: str


@dataclass(frozen=True, slots=True)
class VerifiedAdmin:
    action: str
    namespace: Namespace
    request_id: str
    issued_at: float
    expires_at: float
    key_id: str


class HandleSigner:
    """Mints handles (the gateway's side). Holds the private key; thread-safe."""

    def __init__(self, private_key: Ed25519PrivateKey, key_id: str, clock: Clock = time.time):
        self._key = private_key
        self.key_id = check_key_id(key_id)
        self._clock = clock

    def _claims(self, typ: str, request_id: str, audience: str, ttl: float) -> dict[str, Any]:
        if not request_id or not audience or not ttl > 0:
            raise ValueError("request_id and audience must be non-empty and ttl positive")
        now = round(self._clock(), 3)
        return {"v": 1, "typ": typ, "kid": self.key_id, "rid": request_id, "aud": audience,
                "iat": now, "exp": round(now + ttl, 3)}  # fmt: skip

    def sign(
        self,
        namespace: str,
        model: str,
        revision: str,
        request_id: str,
        audience: str,
        ttl: float = 60.0,
    ) -> str:
        if not namespace or not model:
            raise ValueError("namespace and model must be non-empty")
        claims = self._claims("handle", request_id, audience, ttl)
        claims.update(ns=namespace, model=model, rev=revision)
        return sign_token(HANDLE_PREFIX, claims, self._key)

    def sign_admin(
        self, action: str, namespace: str, request_id: str, audience: str, ttl: float = 60.0
    ) -> str:
        if not action or not namespace:
            raise ValueError("action and namespace must be non-empty")
        claims = self._claims("admin", request_id, audience, ttl)
        claims.update(act=action, ns=namespace)
        return sign_token(HANDLE_PREFIX, claims, self._key)


class _ReplayGuard:
    """Request ids seen within their expiry. Memory is one dict entry and one heap entry per
    live handle; expired entries are pruned on every insert."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._seen: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, key: tuple[str, str], until: float, now: float) -> None:
        with self._lock:
            while self._heap and self._heap[0][0] < now:
                _, old = heapq.heappop(self._heap)
                self._seen.pop(old, None)
            if key in self._seen:
                raise HandleError("replayed", "request id already used")
            if len(self._seen) >= self._capacity:
                raise HandleUnavailable("replay_store_full", "too many live handles")
            self._seen[key] = until
            heapq.heappush(self._heap, (until, key))


class HandleVerifier:
    """Verifies handles for one backend (the audience). The trust store's keys are parsed once."""

    def __init__(
        self,
        trust: TrustStore,
        audience: str,
        clock_skew: float = 5.0,
        max_ttl: float = 300.0,
        replay_capacity: int = 1_000_000,
        clock: Clock = time.time,
    ) -> None:
        self._trust = trust
        self.audience = audience
        self._skew = clock_skew
        self._max_ttl = max_ttl
        self._clock = clock
        self._replay = _ReplayGuard(replay_capacity)

    @property
    def live_request_ids(self) -> int:
        return len(self._replay)

    def _open(self, token: str | None, typ: str) -> tuple[dict[str, Any], float, float]:
        claims = open_token(HANDLE_PREFIX, token, self._trust, HandleError)
        if claims.get("v") != 1:
            raise HandleError("malformed", "unsupported version")
        iat = float(claim(claims, "iat", (int, float), HandleError))
        exp = float(claim(claims, "exp", (int, float), HandleError))
        for name in ("typ", "rid", "aud", "ns"):
            if not claim(claims, name, str, HandleError):
                raise HandleError("malformed", f"claim {name!r} is empty")
        now = self._clock()
        if iat > now + self._skew:
            raise HandleError("not_yet_valid", "issued in the future")
        if exp <= now - self._skew:
            raise HandleError("expired", "handle expired")
        if exp < iat or exp - iat > self._max_ttl:
            raise HandleError("bad_lifetime", "lifetime negative or too long")
        if claims["aud"] != self.audience:
            raise HandleForbidden("wrong_audience", "handle is for another backend")
        if claims["typ"] != typ:
            raise HandleForbidden("wrong_scope", f"not a {typ} handle")
        return claims, iat, exp

    def verify(self, token: str | None, model: str) -> VerifiedHandle:
        claims, iat, exp = self._open(token, "handle")
        if claim(claims, "model", str, HandleError) != model:
            raise HandleForbidden("wrong_model", "handle is for another model")
        revision = claim(claims, "rev", str, HandleError)
        self._replay.admit((claims["kid"], claims["rid"]), exp + self._skew, self._clock())
        return VerifiedHandle(
            _mint(claims["ns"]), claims["rid"], model, revision, iat, exp, claims["kid"]
        )

    def verify_admin(self, token: str | None, action: str) -> VerifiedAdmin:
        claims, iat, exp = self._open(token, "admin")
        if claim(claims, "act", str, HandleError) != action:
            raise HandleForbidden("wrong_action", f"handle does not allow {action!r}")
        self._replay.admit((claims["kid"], claims["rid"]), exp + self._skew, self._clock())
        return VerifiedAdmin(action, _mint(claims["ns"]), claims["rid"], iat, exp, claims["kid"])
