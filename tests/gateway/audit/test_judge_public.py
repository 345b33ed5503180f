"""The judge on answers that used public blocks: accepted only from the public namespaces the
policy allowed the request, only leading, and only when the attestation accounts for them block
by block."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.audit.judge import Answer, judge, record
from kvfence.namespace import namespace_label
from kvfence.verdict import Verdict
from tests.gateway.audit.test_judge import NS, OTHER, SIGNER, context

PUB, ELSE = "ns1.public-model", "ns1.public-other"


def attested(runs: list[tuple[str, int]], used: list[str] | None = None) -> Answer:
    names = used if used is not None else [name for name, _ in runs]
    token = SIGNER.sign("rid.up", NS, 40, 16, names, runs)
    return Answer(status=200, attestations=[token], prompt_tokens=40, cached_tokens=16)


@pytest.mark.parametrize(
    ("runs", "used", "allowed", "verdict"),
    [
        ([(PUB, 2), (NS, 1)], None, {PUB}, Verdict.CLEAN),
        ([(PUB, 3)], None, {PUB}, Verdict.CLEAN),
        # A public namespace the policy did not allow this request is foreign.
        ([(PUB, 2), (NS, 1)], None, set(), Verdict.VIOLATION),
        ([(ELSE, 2), (NS, 1)], None, {PUB}, Verdict.VIOLATION),
        ([(OTHER, 2), (NS, 1)], None, {PUB}, Verdict.VIOLATION),
        # Public blocks only lead the prompt: never after one of the request's own.
        ([(NS, 1), (PUB, 2)], None, {PUB}, Verdict.VIOLATION),
        ([(PUB, 1), (NS, 1), (PUB, 1)], None, {PUB}, Verdict.VIOLATION),
        # Public blocks must be accounted for block by block.
        ([], [PUB, NS], {PUB}, Verdict.MISMATCH),
        ([(NS, 3)], [PUB, NS], {PUB}, Verdict.MISMATCH),
    ],
)
def test_public_blocks_pass_only_where_allowed_and_leading(
    runs: list[tuple[str, int]], used: list[str] | None, allowed: set[str], verdict: Verdict
) -> None:
    ctx = dataclasses.replace(context(), public=frozenset(allowed))
    judgement = judge(ctx, attested(runs, used))
    assert judgement.verdict is verdict
    assert judgement.blocked is (verdict is not Verdict.CLEAN)


def test_the_record_counts_public_blocks_and_names_only_foreign_labels() -> None:
    ctx = dataclasses.replace(context(), public=frozenset({PUB}))
    answer = attested([(PUB, 2), (NS, 1)])
    rec = record(ctx, answer, judge(ctx, answer), 200, None)
    assert (rec["verdict"], rec["public_blocks"], rec["foreign_namespaces"]) == ("clean", 2, [])
    denied = dataclasses.replace(context(), public=frozenset())
    rec = record(denied, answer, judge(denied, answer), 502, "attestation_refused")
    assert rec["verdict"] == "violation" and rec["public_blocks"] == 0
    assert rec["foreign_namespaces"] == [namespace_label(PUB)]
    assert PUB not in str(rec)
