"""The verdict's evidence in a receipt, per kind of backend: our backend's attestation (its
digest and the prompt's blocks as runs of own, public and foreign blocks, public ones with their
prefix's name); an external server's verification (the canary state the judge used, the
detective's finding, live markers); nothing for a backend that cannot be scoped. Pure.

Invariant: evidence names no namespace and no other tenant: a foreign run is only counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.verify.evidence import evidence as verification_evidence

OWN, PUBLIC, FOREIGN = "own", "public", "foreign"


def attestation_evidence(
    ctx: AuditContext, judgement: Judgement, prefixes: Mapping[str, str]
) -> dict[str, Any]:
    """`prefixes`: public namespace -> the name of the prefix this request matched there."""
    att = judgement.attestation
    if att is None:
        return {"kind": "attestation", "attestation": None, "blocks": []}
    runs: list[dict[str, Any]] = []
    for namespace, blocks in att.block_runs:
        if namespace == ctx.namespace:
            run: dict[str, Any] = {"owner": OWN, "blocks": blocks}
        elif namespace in ctx.public:
            run = {"owner": PUBLIC, "blocks": blocks, "prefix": prefixes.get(namespace)}
        else:
            run = {"owner": FOREIGN, "blocks": blocks}
        runs.append(run)
    return {
        "kind": "attestation",
        "attestation": "sha256:" + att.digest,
        "prompt_tokens": att.prompt_tokens,
        "cached_tokens": att.cached_tokens,
        "blocks": runs,
    }


def external_evidence(ctx: AuditContext, answer: Answer) -> dict[str, Any]:
    """What the judge had for a server that is not ours: the verdict's evidence as the audit
    record carries it (docs/verify.md, "Evidence": the last canary round, why it does or does
    not vouch for the answer, the detective's finding) without the label of another namespace,
    and the live canary markers found."""
    found = verification_evidence(ctx.backend, ctx.health, answer.finding, ctx.now)
    detective = found["detective"]
    if detective is not None:
        found["detective"] = {k: v for k, v in detective.items() if k != "other_namespace"}
    return {"kind": "verification", **found, "markers": answer.markers}


def evidence(
    ctx: AuditContext, answer: Answer, judgement: Judgement, prefixes: Mapping[str, str]
) -> dict[str, Any]:
    if ctx.verifier is not None:
        return attestation_evidence(ctx, judgement, prefixes)
    if ctx.backend.verify is not None:
        return external_evidence(ctx, answer)
    return {"kind": "none"}  # an unscoped backend: nothing was verified
