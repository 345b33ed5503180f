"""Signed handles: the Ed25519 tokens that carry a namespace from the gateway to the backend
(docs/protocol.md has the format; the token core is `kvfence.token`).

Invariant: `HandleVerifier` is the only production code that mints a `Namespace`, and only after
the signature, key id, lifetime, audience, scope, body and replay checks have all passed. A
request handle names the SHA-256 of the exact body it was signed for (`bd`): `check` runs before
a byte of the body is read, `admit` compares the body in constant time and only then spends the
request id, so a captured handle can neither carry another body nor be burned by one. Public
parts (`pub`) are minted as namespaces of their own, each only for the leading content it names.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvfence import handle_claims
from kvfence.capability import Namespace, _mint
from kvfence.handle_claims import body_digest
from kvfence.handle_errors import HandleError, HandleForbidden, HandleUnavailable
from kvfence.keys.keyfile import TrustStore, check_key_id
from kvfence.public import PublicGrant, PublicPart
from kvfence.replay import ReplayGuard
from kvfence.share import Share
from kvfence.token import Clock, claim, open_token, sign_token

HANDLE_HEADER: Final = "x-kvfence-handle"
HANDLE_PREFIX: Final = "kvh1"


@dataclass(frozen=True, slots=True)
class SignedHandle:
    """A request handle whose signature, claims, lifetime, audience and scope are checked; not
    yet bound to a body nor admitted (`HandleVerifier.admit`). Carries no capability."""

    namespace: str
    request_id: str
    model: str
    revision: str
    issued_at: float
    expires_at: float
    key_id: str
    body_digest: str
    seal: object = field(repr=False, compare=False)  # the verifier that checked it
    share: Share | None = None
    public: tuple[PublicPart, ...] = ()
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class VerifiedHandle:
    namespace: Namespace
    request_id: str
    model: str
    revision: str
    issued_at: float
    expires_at: float
    key_id: str
    public: tuple[PublicGrant, ...] = ()  # public parts the backend may place and read

    def check_model(self, model: str) -> None:
        """The request body must ask for the model the handle names (checked once parsed)."""
        if model != self.model:
            raise HandleForbidden("wrong_model", "handle is for another model")


@dataclass(frozen=True, slots=True)
class VerifiedAdmin:
    action: str
    namespace: Namespace
    request_id: str
    issued_at: float
    expires_at: float
    key_id: str


def _grant(part: PublicPart) -> PublicGrant:
    share = part.share
    namespace = _mint(part.namespace, share.group, share.ceiling, share.floor)
    return PublicGrant(namespace, part.messages, part.chars, part.digest)


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
        *,
        body: bytes,
        share: Share | None = None,
        public: Sequence[PublicPart] = (),
        ephemeral: bool = False,
    ) -> str:
        """A request handle for exactly `body`, the bytes the gateway sends upstream; with
        `share`, the tenant's capacity group in the backend's pool; with `public`, the leading
        parts of the prompt the backend may cache in public namespaces; `ephemeral` for a
        request-scoped namespace (never cached, zeroed when freed)."""
        if not namespace or not model:
            raise ValueError("namespace and model must be non-empty")
        claims = self._claims("handle", request_id, audience, ttl)
        claims.update(ns=namespace, model=model, rev=revision)
        handle_claims.write(claims, body, share, public, ephemeral)
        return sign_token(HANDLE_PREFIX, claims, self._key)

    def sign_admin(
        self, action: str, namespace: str, request_id: str, audience: str, ttl: float = 60.0
    ) -> str:
        if not action or not namespace:
            raise ValueError("action and namespace must be non-empty")
        claims = self._claims("admin", request_id, audience, ttl)
        claims.update(act=action, ns=namespace)
        return sign_token(HANDLE_PREFIX, claims, self._key)


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
        self._replay = ReplayGuard(replay_capacity)
        self._seal = object()  # marks the SignedHandles this verifier checked

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

    def _spend(self, key: tuple[str, str], expires_at: float) -> None:
        refused = self._replay.admit(key, expires_at + self._skew, self._clock())
        if refused == "replayed":
            raise HandleError("replayed", "request id already used")
        if refused is not None:
            raise HandleUnavailable("replay_store_full", "too many live handles")

    def check(self, token: str | None) -> SignedHandle:
        """A request handle, checked before anything else of the request is read. A handle
        without a body digest is malformed."""
        claims, iat, exp = self._open(token, "handle")
        model = claim(claims, "model", str, HandleError)
        revision = claim(claims, "rev", str, HandleError)
        digest = handle_claims.read_body_digest(claims)
        share = handle_claims.read_share(claims)
        public, ephemeral = handle_claims.read_public(claims)
        ns, rid, kid = claims["ns"], claims["rid"], claims["kid"]
        return SignedHandle(
            ns, rid, model, revision, iat, exp, kid, digest, self._seal, share, public, ephemeral
        )

    def admit(self, handle: SignedHandle, body: bytes) -> VerifiedHandle:
        """Bind `handle` to `body`, the raw request body (before it is parsed), then spend its
        request id; the model the body asks for is compared afterwards (`check_model`)."""
        if handle.seal is not self._seal:
            raise HandleError("malformed", "not checked by this verifier")
        if not hmac.compare_digest(body_digest(body), handle.body_digest):
            raise HandleForbidden("body_mismatch", "the body is not the one the handle is for")
        key = (handle.key_id, handle.request_id)
        self._spend(key, handle.expires_at)
        share = handle.share
        namespace = (
            _mint(handle.namespace, share.group, share.ceiling, share.floor,
                  ephemeral=handle.ephemeral)
            if share is not None
            else _mint(handle.namespace, ephemeral=handle.ephemeral)
        )  # fmt: skip
        return VerifiedHandle(
            namespace, handle.request_id, handle.model, handle.revision,
            handle.issued_at, handle.expires_at, handle.key_id,
            tuple(_grant(part) for part in handle.public),
        )  # fmt: skip

    def verify(self, token: str | None, body: bytes) -> VerifiedHandle:
        """`check` then `admit`: a request handle for the request body `body`."""
        return self.admit(self.check(token), body)

    def verify_admin(self, token: str | None, action: str) -> VerifiedAdmin:
        claims, iat, exp = self._open(token, "admin")
        if claim(claims, "act", str, HandleError) != action:
            raise HandleForbidden("wrong_action", f"handle does not allow {action!r}")
        self._spend((claims["kid"], claims["rid"]), exp)
        return VerifiedAdmin(action, _mint(claims["ns"]), claims["rid"], iat, exp, claims["kid"])
