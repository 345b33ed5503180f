"""The receipt's signature and key set: ACI's signing input (the receipt without
`signature.value`), any encoding of the same document verifies, a retired key still verifies
what it signed, an unknown key or another gateway does not."""

from __future__ import annotations

import orjson
import pytest

from kvfence.keys.keyfile import generate_key
from kvfence.receipts.check import verify
from kvfence.receipts.note import ED25519, Signer
from kvfence.receipts.receipt import (
    KeySet,
    ReceiptError,
    ReceiptKey,
    check_signature,
    numbered,
    sign,
    signing_input,
)

LOG = Signer("example.com/log", ED25519, generate_key())
OLD, NEW = generate_key(), generate_key()
KEYSET = KeySet(
    LOG.verifier, (ReceiptKey("r2", NEW.public_key()), ReceiptKey("r1", OLD.public_key(), False))
)


def receipt(key_id: str = "r2") -> dict[str, object]:
    events = [
        {"type": t}
        for t in (
            "request.received",
            "request.forwarded",
            "kvfence.cache_scope",
            "kvfence.verdict",
            "response.returned",
            "kvfence.audit_log",
        )
    ]
    doc = {
        "api_version": "aci/1",
        "receipt_id": "rcpt_1_x",
        "chat_id": None,
        "model": "m",
        "workload_id": KEYSET.workload_id,
        "workload_keyset_digest": KEYSET.digest,
        "endpoint": "/v1/chat/completions",
        "method": "POST",
        "served_at": 1750000000,
        "event_log": numbered(events),
    }
    return sign(doc, key_id, NEW if key_id == "r2" else OLD)


def test_signature_covers_the_canonical_receipt_without_its_value() -> None:
    doc = receipt()
    signature = doc["signature"]
    assert isinstance(signature, dict) and set(signature) == {"algo", "key_id", "value"}
    assert b'"signature":{"algo":"ed25519","key_id":"r2"}' in signing_input(doc)
    pretty = orjson.loads(orjson.dumps(doc, option=orjson.OPT_INDENT_2))  # another encoding
    assert check_signature(pretty, KEYSET).key_id == "r2"


def test_a_retired_key_still_verifies_and_the_key_set_round_trips() -> None:
    parsed = KeySet.parse(orjson.loads(orjson.dumps(KEYSET.document())))
    assert parsed.digest == KEYSET.digest and parsed.workload_id == KEYSET.workload_id
    assert check_signature(receipt("r1"), parsed).key_id == "r1"
    retired = KeySet(
        LOG.verifier, (ReceiptKey("r2", NEW.public_key(), False), *parsed.receipt_keys[1:])
    )
    assert retired.digest == KEYSET.digest  # the status is not part of the digest


def test_unknown_key_or_other_gateway_fails() -> None:
    stranger = KeySet(LOG.verifier, (ReceiptKey("r2", generate_key().public_key()),))
    with pytest.raises(ReceiptError, match="does not verify"):
        check_signature(receipt(), stranger)
    with pytest.raises(ReceiptError, match="not in the gateway's key set"):
        check_signature(receipt(), KeySet(LOG.verifier, ()))
    other_log = Signer("example.com/log", ED25519, generate_key()).verifier
    report = verify(orjson.dumps(receipt()), KeySet(other_log, KEYSET.receipt_keys))
    assert not report.ok and "another gateway" in report.checks[0].message
