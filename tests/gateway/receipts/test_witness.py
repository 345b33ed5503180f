"""The witness, run as a person runs it (`kvfence witness run` against the gateway): it cosigns
each checkpoint that extends the last one it cosigned, the gateway keeps the cosignature and
proves receipts in the witnessed checkpoint; a log rolled back, or truncated and grown again
(a fork), is refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from kvfence.cli import main as kvfence
from kvfence.keys.keyfile import write_private_key
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.receipts.conftest import Stack, open_stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.gateway import KEYS
from tests.kit.receipts import WITNESS_NAME, ReceiptKeys


async def witness(
    stack: Stack, folder: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """One run of `kvfence witness run`; its exit code and what it said."""
    key_file, api_key = folder / "witness.key", folder / "witness-api.key"
    if not key_file.exists():
        write_private_key(key_file, stack.keys.witness.key)
        api_key.write_text(KEYS["acme"] + "\n")  # a tenant's key reaches its own receipt log
    log_key = stack.keys.log_key.vkey
    argv = ["witness", "run", "--url", stack.gw.url, "--api-key-file", str(api_key)]
    argv += ["--key-file", str(key_file), "--name", WITNESS_NAME, "--log-key", log_key]
    argv += ["--state", str(folder / "state")]
    code = await asyncio.to_thread(kvfence, argv)
    out = capsys.readouterr()
    return code, out.out + out.err


async def answers(stack: Stack, n: int) -> list[tuple[bytes, bytes, str]]:
    found = []
    for _ in range(n):
        status, request, response, receipt_id = await ask(stack, "acme", CHAT)
        assert status == 200
        found.append((request, response, receipt_id))
    return found


async def test_witness_cosigns_and_tenants_check_the_cosignature(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ((request, response, receipt_id),) = await answers(stack, 1)
    code, said = await witness(stack, tmp_path, capsys)
    assert code == 0, said
    assert "kvfence.test/log/tenant/" in said and ": cosigned" in said and "first seen" in said
    report = await stack.tenant("acme").verify(
        receipt_id, request, response, (stack.keys.witness.verifier,)
    )
    assert report.ok, report.checks
    (witnessed,) = [c for c in report.checks if c.name == "witness"]
    assert witnessed.message.startswith("checkpoint cosigned by witness.test/w1")
    await answers(stack, 3)
    code, said = await witness(stack, tmp_path, capsys)
    assert code == 0 and "consistent" in said and "from " in said, said


async def test_a_forked_or_rolled_back_log_is_caught(
    receipt_keys: ReceiptKeys,
    upstream: FakeUpstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    witness_dir = tmp_path / "witness"
    witness_dir.mkdir()
    async with open_stack(receipt_keys, upstream) as stack:
        await answers(stack, 6)
        code, said = await witness(stack, witness_dir, capsys)
        assert code == 0, said
    # The operator wipes the receipt logs and starts them again under the same name and key.
    with sqlite3.connect(receipt_keys.folder / "state" / "control.db") as db:
        db.execute("DELETE FROM receipt_leaves")
        db.execute("DELETE FROM receipt_checkpoints")
    async with open_stack(receipt_keys, upstream) as stack:
        await answers(stack, 1)
        code, said = await witness(stack, witness_dir, capsys)
        assert code == 1 and "ROLLED BACK" in said, said
        # ... and grown past what the witness cosigned: a fork, caught by the consistency proof.
        await answers(stack, 10)
        code, said = await witness(stack, witness_dir, capsys)
        assert code == 1 and "FORKED" in said, said
