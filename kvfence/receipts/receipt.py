"""The receipt: a signed event log for one answer, in the shape of the ACI `aci/1` inference
receipt (Ed25519 over the RFC 8785 form of the receipt without `signature.value`), with event
types of our own for what no other receipt records: the cache scope, the verdict and its
evidence, and the answer's record in the witnessed audit log. And the gateway's published key
set, which names the receipt keys (by key id, across rotations) and the log's key.

Invariant: `check_signature` returns only for a receipt whose signature verifies under a key the
key set lists; the receipt never holds a prompt, a key or a namespace (only its label).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kvfence.receipts.jcs import CanonicalError, canonical
from kvfence.receipts.note import NoteError, Verifier

API_VERSION: Final = "aci/1"
KEYSET_VERSION: Final = 1
RECEIVED: Final = "request.received"
FORWARDED: Final = "request.forwarded"
MODIFIED: Final = "transparency.request_modified"
RETURNED: Final = "response.returned"
CACHE_SCOPE: Final = "kvfence.cache_scope"
VERDICT: Final = "kvfence.verdict"
AUDIT_LOG: Final = "kvfence.audit_log"
REQUIRED: Final = (RECEIVED, FORWARDED, RETURNED, CACHE_SCOPE, VERDICT, AUDIT_LOG)
RECEIPT_HEADER: Final = "x-kvfence-receipt-id"
_TOP: Final = frozenset(
    {"api_version", "receipt_id", "chat_id", "model", "workload_id", "workload_keyset_digest"}
    | {"endpoint", "method", "served_at", "event_log", "signature"}
)


class ReceiptError(ValueError):
    """A receipt or key set that is malformed or does not verify: one line saying why."""


def sha256_tag(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def workload_id(log_key: Ed25519PublicKey) -> str:
    """The gateway's stable identity, as ACI names one: the digest of its identity key (the
    key that signs the log's checkpoints), which receipt key rotation never changes."""
    return sha256_tag(canonical({"algo": "ed25519", "public_key": _raw(log_key).hex()}))


@dataclass(frozen=True, slots=True)
class ReceiptKey:
    key_id: str
    key: Ed25519PublicKey
    active: bool = True

    def entry(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "algo": "ed25519", "public_key": _raw(self.key).hex()}


@dataclass(frozen=True, slots=True)
class KeySet:
    """What a tenant needs to verify receipts offline: the receipt keys (the active one first;
    retired ones still verify the receipts they signed) and the log's verifier key."""

    log: Verifier
    receipt_keys: tuple[ReceiptKey, ...]
    witnesses: tuple[Verifier, ...] = ()
    _cache: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def workload_id(self) -> str:
        found = self._cache.get("workload_id")
        if found is None:
            found = self._cache["workload_id"] = workload_id(self.log.key)
        return found

    def document(self) -> dict[str, Any]:
        return {
            "kvfence_keyset": KEYSET_VERSION,
            "workload_id": self.workload_id,
            "log_key": self.log.vkey,
            "receipt_signing_keys": [
                {**k.entry(), "status": "active" if k.active else "retired"}
                for k in self.receipt_keys
            ],
            "witnesses": [w.vkey for w in self.witnesses],
        }

    @property
    def digest(self) -> str:
        """Over the keys alone (not their status), so retiring a key keeps the digest."""
        found = self._cache.get("digest")
        if found is None:
            keys = sorted((k.entry() for k in self.receipt_keys), key=lambda e: e["key_id"])
            doc = {"workload_id": self.workload_id, "log_key": self.log.vkey, "keys": keys}
            found = self._cache["digest"] = sha256_tag(canonical(doc))
        return found

    def key(self, key_id: str) -> ReceiptKey | None:
        return next((k for k in self.receipt_keys if k.key_id == key_id), None)

    @classmethod
    def parse(cls, doc: Any) -> KeySet:
        if not isinstance(doc, dict) or doc.get("kvfence_keyset") != KEYSET_VERSION:
            raise ReceiptError("not a kvfence key set (GET /v1/kvfence/keys)")
        try:
            log = Verifier.parse(str(doc["log_key"]))
            keys = tuple(_receipt_key(e) for e in doc["receipt_signing_keys"])
            witnesses = tuple(Verifier.parse(str(w)) for w in doc.get("witnesses", []))
        except (KeyError, TypeError, ValueError, NoteError) as exc:
            raise ReceiptError(f"malformed key set: {exc}") from None
        keyset = cls(log, keys, witnesses)
        if doc.get("workload_id") != keyset.workload_id:
            raise ReceiptError("the key set's workload_id is not the digest of its log key")
        return keyset


