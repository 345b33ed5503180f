"""Attestations: the backend's signed statement of which namespaces' blocks a response used.

Invariant: an `Attestation` exists only for a token whose signature verified under a trusted
backend key; `check_attestation` is the one place that turns it into a verdict, and it accepts a
public namespace's blocks only where the caller allows that namespace for the request.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvfence.keys.keyfile import TrustStore, check_key_id
from kvfence.token import Clock, TokenError, claim, open_token, sign_token
from kvfence.verdict import Verdict

ATTESTATION_PREFIX: Final = "kva1"
ATTESTATION_HEADER: Final = "x-kvfence-attestation"
ATTESTATION_EVENT: Final = "kvfence-attestation"
# The JSON field of that event's data (a valid first chunk) that holds the attestation.
ATTESTATION_FIELD: Final = "kvfence_attestation"


class AttestationError(TokenError):
    """The attestation is missing, malformed, signed by an unknown key, does not verify, or
    comes from another backend."""


@dataclass(frozen=True, slots=True)
class Attestation:
    backend_id: str
    key_id: str
    request_id: str
    namespace: str
    prompt_tokens: int
    cached_tokens: int
    block_namespaces: frozenset[str]
    issued_at: float
    digest: str  # sha256 hex of the token text
    # The namespace of each prompt block in order, run-length encoded: ((namespace, blocks), ...)
    block_runs: tuple[tuple[str, int], ...] = ()


class AttestationSigner:
    """Signs attestations with the backend's own key. Thread-safe."""

    def __init__(
        self,
        private_key: Ed25519PrivateKey,
        key_id: str,
        backend_id: str,
        clock: Clock = time.time,
    ) -> None:
        if not backend_id:
            raise ValueError("backend_id must be non-empty")
        self._key = private_key
        self.key_id = check_key_id(key_id)
        self.backend_id = backend_id
        self._clock = clock

    def sign(
        self,
        request_id: str,
        namespace: str,
        prompt_tokens: int,
        cached_tokens: int,
        block_namespaces: Iterable[str],
        block_runs: Sequence[tuple[str, int]] = (),
    ) -> str:
        """`block_runs`: the namespace of each block of the prompt, in order, as runs of
        (namespace, blocks): which blocks came from which namespace."""
        if not 0 <= cached_tokens <= prompt_tokens:
            raise ValueError("need 0 <= cached_tokens <= prompt_tokens")
        claims = {
            "v": 1,
            "typ": "attestation",
            "kid": self.key_id,
            "bid": self.backend_id,
            "rid": request_id,
            "ns": namespace,
            "pt": prompt_tokens,
            "ct": cached_tokens,
            "bns": sorted(set(block_namespaces)),
            "iat": round(self._clock(), 3),
        }
        if block_runs:
            claims["blk"] = [[name, blocks] for name, blocks in block_runs]
        return sign_token(ATTESTATION_PREFIX, claims, self._key)


class AttestationVerifier:
    """Verifies attestations against the backend keys a policy trusts; optionally pins the
    backend id the attestation must name."""

    def __init__(self, trust: TrustStore, backend_id: str | None = None) -> None:
        self._trust = trust
        self.backend_id = backend_id

    def verify(self, token: str | None) -> Attestation:
        if not token:
            raise AttestationError("missing", "no attestation")
        claims = open_token(ATTESTATION_PREFIX, token, self._trust, AttestationError)
        if claims.get("v") != 1 or claims.get("typ") != "attestation":
            raise AttestationError("malformed", "unsupported version or type")
        backend_id = claim(claims, "bid", str, AttestationError)
        if self.backend_id is not None and backend_id != self.backend_id:
            raise AttestationError("wrong_backend", "attestation from another backend")
        names = claim(claims, "bns", list, AttestationError)
        if not all(isinstance(name, str) for name in names):
            raise AttestationError("malformed", "block namespaces must be strings")
        runs = _runs(claims["blk"]) if "blk" in claims else ()
        return Attestation(
            backend_id=backend_id,
            key_id=claims["kid"],
            request_id=claim(claims, "rid", str, AttestationError),
            namespace=claim(claims, "ns", str, AttestationError),
            prompt_tokens=claim(claims, "pt", int, AttestationError),
            cached_tokens=claim(claims, "ct", int, AttestationError),
            block_namespaces=frozenset(names),
            issued_at=float(claim(claims, "iat", (int, float), AttestationError)),
            digest=hashlib.sha256(token.encode("ascii")).hexdigest(),
            block_runs=runs,
        )


def _runs(value: Any) -> tuple[tuple[str, int], ...]:
    ok = isinstance(value, list) and all(
        isinstance(run, list) and len(run) == 2 and isinstance(run[0], str)
        and isinstance(run[1], int) and not isinstance(run[1], bool) and run[1] > 0
        for run in value
    )  # fmt: skip
    if not ok:
        raise AttestationError("malformed", "claim 'blk' is a list of [namespace, blocks]")
    return tuple((name, blocks) for name, blocks in value)


def check_attestation(
    att: Attestation, request_id: str, namespace: str, public: frozenset[str] = frozenset()
) -> Verdict:
    """MISMATCH when the attestation is about another request or namespace, or its block runs
    do not name the namespaces it lists; VIOLATION when a block it used belongs to a namespace
    other than the request's and the public ones allowed to this request (`public`), or a public
    block follows one of the request's own (public blocks can only lead a prompt); else CLEAN."""
    if att.request_id != request_id or att.namespace != namespace:
        return Verdict.MISMATCH
    if any(name != namespace and name not in public for name in att.block_namespaces):
        return Verdict.VIOLATION
    used_public = att.block_namespaces & public
    if not used_public:
        return Verdict.CLEAN
    if {name for name, _ in att.block_runs} != att.block_namespaces:
        return Verdict.MISMATCH  # public blocks must be accounted for block by block
    owners = [name for name, _ in att.block_runs]
    if namespace in owners and any(n in public for n in owners[owners.index(namespace) :]):
        return Verdict.VIOLATION
    return Verdict.CLEAN
