"""Verifying a receipt offline, the way `kvfence receipt verify` does: its signature under the
gateway's key set, the digests against the tenant's own copies of the request and the response,
and the answer's record in a checkpoint of the log signed by the log's key and cosigned by the
witnesses the tenant trusts (a c2sp.org/tlog-proof).

Invariant: `verify` runs every check it was given material for and reports each one; the receipt
counts as verified only when every one of them passed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from kvfence.checkpoint import Checkpoint, FormatError, InclusionProof
from kvfence.merkle import ProofError, leaf_hash, verify_inclusion
from kvfence.note import NoteError, Verifier, open_note, signed_by
from kvfence.receipt import (
    AUDIT_LOG,
    CACHE_SCOPE,
    RECEIVED,
    RETURNED,
    VERDICT,
    KeySet,
    ReceiptError,
    check_shape,
    check_signature,
    same,
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    message: str


@dataclass(slots=True)
class Report:
    receipt_id: str = "?"
    checks: list[Check] = field(default_factory=list)
    summary: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, message: str) -> bool:
        self.checks.append(Check(name, ok, message))
        return ok


def _digest_check(report: Report, name: str, data: bytes, claimed: Any, what: str) -> None:
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if isinstance(claimed, str) and same(actual, claimed):
        report.add(name, True, f"{len(data)} bytes match {what} ({actual[:23]}...)")
    else:
        report.add(
            name,
            False,
            f"its digest {actual} is not {what}'s {claimed}: edited, or another answer's",
        )


def _record_matches(record: bytes, doc: dict[str, Any], events: dict[str, Any]) -> str | None:
    """Why the log's record does not describe this receipt's answer, or None."""
    try:
        entry = orjson.loads(record)
    except orjson.JSONDecodeError:
        return "the log entry is not a JSON record"
    verdict, scope = events[VERDICT], events[CACHE_SCOPE]
    expected = {
        "receipt_id": doc.get("receipt_id"),
        "verdict": verdict.get("verdict"),
        "status": verdict.get("status"),
        "namespace": scope.get("namespace"),
    }
    wrong = [k for k, v in expected.items() if not isinstance(entry, dict) or entry.get(k) != v]
    return f"the log's record disagrees on {', '.join(wrong)}" if wrong else None


def _proof_check(
    report: Report,
    proof_text: str,
    doc: dict[str, Any],
    events: dict[str, Any],
    log_key: Verifier,
    witnesses: Sequence[Verifier],
) -> None:
    position = events[AUDIT_LOG]
    try:
        proof = InclusionProof.parse(proof_text)
        text, _ = open_note(proof.note, [log_key])
        checkpoint = Checkpoint.parse(text)
        leaf = bytes.fromhex(str(position.get("leaf_hash")))
    except (FormatError, NoteError, ValueError) as exc:
        report.add("log", False, f"the proof's checkpoint is not usable: {exc}")
        return
    if checkpoint.origin != position.get("log") or proof.index != position.get("index"):
        report.add(
            "log",
            False,
            f"the proof is for entry {proof.index} of {checkpoint.origin}, the receipt's record "
            f"is entry {position.get('index')} of {position.get('log')}",
        )
        return
    try:
        verify_inclusion(leaf, proof.index, checkpoint.size, proof.path, checkpoint.root)
    except ProofError as exc:
        report.add("log", False, f"{exc}: the log or the proof was altered")
        return
    report.add(
        "log",
        True,
        f"record {proof.index} is in the checkpoint of {checkpoint.size} entries of "
        f"{checkpoint.origin}, signed by {log_key.name}",
    )
    if proof.extra is not None:
        problem = None if leaf_hash(proof.extra) == leaf else "the record is not the logged one"
        problem = problem or _record_matches(proof.extra, doc, events)
        report.add("record", problem is None, problem or "the log's record agrees with the receipt")
    _witness_checks(report, proof.note, witnesses)


def _witness_checks(report: Report, note: str, witnesses: Sequence[Verifier]) -> None:
    for witness in witnesses:
        try:
            _, signatures = open_note(note, [witness])
        except NoteError as exc:
            report.add("witness", False, f"{witness.name}: {exc} (not yet witnessed: fetch the "
                       "proof again after the witness's next run)")  # fmt: skip
            continue
        found = signed_by(signatures, witness)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(found.timestamp() if found else 0))
        report.add("witness", True, f"checkpoint cosigned by {witness.name} at {when}")


def verify(
    receipt: bytes,
    keyset: KeySet,
    *,
    request: bytes | None = None,
    response: bytes | None = None,
    proof: str | None = None,
    witnesses: Sequence[Verifier] = (),
    log_key: Verifier | None = None,
) -> Report:
    """Check `receipt` (its JSON bytes) with what the tenant has: its request and response
    bytes, the inclusion proof and the witnesses it trusts."""
    report = Report()
    try:
        doc = orjson.loads(receipt)
        events = check_shape(doc)
        report.receipt_id = str(doc.get("receipt_id"))
        key = check_signature(doc, keyset)
    except (orjson.JSONDecodeError, ReceiptError) as exc:
        report.add("signature", False, str(exc))
        return report
    if not same(str(doc.get("workload_id")), keyset.workload_id):
        report.add("signature", False, "the receipt names another gateway (workload_id)")
        return report
    rotated = "" if doc.get("workload_keyset_digest") == keyset.digest else ", an earlier key set"
    report.add("signature", True, f"ed25519 key {key.key_id} of the gateway's key set{rotated}")
    if request is not None:
        _digest_check(report, "request", request, events[RECEIVED].get("body_hash"), RECEIVED)
    if response is not None:
        _digest_check(report, "response", response, events[RETURNED].get("wire_hash"), RETURNED)
    if proof is not None:
        _proof_check(report, proof, doc, events, log_key or keyset.log, witnesses)
    elif witnesses:
        report.add("witness", False, "--witness needs --proof (the receipt's tlog-proof)")
    scope, verdict = events[CACHE_SCOPE], events[VERDICT]
    report.summary = (
        f"namespace {scope.get('namespace')} ({scope.get('scope')} scope, "
        f"{scope.get('partition')}), backend {scope.get('backend', {}).get('name')}, "
        f"verdict {verdict.get('verdict')}, status {verdict.get('status')}"
    )
    return report
