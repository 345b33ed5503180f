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

from kvfence.receipts.checkpoint import Checkpoint, FormatError, InclusionProof
from kvfence.receipts.merkle import ProofError, leaf_hash, verify_inclusion
from kvfence.receipts.note import NoteError, Verifier, open_note, signed_by
from kvfence.receipts.receipt import (
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


@dataclass(frozen=True, slots=True)
class Root:
    """What the tenant got out of band, from the gateway's operator or a witness: the log's key,
    the key set's fingerprint (`kvfence keys fingerprint`), witnesses' keys. Verification starts
    here; a key set is believed only once a checkpoint under this root includes it."""

    log_key: Verifier | None = None
    fingerprint: str | None = None
    witnesses: tuple[Verifier, ...] = ()

    @property
    def given(self) -> bool:
        return self.log_key is not None or bool(self.fingerprint) or bool(self.witnesses)


def _entry_keyset(extra: bytes | None) -> KeySet | None:
    """The key set the log's entry names (None: no entry, or not one of ours)."""
    try:
        entry = orjson.loads(extra) if extra is not None else None
        return KeySet.parse(entry["keyset"]) if isinstance(entry, dict) else None
    except (orjson.JSONDecodeError, KeyError, ReceiptError):
        return None


def _proof_check(
    report: Report,
    proof: InclusionProof,
    doc: dict[str, Any],
    events: dict[str, Any],
    keyset: KeySet,
    root: Root,
) -> None:
    position = events[AUDIT_LOG]
    log_key = root.log_key or keyset.log
    try:
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
    if proof.extra is None:
        report.add("record", False, "the proof carries no record (its extra line)")
        return
    problem = None if leaf_hash(proof.extra) == leaf else "the record is not the logged one"
    problem = problem or _record_matches(proof.extra, doc, events)
    report.add("record", problem is None, problem or "the log's record agrees with the receipt")
    _witness_checks(report, proof.note, root.witnesses)


def _keys_check(report: Report, keyset: KeySet, logged: KeySet | None, root: Root) -> None:
    """The key set that verified the signature is the one the log's entry names, under the
    pinned root."""
    if logged is None or logged.digest != keyset.digest:
        report.add("keys", False, "the key set that signed the receipt is not the one its log "
                   "entry names: a substituted key set")  # fmt: skip
        return
    if root.fingerprint and not same(root.fingerprint, keyset.workload_id):
        report.add("keys", False, f"the key set's fingerprint {keyset.workload_id} is not the "
                   f"pinned {root.fingerprint}")  # fmt: skip
        return
    if root.log_key is not None and root.log_key.vkey != keyset.log.vkey:
        report.add("keys", False, "the key set names another log key than the pinned one")
        return
    pinned = (
        f"log key {root.log_key.name}" if root.log_key is not None
        else f"fingerprint {root.fingerprint[:23]}..." if root.fingerprint
        else "the witnesses' cosignatures"
    )  # fmt: skip
    report.add("keys", True, f"key set {keyset.digest[:23]}... is in the log under {pinned}")


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
    keyset: KeySet | None,
    *,
    request: bytes | None = None,
    response: bytes | None = None,
    proof: str | None = None,
    root: Root | None = None,
) -> Report:
    """Check `receipt` (its JSON bytes) with what the tenant has: its request and response
    bytes, the inclusion proof, and the trust root it got out of band. The key set is the one
    the proof's log entry names (`keyset`, the served one, only without a proof)."""
    root = root or Root()
    report = _verify(receipt, keyset, request, response, proof, root)
    if not root.given:
        report.add("root", False, "no trust root given: pin the gateway's log key (--log-key), "
                   "its fingerprint (--fingerprint) or a witness (--witness)")  # fmt: skip
    return report


def _verify(
    receipt: bytes,
    keyset: KeySet | None,
    request: bytes | None,
    response: bytes | None,
    proof: str | None,
    root: Root,
) -> Report:
    report = Report()
    parsed: InclusionProof | None = None
    try:
        doc = orjson.loads(receipt)
        events = check_shape(doc)
        report.receipt_id = str(doc.get("receipt_id"))
        parsed = InclusionProof.parse(proof) if proof is not None else None
        logged = _entry_keyset(parsed.extra) if parsed is not None else None
        signer = logged or keyset
        if signer is None:
            raise ReceiptError("no key set: give the receipt's --proof (its entry names the "
                               "key set) or --keys")  # fmt: skip
        key = check_signature(doc, signer)
    except (orjson.JSONDecodeError, ReceiptError, FormatError) as exc:
        report.add("signature", False, str(exc))
        return report
    if not same(str(doc.get("workload_id")), signer.workload_id):
        report.add("signature", False, "the receipt names another gateway (workload_id)")
        return report
    if doc.get("workload_keyset_digest") != signer.digest:
        report.add("signature", False, "the receipt names another key set than the one given")
        return report
    report.add("signature", True, f"ed25519 key {key.key_id} of key set {signer.digest[:23]}...")
    if request is not None:
        _digest_check(report, "request", request, events[RECEIVED].get("body_hash"), RECEIVED)
    if response is not None:
        _digest_check(report, "response", response, events[RETURNED].get("wire_hash"), RETURNED)
    if parsed is not None:
        _proof_check(report, parsed, doc, events, signer, root)
        _keys_check(report, signer, logged, root)
    else:
        report.add("keys", False, "without --proof the key set is not bound to any root: the "
                   "receipt's signature alone proves nothing")  # fmt: skip
    scope, verdict = events[CACHE_SCOPE], events[VERDICT]
    report.summary = (
        f"namespace {scope.get('namespace')} ({scope.get('scope')} scope, "
        f"{scope.get('partition')}), backend {scope.get('backend', {}).get('name')}, "
        f"verdict {verdict.get('verdict')}, status {verdict.get('status')}"
    )
    return report
