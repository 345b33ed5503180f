"""One pinned trust root: a receipt verifies from the gateway's log key, the key set's
fingerprint or a witness, got out of band; a forged receipt (edited to say violation, signed with
an attacker's key listed in an edited key set) fails under every pin and without one; with no
pin, verify says so and does not exit 0."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kvfence.cli import main as kvfence
from kvfence.keys.keyfile import generate_key
from kvfence.receipts.receipt import KeySet, ReceiptKey, sign
from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask


def forge(receipt: bytes, keys: bytes) -> tuple[bytes, bytes]:
    """The receipt edited to say violation and signed with an attacker's key, which an edited
    key set lists."""
    attacker = generate_key()
    genuine = KeySet.parse(orjson.loads(keys))
    keyset = KeySet(
        genuine.log, (ReceiptKey("rX", attacker.public_key()), *genuine.receipt_keys),
        genuine.witnesses,
    )  # fmt: skip
    doc = orjson.loads(receipt)
    for event in doc["event_log"]:
        if event["type"] == "kvfence.verdict":
            event["verdict"] = "violation"
    doc["workload_keyset_digest"] = keyset.digest
    del doc["signature"]
    sign(doc, "rX", attacker)
    return orjson.dumps(doc), orjson.dumps(keyset.document())


async def test_forged_receipts_fail_with_and_without_a_pin(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, response, receipt_id = await ask(stack, "acme", CHAT)
    tenant = stack.tenant("acme")
    receipt, proof = await tenant.receipt(receipt_id), await tenant.proof(receipt_id)
    _, keys = await tenant.get("/v1/kvfence/keys")
    forged, forged_keys = forge(receipt, keys)
    for name, data in [("receipt", receipt), ("keys", keys), ("forged", forged),
                       ("forged-keys", forged_keys), ("response", response)]:  # fmt: skip
        (tmp_path / name).write_bytes(data)
    (tmp_path / "proof").write_text(proof)
    assert kvfence(["keys", "fingerprint", str(tmp_path / "keys")]) == 0
    fingerprint = capsys.readouterr().out.strip()
    assert fingerprint == orjson.loads(keys)["workload_id"]
    log_key = stack.keys.log_key.vkey
    pins = {"log key": ["--log-key", log_key], "fingerprint": ["--fingerprint", fingerprint],
            "witness": ["--witness", stack.keys.witness_vkey]}  # fmt: skip

    def run(receipt_file: str, keys_file: str, *extra: str) -> tuple[int, str]:
        argv = [
            "receipt",
            "verify",
            str(tmp_path / receipt_file),
            "--proof",
            str(tmp_path / "proof"),
        ]
        code = kvfence([*argv, "--keys", str(tmp_path / keys_file), *extra])
        said = capsys.readouterr()
        return code, said.out + said.err

    code, said = run("receipt", "keys", *pins["log key"], "--response", str(tmp_path / "response"))
    assert code == 0, said
    code, said = run("receipt", "keys", *pins["fingerprint"])
    assert code == 0, said
    for pin in ("log key", "fingerprint"):
        code, said = run("forged", "forged-keys", *pins[pin])
        assert code == 1 and "NOT verified" in said, (pin, said)
    code, said = run("forged", "forged-keys")  # no pin at all
    assert code == 1 and "no trust root given" in said, said
    code, said = run("receipt", "keys")  # even the genuine receipt: nothing to trust it from
    assert code == 1 and "no trust root given" in said, said
    # Without the proof the key set is bound to nothing: refused, whatever is pinned.
    argv = ["receipt", "verify", str(tmp_path / "forged"), "--keys", str(tmp_path / "forged-keys")]
    assert kvfence([*argv, *pins["log key"]]) == 1
    # A fingerprint of another key set (another log key) is refused.
    other = "sha256:" + "0" * 64
    code, said = run("receipt", "keys", "--fingerprint", other)
    assert code == 1 and "is not the pinned" in said, said
