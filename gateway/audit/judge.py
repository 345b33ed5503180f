"""The judge: the one place a verdict is decided, from the request's audit context and what the
backend returned; and the audit record that describes it. Pure: no I/O.

Invariant: under `audit: enforce` an answer from our backend passes only when exactly one valid
attestation says it used nothing but the request's namespace (and, for its leading blocks, the
public namespaces the policy allowed this request) and accounts for the cached tokens the answer
reports; an answer from any backend that carries a live canary marker, or an
external server's hit that the history proves foreign, is a violation. No attestation and no
namespace ever enters a record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from gateway.audit.usage import cached_tokens, estimate, prompt_tokens, total_tokens
from gateway.fleet.local_health import Health
from gateway.policy.backend_model import AuditMode, Backend
from gateway.verify.detective import Finding
from gateway.verify.evidence import canary_reason, evidence
from kvfence.attestation import (
    Attestation,
    AttestationError,
    AttestationVerifier,
    check_attestation,
)
from kvfence.namespace import namespace_label
from kvfence.verdict import Verdict

MAX_ERROR_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class AuditContext:
    """What one response is judged against; built once per attempt by its exchange."""

    request_id: str
    tenant: str
    model: str
    backend: Backend
    upstream_id: str  # the request id bound into the handle (and echoed in the attestation)
    namespace: str
    verifier: AttestationVerifier | None  # None: the backend kind does not attest
    health: Health | None = None  # external scoped backends: the shared canary state, then
    now: float = 0.0
    public: frozenset[str] = frozenset()  # public namespaces the policy allowed this request

    @property
    def attested(self) -> bool:
        return self.verifier is not None

    @property
    def enforced(self) -> bool:
        return self.backend.audit is AuditMode.ENFORCE


@dataclass(slots=True)
class Answer:
    """What the backend returned, as far as the audit needs it; its exchange fills it in."""

    status: int = 0  # the backend's HTTP status; 0 when no answer arrived
    attestations: list[str | None] = field(default_factory=list)  # header copies / first event
    late_attestations: int = 0  # attestations in stream events after the first
    plain_error: bool = True  # a non-2xx body holds an error object and nothing else
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    total_tokens: int | None = None  # prompt + completion, for a tokens-per-minute limit
    estimated_tokens: int = 0  # charged instead when the answer ended without its usage
    markers: int = 0  # live canary markers found in the answer's text
    finding: Finding | None = None  # the detective's: who explains the reported hit
    settled: bool = False  # set by `settle`, which runs once per request

    def read_usage(self, usage: Any) -> None:
        self.prompt_tokens = prompt_tokens(usage)
        self.cached_tokens = cached_tokens(usage)
        self.total_tokens = total_tokens(usage)

    def charge(
        self, att: Attestation | None, sent: bool, size: int, text: int, events: int
    ) -> None:
        """What an answer that ended without its usage is charged (`gateway.audit.usage`): its
        prompt (as the usage or the attestation `att` gave it, else from the `size` of the body
        forwarded) once it was `sent`, and what it generated (`text` bytes, or the `events` the
        client got, when more)."""
        if self.total_tokens is not None:
            return
        if not sent:
            self.estimated_tokens = events
            return
        prompt = self.prompt_tokens
        if prompt is None and att is not None:
            prompt = att.prompt_tokens
        self.estimated_tokens = estimate(prompt, size, text, events)


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    blocked: bool = False
    attestation: Attestation | None = None


UNATTESTED = Judgement(Verdict.UNATTESTED)


def judge(ctx: AuditContext, answer: Answer) -> Judgement:
    """The verdict on `answer` and whether to withhold it."""
    if answer.markers:
        return Judgement(Verdict.VIOLATION, ctx.enforced)
    if ctx.verifier is not None:
        return _attested(ctx, ctx.verifier, answer)
    if ctx.backend.verify is None or not 200 <= answer.status < 300:
        return UNATTESTED  # an unscoped backend, or an error answer: nothing generated to verify
    found = answer.finding.verdict if answer.finding is not None else None
    if found is Verdict.VIOLATION:  # another namespace's records explain the hit: withheld
        return Judgement(Verdict.VIOLATION, ctx.enforced)
    if found is Verdict.UNEXPLAINED:
        return Judgement(Verdict.UNEXPLAINED)
    verified = not canary_reason(ctx.backend, ctx.health, ctx.now)
    return Judgement(Verdict.VERIFIED if verified else Verdict.UNVERIFIED)


def _attested(ctx: AuditContext, verifier: AttestationVerifier, answer: Answer) -> Judgement:
    if not 200 <= answer.status < 300:
        # Nothing generated, nothing to attest: but only a plain error object may pass.
        return UNATTESTED if answer.plain_error else Judgement(Verdict.MISSING, ctx.enforced)
    if len(answer.attestations) > 1 or answer.late_attestations:
        return Judgement(Verdict.INVALID, ctx.enforced)  # duplicates are refused, never chosen
    try:
        att = verifier.verify(answer.attestations[0] if answer.attestations else None)
    except AttestationError as exc:
        verdict = Verdict.MISSING if exc.code == "missing" else Verdict.INVALID
        return Judgement(verdict, ctx.enforced)
    verdict = check_attestation(att, ctx.upstream_id, ctx.namespace, ctx.public)
    if verdict is Verdict.CLEAN and not _accounts(att, answer):
        verdict = Verdict.MISMATCH
    return Judgement(verdict, verdict is not Verdict.CLEAN and ctx.enforced, att)


def _accounts(att: Attestation, answer: Answer) -> bool:
    """The attestation covers what the answer reports: the blocks it lists hold the prompt, and
    the answer's prompt and cached tokens (where reported) are the attested ones."""
    if att.prompt_tokens > 0 and not att.block_namespaces:
        return False
    if answer.prompt_tokens is not None and answer.prompt_tokens != att.prompt_tokens:
        return False
    return answer.cached_tokens is None or answer.cached_tokens == att.cached_tokens