def _receipt_key(entry: Any) -> ReceiptKey:
    if not isinstance(entry, dict) or entry.get("algo") != "ed25519":
        raise ReceiptError("a receipt key must be an ed25519 entry")
    raw = bytes.fromhex(str(entry["public_key"]))
    if len(raw) != 32:
        raise ReceiptError(f"receipt key {entry.get('key_id')} is not 32 bytes")
    public = Ed25519PublicKey.from_public_bytes(raw)
    return ReceiptKey(str(entry["key_id"]), public, entry.get("status", "active") == "active")


def log_entry(receipt_id: str, verdict: str, status: int, namespace: str, keyset: KeySet) -> bytes:
    """The receipt's entry in its tenant's receipt log (the leaf its proof includes): what the
    verifier compares with the receipt, and the whole key set it was signed under, so the log
    (signed by the log key, cosigned by witnesses) binds the receipt keys to that root."""
    doc = {
        "receipt_id": receipt_id,
        "verdict": verdict,
        "status": status,
        "namespace": namespace,
        "keyset": keyset.document(),
    }
    return canonical(doc)


def fingerprint(log_key: Verifier) -> str:
    """The key set's fingerprint an operator publishes: the digest of the log key (the
    gateway's `workload_id`), which receipt key rotation never changes."""
    return workload_id(log_key.key)


def signing_input(doc: Mapping[str, Any]) -> bytes:
    """JCS of the receipt with only `signature.value` removed (ACI section 8.5)."""
    signature = doc.get("signature")
    if not isinstance(signature, dict):
        raise ReceiptError("the receipt has no signature object")
    unsigned = dict(doc)
    unsigned["signature"] = {k: v for k, v in signature.items() if k != "value"}
    try:
        return canonical(unsigned)
    except CanonicalError as exc:
        raise ReceiptError(str(exc)) from None


def sign(doc: dict[str, Any], key_id: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """`doc` (every member but `signature`) signed: the signature member added."""
    doc["signature"] = {"algo": "ed25519", "key_id": key_id}
    doc["signature"]["value"] = key.sign(signing_input(doc)).hex()
    return doc


def events(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The receipt's events by type (the first of each), after checking the event log's shape:
    `seq` counts from 0, the first event is request.received, the required events are there."""
    log = doc.get("event_log")
    if not isinstance(log, list) or not log:
        raise ReceiptError("the receipt has no event log")
    found: dict[str, dict[str, Any]] = {}
    for seq, event in enumerate(log):
        if not isinstance(event, dict) or event.get("seq") != seq or "type" not in event:
            raise ReceiptError(f"event {seq} of the event log is malformed or out of order")
        found.setdefault(str(event["type"]), event)
    if log[0].get("type") != RECEIVED:
        raise ReceiptError(f"the first event is not {RECEIVED}")
    missing = [t for t in REQUIRED if t not in found]
    if missing:
        raise ReceiptError(f"the receipt lacks the events {', '.join(missing)}")
    return found


def check_shape(doc: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("api_version") != API_VERSION:
        raise ReceiptError(f"not an {API_VERSION} receipt")
    extra = sorted(set(doc) - _TOP)
    if extra:
        raise ReceiptError(f"the receipt has unknown top-level members {', '.join(extra)}")
    return events(doc)


def check_signature(doc: Mapping[str, Any], keyset: KeySet) -> ReceiptKey:
    """The key that signed `doc`; ReceiptError when none in `keyset` did."""
    signature = doc.get("signature")
    if not isinstance(signature, dict) or signature.get("algo") != "ed25519":
        raise ReceiptError("the receipt's signature is not an ed25519 signature")
    key = keyset.key(str(signature.get("key_id")))
    if key is None:
        raise ReceiptError(f"key {signature.get('key_id')!r} is not in the gateway's key set")
    try:
        value = bytes.fromhex(str(signature.get("value")))
        key.key.verify(value, signing_input(doc))
    except (ValueError, InvalidSignature):
        raise ReceiptError(
            f"signature by key {key.key_id} does not verify: the receipt was edited"
        ) from None
    return key


def same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def numbered(events_: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with their `seq` (ACI numbers them from 0)."""
    return [{"seq": seq, **event} for seq, event in enumerate(events_)]
