"""The preventive audit: a verdict for every proxied response, from the backend's attestation,
known before the first byte reaches the client.

Invariant: under `audit: enforce` only a `clean` verdict lets a kvfence backend's answer through,
and no attestation (it lists namespace values) is ever passed on to a client.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import orjson

from gateway.errors import GatewayError
from gateway.policy import AuditMode, Backend
from kvfence.attestation import Attestation, AttestationError, AttestationVerifier
from kvfence.attestation import check_attestation as _check
from kvfence.handle import ATTESTATION_EVENT, ATTESTATION_FIELD

VERDICT_HEADER: Final = "x-kvfence-verdict"
_EVENT_LINE: Final = b"event: " + ATTESTATION_EVENT.encode()


class Verdict(StrEnum):
    CLEAN = "clean"  # attested: only the request's own namespace was used
    VIOLATION = "violation"  # attested: a block of another namespace was used
    MISMATCH = "mismatch"  # attested, but for another request id or namespace
    MISSING = "missing"  # a kvfence backend sent no attestation
    INVALID = "invalid"  # malformed, unknown key, bad signature or another backend's
    UNATTESTED = "unattested"  # a backend kind that does not attest (or an error answer)


class AttestationRefused(GatewayError):
    status, type, code = 502, "server_error", "attestation_refused"


class AuditWriteFailed(GatewayError):
    status, type, code = 502, "server_error", "audit_write_failed"


class HandleRefused(GatewayError):
    status, type, code = 502, "server_error", "upstream_refused_handle"


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    attestation: Attestation | None = None
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class AuditContext:
    """What one response is judged against: this request's upstream id and namespace."""

    backend: Backend
    upstream_id: str  # the request id bound into the handle (and echoed in the attestation)
    namespace: str
    verifier: AttestationVerifier | None  # None: the backend kind does not attest

    @property
    def attested(self) -> bool:
        return self.verifier is not None

    def judge(self, token: str | None) -> Outcome:
        """The verdict for `token` (None when the backend sent none) and whether to block."""
        if self.verifier is None:
            return Outcome(Verdict.UNATTESTED)
        try:
            att = self.verifier.verify(token)
        except AttestationError as exc:
            verdict = Verdict.MISSING if exc.code == "missing" else Verdict.INVALID
            return Outcome(verdict, None, self._enforced())
        verdict = Verdict(_check(att, self.upstream_id, self.namespace).value)
        return Outcome(verdict, att, verdict is not Verdict.CLEAN and self._enforced())

    def _enforced(self) -> bool:
        options = self.backend.kvfence
        return options is None or options.audit is AuditMode.ENFORCE


def namespace_label(namespace: str) -> str:
    """A non-reversible label for a namespace in records (the namespace itself is never logged)."""
    return hashlib.sha256(namespace.encode()).hexdigest()[:32]


def split_attestation_event(event: bytes) -> tuple[str | None, bytes]:
    """From the stream's first event: the attestation token (None when the event is not the
    attestation event) and the bytes to send the client instead: the same chunk without the
    attestation field and without the event name."""
    lines = event.splitlines()
    named = any(line.rstrip() == _EVENT_LINE for line in lines)
    data_lines = [ln[5:].lstrip(b" ") for ln in lines if ln.startswith(b"data:")]
    try:
        data = orjson.loads(b"\n".join(data_lines)) if data_lines else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or ATTESTATION_FIELD not in data:
        return None, event + b"\n\n"
    token = data.pop(ATTESTATION_FIELD)
    clean = b"data: " + orjson.dumps(data) + b"\n\n"
    return (token if named and isinstance(token, str) else None), clean


def audit_record(
    *,
    request_id: str,
    tenant: str,
    ctx: AuditContext,
    model: str,
    outcome: Outcome,
    status: int,
    usage: tuple[int | None, int | None],
) -> dict[str, Any]:
    """One audit log record; holds digests only, never a namespace, key or prompt."""
    att = outcome.attestation
    foreign = [] if att is None else [n for n in att.block_namespaces if n != ctx.namespace]
    return {
        "time": round(time.time(), 3),
        "request_id": request_id,
        "upstream_id": ctx.upstream_id,
        "tenant": tenant,
        "backend": ctx.backend.name,
        "model": model,
        "namespace": namespace_label(ctx.namespace),
        "verdict": outcome.verdict.value,
        "blocked": outcome.blocked,
        "status": status,
        "prompt_tokens": usage[0],
        "cached_tokens": usage[1],
        "attestation": att.digest() if att is not None else None,
        "foreign_namespaces": sorted(namespace_label(n) for n in foreign),
    }