def is_plain_error(body: bytes) -> bool:
    """An error answer that carries nothing but an OpenAI-style error object of short texts."""
    if len(body) > MAX_ERROR_BYTES:
        return False
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(data, dict) or set(data) != {"error"} or not isinstance(data["error"], dict):
        return False
    return all(v is None or isinstance(v, str | int) for v in data["error"].values())


def verdict_fields(
    answer: Answer, judgement: Judgement, status: int, reason: str | None
) -> dict[str, Any]:
    """The verdict as an audit record and a receipt both state it, written only here: `status`
    is what the client got, `reason` why it is not the backend's answer (a local error code)."""
    return {
        "verdict": judgement.verdict.value,
        "blocked": judgement.blocked,
        "status": status,
        "upstream_status": answer.status,
        "reason": reason,
        "prompt_tokens": answer.prompt_tokens,
        "cached_tokens": answer.cached_tokens,
    }


def record(
    ctx: AuditContext,
    answer: Answer,
    judgement: Judgement,
    status: int,
    reason: str | None,
    phase: str = "final",
) -> dict[str, Any]:
    """One audit log record: `status` is what the client got, `reason` why it is not the
    backend's answer (a local error code), if it is not. `phase`: `open` for a stream's record
    written before its first byte (its `final` one follows), `final` for every request's last.
    Digests only, never a namespace."""
    att = judgement.attestation
    allowed = ctx.public | {ctx.namespace}
    foreign = [] if att is None else [n for n in att.block_namespaces if n not in allowed]
    public = 0 if att is None else sum(n for name, n in att.block_runs if name in ctx.public)
    return {
        "time": round(time.time(), 3),
        "phase": phase,
        "request_id": ctx.request_id,
        "upstream_id": ctx.upstream_id,
        "tenant": ctx.tenant,
        "backend": ctx.backend.name,
        "model": ctx.model,
        "namespace": namespace_label(ctx.namespace),
        **verdict_fields(answer, judgement, status, reason),
        "markers": answer.markers,
        "attestation": att.digest if att is not None else None,
        "foreign_namespaces": sorted(namespace_label(n) for n in foreign),
        "public_blocks": public,
        **_evidence(ctx, answer),
    }


def _evidence(ctx: AuditContext, answer: Answer) -> dict[str, Any]:
    """An external server's verdict's evidence (the canary round, the detective's finding)."""
    if ctx.backend.verify is None or ctx.verifier is not None:
        return {}
    return {"evidence": evidence(ctx.backend, ctx.health, answer.finding, ctx.now)}
