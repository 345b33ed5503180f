"""The judge: the one place a verdict is decided, from the request's audit context and what the
backend returned; and the audit record that describes it. Pure: no I/O.

Invariant: under `audit: enforce` only a `clean` verdict lets a kvfence backend's answer through,
and no attestation (it lists namespace values) and no namespace ever enters a record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.policy.model import AuditMode, Backend
from kvfence.attestation import (
    Attestation,
    AttestationError,
    AttestationVerifier,
    check_attestation,
)
from kvfence.namespace import namespace_label
from kvfence.verdict import Verdict


@dataclass(frozen=True, slots=True)
class AuditContext:
    """What one response is judged against; built once per request by the proxy."""

    request_id: str
    tenant: str
    model: str
    backend: Backend
    upstream_id: str  # the request id bound into the handle (and echoed in the attestation)
    namespace: str
    verifier: AttestationVerifier | None  # None: the backend kind does not attest

    @property
    def attested(self) -> bool:
        return self.verifier is not None

    @property
    def enforced(self) -> bool:
        options = self.backend.kvfence
        return options is None or options.audit is AuditMode.ENFORCE


@dataclass(slots=True)
class Answer:
    """What the backend returned, as far as the audit needs it; the relays fill it in."""

    status: int = 0  # the backend's HTTP status; 0 when no answer arrived
    attestations: list[str | None] = field(default_factory=list)  # as found, in order
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    settled: bool = False  # set by `settle`, which runs once per request


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    blocked: bool = False
    attestation: Attestation | None = None


UNATTESTED = Judgement(Verdict.UNATTESTED)


def judge(ctx: AuditContext, answer: Answer) -> Judgement:
    """The verdict on `answer` and whether to withhold it. Error answers carry no generated
    text, so only a 200 from an attesting backend has anything to attest."""
    if ctx.verifier is None or answer.status != 200:
        return UNATTESTED
    token = answer.attestations[0] if answer.attestations else None
    try:
        att = ctx.verifier.verify(token)
    except AttestationError as exc:
        verdict = Verdict.MISSING if exc.code == "missing" else Verdict.INVALID
        return Judgement(verdict, ctx.enforced)
    verdict = check_attestation(att, ctx.upstream_id, ctx.namespace)
    return Judgement(verdict, verdict is not Verdict.CLEAN and ctx.enforced, att)


def record(
    ctx: AuditContext, answer: Answer, judgement: Judgement, status: int, reason: str | None
) -> dict[str, Any]:
    """One audit log record: `status` is what the client got, `reason` why it is not the
    backend's answer (a local error code), if it is not. Digests only, never a namespace."""
    att = judgement.attestation
    foreign = [] if att is None else [n for n in att.block_namespaces if n != ctx.namespace]
    return {
        "time": round(time.time(), 3),
        "request_id": ctx.request_id,
        "upstream_id": ctx.upstream_id,
        "tenant": ctx.tenant,
        "backend": ctx.backend.name,
        "model": ctx.model,
        "namespace": namespace_label(ctx.namespace),
        "verdict": judgement.verdict.value,
        "blocked": judgement.blocked,
        "status": status,
        "upstream_status": answer.status,
        "reason": reason,
        "prompt_tokens": answer.prompt_tokens,
        "cached_tokens": answer.cached_tokens,
        "attestation": att.digest if att is not None else None,
        "foreign_namespaces": sorted(namespace_label(n) for n in foreign),
    }
