"""An independent C2SP verifier (Go's reference sumdb/note and sumdb/tlog) accepts the gateway's
checkpoints, its receipts' inclusion proofs and its consistency proofs, and refuses an edited
proof."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvfence.receipts.checkpoint import Checkpoint, ConsistencyProof, InclusionProof, b64
from kvfence.receipts.note import split_note
from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.c2sp import build, missing


@pytest.fixture(scope="module")
def go_verifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    reason = missing()
    if reason is not None:
        if os.environ.get("KVFENCE_REQUIRE_GO") == "1":
            pytest.fail(f"KVFENCE_REQUIRE_GO=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    yield build(tmp_path_factory.mktemp("go"))


def check(binary: Path, vkey: str, kind: str, file: Path, *extra: str) -> tuple[int, str]:
    done = subprocess.run(
        [str(binary), vkey, kind, str(file), *extra], capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout.strip()


async def test_go_reference_verifier_accepts_checkpoints_and_proofs(
    stack: Stack, go_verifier: Path, tmp_path: Path
) -> None:
    tenant = stack.tenant("acme")
    vkey = (await tenant.keyset()).log.vkey
    first = None
    for i in range(5):
        _, _, _, receipt_id = await ask(stack, "acme", {**CHAT, "stream": i % 2 == 1})
        proof = await tenant.proof(receipt_id)
        file = tmp_path / f"{i}.tlog-proof"
        file.write_text(proof)
        code, said = check(go_verifier, vkey, "proof", file)
        parsed = InclusionProof.parse(proof)
        assert code == 0 and said.startswith("ok kvfence.test/log/tenant/"), said
        assert said.endswith(f"includes record {parsed.index}")
        first = first or Checkpoint.parse(split_note(parsed.note)[0])
        if parsed.path:  # an edited proof hash: refused
            file.write_text(proof.replace(b64(parsed.path[0]), b64(bytes(32)), 1))
            assert check(go_verifier, vkey, "proof", file)[0] == 1
    assert first is not None
    status, body = await tenant.get(f"/v1/kvfence/log/checkpoint?old={first.size}")
    assert status == 200
    bundle = tmp_path / "consistency"
    bundle.write_bytes(body)
    code, said = check(go_verifier, vkey, "consistency", bundle, b64(first.root))
    new = Checkpoint.parse(split_note(ConsistencyProof.parse(body.decode()).note)[0])
    assert code == 0 and said == f"ok {new.origin}@{new.size} extends {first.size}", said
    code, said = check(go_verifier, vkey, "consistency", bundle, b64(bytes(32)))
    assert code == 1 and "does not extend" in said
