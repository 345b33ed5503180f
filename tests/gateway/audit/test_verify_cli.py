"""`kvfence audit verify` as an operator runs it: the records per verdict, and for a gateway run
with `--workers N` every worker's chain from the one path the policy names (or the policy
itself); a missing or tampered worker chain fails, a wrong key is told apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit.chain.format import worker_path
from gateway.audit.chain.log import AuditLog
from kvfence.cli import main as kvfence_main
from tests.gateway.audit.test_log import SECRET, record

VERDICTS = ("clean", "clean", "violation", "unverified")


async def _chains(folder: Path, workers: list[int | None]) -> Path:
    """The chains a gateway with these workers leaves: `audit.jsonl` or `audit.wK.jsonl`, each
    anchored in anchor/; returns the path the policy names."""
    (folder / "audit").mkdir()
    (folder / "anchor").mkdir()
    path, anchor = folder / "audit" / "audit.jsonl", folder / "anchor" / "audit.anchor"
    for worker in workers:
        log = AuditLog(worker_path(path, worker), SECRET, anchor=worker_path(anchor, worker))
        for i, verdict in enumerate(VERDICTS):
            await log.append({**record(i), "verdict": verdict})
        await log.close()
    (folder / "audit.key").write_bytes(SECRET + b"\n")
    return path


def _remove(folder: Path, pattern: str) -> None:
    for file in folder.glob(pattern):
        file.unlink()


def _verify(folder: Path, *args: str) -> int:
    key = ("--key-file", str(folder / "audit.key"))
    return kvfence_main(["audit", "verify", *args, *key])


async def test_one_chain_prints_its_records_per_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = await _chains(tmp_path, [None])
    assert _verify(tmp_path, str(path), "--anchor", str(tmp_path / "anchor" / "audit.anchor")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: 4 records in 1 file(s), chain from its origin")
    assert out[1] == "verdicts: clean 2, unverified 1, violation 1"


async def test_the_policy_path_verifies_every_workers_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = await _chains(tmp_path, [1, 2])
    anchor = str(tmp_path / "anchor" / "audit.anchor")
    assert _verify(tmp_path, str(path), "--anchor", anchor) == 0
    out = capsys.readouterr().out
    assert "audit.w1.jsonl: ok: 4 records" in out and "audit.w2.jsonl: ok: 4 records" in out
    assert out.splitlines()[-1] == (
        "ok: 2 of 2 chains intact; verdicts: clean 4, unverified 2, violation 2"
    )
    assert _verify(tmp_path, str(path), "--anchor", anchor, "--workers", "2") == 0


async def test_a_deleted_worker_chain_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = await _chains(tmp_path, [1, 2])
    _remove(tmp_path, "audit/audit.w2.jsonl*")
    anchor = str(tmp_path / "anchor" / "audit.anchor")
    # Its anchor survives in the other folder, and --workers 2 expects it anyway.
    assert _verify(tmp_path, str(path), "--anchor", anchor) == 1
    assert "audit.w2.jsonl:0: the active file is missing" in capsys.readouterr().err
    _remove(tmp_path, "anchor/audit.w2.anchor")
    assert _verify(tmp_path, str(path), "--workers", "2") == 1
    assert "audit.w2.jsonl:0: the active file is missing" in capsys.readouterr().err


async def test_policy_gives_path_key_and_anchor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _chains(tmp_path, [1, 2])
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "gateway:\n  audit_log:\n    path: audit/audit.jsonl\n    key: {file: audit.key}\n"
        "    anchor: anchor/audit.anchor\n"
    )
    assert kvfence_main(["audit", "verify", "--policy", str(policy)]) == 0
    assert "ok: 2 of 2 chains intact" in capsys.readouterr().out


async def test_a_wrong_key_is_not_called_tampering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = await _chains(tmp_path, [1, 2])
    (tmp_path / "audit.key").write_bytes(b"another key, at least 16 bytes long")
    assert _verify(tmp_path, str(path)) == 3
    err = capsys.readouterr().err
    assert err.count("WRONG KEY") == 2 and "FAILED" not in err


async def test_a_streams_open_record_counts_once_and_an_unfinished_one_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream writes an `open` record before its first byte and a `final` one at its end:
    verdicts count the final ones; a stream the gateway never completed (it stopped mid-stream)
    is said, and is not tampering."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, SECRET)
    for i, phase in enumerate(("open", "final", "open")):
        stream = "s1" if i < 2 else "s2"
        await log.append({**record(i), "upstream_id": stream, "phase": phase, "verdict": "clean"})
    await log.append({"event": "quarantine", "backend": "be-1", "reason": "test"})
    await log.close()
    (tmp_path / "audit.key").write_bytes(SECRET + b"\n")
    assert _verify(tmp_path, str(path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert "1 stream(s) opened and never completed" in out[0]
    assert out[1] == "verdicts: clean 1"
