"""The audit log: a clean log verifies (across rotation and restarts); every kind of tampering
is caught at the right line; a failing write fails the request closed."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.audit.chain.log import AuditLog, AuditWriteError, head_path, mac_key, rotated_paths
from gateway.audit.chain.verify import AuditVerifyError, check_head, verify_files
from gateway.audit.cli import configure, main

SECRET = b"correct horse battery staple 01"
KEY = mac_key(SECRET)


def record(i: int) -> dict[str, object]:
    return {
        "time": 1_800_000_000.0 + i,
        "request_id": f"req-{i}",
        "tenant": "alice",
        "backend": "be-1",
        "model": "smollm2",
        "namespace_digest": "3f2a9c01d4e5",
        "verdict": "clean",
        "prompt_tokens": 40,
        "cached_tokens": 32,
        "attestation_digest": "ab" * 32,
    }


async def write_log(path: Path, count: int, **kw: Any) -> None:
    log = AuditLog(path, SECRET, **kw)
    for i in range(count):
        await log.append(record(i))
    await log.close()


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def run_cli(tmp_path: Path, *argv: str, key: Path | None = None) -> int:
    parser = argparse.ArgumentParser()
    configure(parser)
    key = key or key_file(tmp_path)
    return main(parser.parse_args(["verify", *argv, "--key-file", str(key)]))


def failure(paths: list[Path]) -> AuditVerifyError:
    with pytest.raises(AuditVerifyError) as info:
        summaries = verify_files(paths, KEY)
        check_head(paths[-1], KEY, summaries[-1])
    return info.value


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


async def test_clean_log_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 5)
    assert len(lines_of(log)) == 6  # header + 5 records
    assert run_cli(tmp_path, str(log)) == 0
    assert "5 records" in capsys.readouterr().out
    first = orjson.loads(lines_of(log)[1])
    assert first["namespace_digest"] == "3f2a9c01d4e5" and "namespace" not in first


def edit(lines: list[bytes]) -> list[bytes]:
    lines[3] = lines[3].replace(b'"verdict":"clean"', b'"verdict":"violation"')
    return lines


@pytest.mark.parametrize(
    ("tamper", "bad_line"),
    [
        (edit, 4),
        (lambda ls: ls[:2] + ls[3:], 3),  # deleted record
        (lambda ls: [*ls[:3], ls[2], *ls[3:]], 4),  # inserted (duplicated) record
        (lambda ls: [*ls[:2], ls[3], ls[2], *ls[4:]], 3),  # reordered
        (lambda ls: ls[:-1], 6),  # truncated tail
        (lambda ls: [*ls[:-1], ls[-1][:-5]], 6),  # torn tail
    ],
)
async def test_tampering_is_detected_at_the_first_bad_line(
    tmp_path: Path, tamper: object, bad_line: int, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 5)
    log.write_bytes(b"".join(tamper(lines_of(log))))  # type: ignore[operator]
    assert failure([log]).line == bad_line
    assert run_cli(tmp_path, str(log)) == 1
    assert f"audit.jsonl:{bad_line}:" in capsys.readouterr().err


async def test_checkpoint_cannot_be_removed_or_forged(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 3)
    head = head_path(log)
    saved = head.read_bytes()
    forged = orjson.loads(saved)
    forged["lines"] = 2
    head.write_bytes(orjson.dumps(forged))
    assert "forged" in failure([log]).reason
    head.unlink()
    assert "checkpoint" in failure([log]).reason


async def test_wrong_key_fails_on_the_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 2)
    other = tmp_path / "other.secret"
    other.write_bytes(b"another secret of enough length")
    assert run_cli(tmp_path, str(log), key=other) == 3
    assert "audit.jsonl:1: wrong key" in capsys.readouterr().err


async def test_restart_continues_the_chain(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 2)
    await write_log(log, 2, fsync="batch", batch_max_records=1)
    assert sum(s.records for s in verify_files([log], KEY)) == 4
    assert rotated_paths(log) == []


async def test_rotation_keeps_verifying_and_links_files(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    await write_log(log, 40, fsync="batch", batch_max_records=8, rotate_bytes=2000)
    older = rotated_paths(log)
    assert len(older) >= 2
    summaries = verify_files([*older, log], KEY)
    assert sum(s.records for s in summaries) == 40
    assert run_cli(tmp_path, str(log), "--rotated") == 0
    # a whole rotated file deleted: the next file no longer continues the chain
    assert failure([older[0], *older[2:], log]).line == 1
    # a rotated file's tail cut (its seal gone)
    older[0].write_bytes(b"".join(lines_of(older[0])[:-1]))
    assert failure([*older, log]).path == older[0]


async def test_failing_write_raises_and_stays_failed(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    log = AuditLog(directory / "audit.jsonl", SECRET)
    await log.append(record(0))
    # The writer moves the log's head after acknowledging a batch: its temporary file may come
    # and go while the folder is removed, so the removal is tried until nothing is left.
    while directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
    with pytest.raises(AuditWriteError):
        await log.append(record(1))
    with pytest.raises(AuditWriteError):
        await log.append(record(2))
    await log.close()


def test_unwritable_location_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(AuditWriteError):
        AuditLog(tmp_path / "missing-dir" / "audit.jsonl", SECRET)


async def test_reserved_and_unencodable_records_are_refused(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", SECRET)
    with pytest.raises(ValueError):
        await log.append({"tag": "x"})
    with pytest.raises(TypeError):
        await log.append({"obj": object()})
    await log.append(record(0))
    await log.close()
    with pytest.raises(AuditWriteError):
        await log.append(record(1))


async def test_a_record_whose_writer_is_cancelled_is_written_and_the_log_goes_on(
    tmp_path: Path,
) -> None:
    """A request cancelled (its client left) while its record is queued: the record is written,
    and the writer thread lives on for the next one."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, SECRET)
    for i in range(20):
        task = asyncio.create_task(log.append(record(i)))
        await asyncio.sleep(0)  # queued for the writer thread
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    async with asyncio.timeout(10):
        await log.append(record(20))
    await log.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["request_id"] for r in lines if r["kind"] == "record"] == [
        f"req-{i}" for i in range(21)
    ]
