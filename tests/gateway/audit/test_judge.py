"""The judge alone (pure): what each kind of backend answer is judged, when it is withheld, and
that its record carries labels, never a namespace or an attestation."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from gateway.audit.judge import Answer, AuditContext, is_plain_error, judge, record
from gateway.fleet.local_health import Health
from gateway.policy.backend_model import (
    AuditMode,
    Backend,
    KvfenceOptions,
    ModelSpec,
    VerifySettings,
)
from gateway.policy.secrets import SecretRef
from gateway.verify.detective import ATTRIBUTED, NOBODY, Finding
from kvfence.attestation import AttestationSigner, AttestationVerifier
from kvfence.keys.keyfile import TrustStore, generate_key
from kvfence.namespace import namespace_label
from kvfence.verdict import Verdict

KEY = generate_key()
TRUST = TrustStore({"be": KEY.public_key()})
SIGNER = AttestationSigner(KEY, "be", "backend-1")
NS, OTHER = "ns1.tenant-a", "ns1.tenant-b"
NOW = 1_800_000_000.0


def context(
    mode: AuditMode = AuditMode.ENFORCE, kind: str = "kvfence", health: Health | None = None
) -> AuditContext:
    options = KvfenceOptions("backend-1", SecretRef("file", "t.json"), TRUST)
    ours = kind == "kvfence"
    backend = Backend(
        "b", kind, "http://b", (ModelSpec("m", "1"),),
        kvfence=options if ours else None,
        audit=mode,
        verify=VerifySettings() if kind == "vllm" else None,
    )  # fmt: skip
    verifier = AttestationVerifier(TRUST, "backend-1") if ours else None
    return AuditContext("rid", "acme", "m", backend, "rid.up", NS, verifier, health, NOW)


def attested(*blocks: str, rid: str = "rid.up", ns: str = NS, cached: int = 16) -> Answer:
    token = SIGNER.sign(rid, ns, 40, cached, blocks)
    return Answer(status=200, attestations=[token], prompt_tokens=40, cached_tokens=cached)


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        (attested(NS), Verdict.CLEAN),
        (attested(NS, OTHER), Verdict.VIOLATION),
        (attested(NS, rid="another"), Verdict.MISMATCH),
        (attested(NS, ns=OTHER), Verdict.MISMATCH),
        (Answer(status=200), Verdict.MISSING),
        (Answer(status=200, attestations=[None]), Verdict.MISSING),
        (Answer(status=200, attestations=["kva1.garbage.x"]), Verdict.INVALID),
        # An empty block list cannot hold a 40-token prompt, whatever cached_tokens says.
        (attested(cached=0), Verdict.MISMATCH),
        # The answer must report exactly what was attested.
        (dataclasses.replace(attested(NS), cached_tokens=32), Verdict.MISMATCH),
        (dataclasses.replace(attested(NS), prompt_tokens=41), Verdict.MISMATCH),
        # Two attestations (duplicate headers), or one in a later stream event: refused.
        (Answer(status=200, attestations=attested(NS).attestations * 2), Verdict.INVALID),
        (dataclasses.replace(attested(NS), late_attestations=1), Verdict.INVALID),
        # Any 2xx must be attested; an error passes only as a plain error object.
        (Answer(status=201), Verdict.MISSING),
        (Answer(status=500, plain_error=False), Verdict.MISSING),
        (Answer(status=500), Verdict.UNATTESTED),
        # A live canary marker in the text is a leak whatever the attestation says.
        (dataclasses.replace(attested(NS), markers=1), Verdict.VIOLATION),
    ],
)
def test_only_a_clean_accounted_attestation_passes(answer: Answer, verdict: Verdict) -> None:
    enforced = judge(context(), answer)
    assert enforced.verdict is verdict
    assert enforced.blocked is (verdict not in (Verdict.CLEAN, Verdict.UNATTESTED))
    monitored = judge(context(AuditMode.MONITOR), answer)
    assert monitored.verdict is verdict and not monitored.blocked


def test_another_backends_attestation_is_invalid() -> None:
    stranger = AttestationSigner(KEY, "be", "backend-2").sign("rid.up", NS, 40, 0, [NS])
    judgement = judge(context(), Answer(status=200, attestations=[stranger]))
    assert (judgement.verdict, judgement.blocked) == (Verdict.INVALID, True)


@pytest.mark.parametrize(
    ("health", "answer", "verdict", "blocked"),
    [
        (None, Answer(status=200), Verdict.UNVERIFIED, False),
        (Health("isolated", NOW - 10), Answer(status=200), Verdict.VERIFIED, False),
        (Health("isolated", NOW - 3600), Answer(status=200), Verdict.UNVERIFIED, False),
        (Health("inconclusive", NOW - 10), Answer(status=200), Verdict.UNVERIFIED, False),
        (
            Health("isolated", NOW),
            Answer(200, finding=Finding(Verdict.UNEXPLAINED, NOBODY)),
            Verdict.UNEXPLAINED,
            False,
        ),
        (
            Health("isolated", NOW),
            Answer(200, finding=Finding(Verdict.VIOLATION, ATTRIBUTED)),
            Verdict.VIOLATION,
            True,
        ),
        (Health("isolated", NOW), Answer(200, markers=1), Verdict.VIOLATION, True),
    ],
)
def test_external_verdicts_say_what_was_verified(
    health: Health | None, answer: Answer, verdict: Verdict, blocked: bool
) -> None:
    judgement = judge(context(kind="vllm", health=health), answer)
    assert (judgement.verdict, judgement.blocked) == (verdict, blocked)


def test_unscoped_backends_are_unattested_but_markers_still_count() -> None:
    assert judge(context(kind="tgi"), Answer(status=200)).verdict is Verdict.UNATTESTED
    assert judge(context(kind="tgi"), Answer(status=200, markers=2)).verdict is Verdict.VIOLATION


def test_plain_errors() -> None:
    assert is_plain_error(b'{"error": {"message": "bad", "type": "x", "code": null}}')
    assert not is_plain_error(b'{"error": {"message": "bad"}, "choices": []}')
    assert not is_plain_error(b'{"error": {"message": {"text": "nested"}}}')
    assert not is_plain_error(b"The capital of France is Paris.")
    assert not is_plain_error(b'{"error": {"message": "' + b"x" * 5000 + b'"}}')


def test_the_record_carries_labels_never_namespaces_or_tokens() -> None:
    answer = attested(NS, OTHER)
    judgement = judge(context(), answer)
    entry = record(context(), answer, judgement, 502, "attestation_refused")
    text = orjson.dumps(entry).decode()
    assert NS not in text and OTHER not in text and str(answer.attestations[0]) not in text
    assert entry["namespace"] == namespace_label(NS)
    assert entry["foreign_namespaces"] == [namespace_label(OTHER)]
    assert (entry["verdict"], entry["blocked"], entry["status"]) == ("violation", True, 502)
    assert (entry["upstream_status"], entry["reason"], entry["cached_tokens"]) == (
        200,
        "attestation_refused",
        16,
    )
