"""The judge alone (pure): what each kind of backend answer is judged, when it is withheld, and
that its record carries labels, never a namespace or an attestation."""

from __future__ import annotations

import orjson
import pytest

from gateway.audit.judge import Answer, AuditContext, judge, record
from gateway.policy.model import AuditMode, Backend, KvfenceOptions, ModelSpec, SecretRef
from kvfence.attestation import AttestationSigner, AttestationVerifier
from kvfence.keyfile import TrustStore, generate_key
from kvfence.namespace import namespace_label
from kvfence.verdict import Verdict

KEY = generate_key()
TRUST = TrustStore({"be": KEY.public_key()})
SIGNER = AttestationSigner(KEY, "be", "backend-1")
NS, OTHER = "ns1.tenant-a", "ns1.tenant-b"


def context(mode: AuditMode = AuditMode.ENFORCE, kind: str = "kvfence") -> AuditContext:
    options = KvfenceOptions("backend-1", SecretRef("file", "t.json"), TRUST, mode)
    backend = Backend(
        "own",
        kind,
        "http://b",
        (ModelSpec("m", "1"),),
        kvfence=options if kind == "kvfence" else None,
    )
    verifier = AttestationVerifier(TRUST, "backend-1") if kind == "kvfence" else None
    return AuditContext("rid", "acme", "m", backend, "rid.up", NS, verifier)


def attested(*blocks: str, rid: str = "rid.up", ns: str = NS) -> Answer:
    token = SIGNER.sign(rid, ns, 40, 16 if blocks else 0, blocks)
    return Answer(status=200, attestations=[token], prompt_tokens=40, cached_tokens=16)


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        (attested(NS), Verdict.CLEAN),
        (attested(), Verdict.CLEAN),
        (attested(NS, OTHER), Verdict.VIOLATION),
        (attested(NS, rid="another"), Verdict.MISMATCH),
        (attested(NS, ns=OTHER), Verdict.MISMATCH),
        (Answer(status=200), Verdict.MISSING),
        (Answer(status=200, attestations=[None]), Verdict.MISSING),
        (Answer(status=200, attestations=["kva1.garbage.x"]), Verdict.INVALID),
    ],
)
def test_only_a_clean_attestation_passes_under_enforce(answer: Answer, verdict: Verdict) -> None:
    enforced = judge(context(), answer)
    assert enforced.verdict is verdict
    assert enforced.blocked is (verdict is not Verdict.CLEAN)
    monitored = judge(context(AuditMode.MONITOR), answer)
    assert monitored.verdict is verdict and not monitored.blocked


def test_another_backends_attestation_is_invalid() -> None:
    stranger = AttestationSigner(KEY, "be", "backend-2").sign("rid.up", NS, 40, 0, [NS])
    judgement = judge(context(), Answer(status=200, attestations=[stranger]))
    assert (judgement.verdict, judgement.blocked) == (Verdict.INVALID, True)


def test_external_kinds_and_error_answers_are_unattested() -> None:
    assert judge(context(kind="vllm"), Answer(status=200)).verdict is Verdict.UNATTESTED
    assert not judge(context(kind="vllm"), Answer(status=200)).blocked
    assert judge(context(), Answer(status=500)).verdict is Verdict.UNATTESTED


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
