"""Group commit under `fsync: always`: appends that arrive while a sync runs share the next one,
no append returns before a sync that follows its write, and a failed sync fails its whole batch.
Counts and orders only: the syncs are held and counted, never timed."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.chain.chainfile import ChainFile
from gateway.audit.chain.log import Appended, AuditLog, AuditWriteError

SECRET = b"correct horse battery staple 01"
N = 100


def record(i: int) -> dict[str, object]:
    return {"request_id": f"req-{i}", "tenant": "alice", "verdict": "clean"}


class Recorder:
    """What the writer thread and the callers did, in order. Every fsync waits for `release`,
    then lets the event loop run whatever is ready before it syncs: an append whose future was
    completed before its sync would return (and be recorded) ahead of that sync."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.events: list[tuple[str, int]] = []
        self.release = threading.Event()
        self.synced = threading.Event()  # set by every sync once it is done
        self._lock = threading.Lock()
        real_fsync, real_write = os.fsync, ChainFile.write
        loop = asyncio.get_running_loop()

        async def settle() -> None:
            for _ in range(20):
                await asyncio.sleep(0)

        def fsync(fd: int) -> None:
            assert self.release.wait(30), "the test never released the sync"
            asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout=30)
            if fail:
                raise OSError(5, "Input/output error")
            real_fsync(fd)
            self.add("synced", -1)
            self.synced.set()

        def write(chain: ChainFile, entry: dict[str, Any]) -> int:
            seq = real_write(chain, entry)
            self.add("written", seq)
            return seq

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(ChainFile, "write", write)

    def add(self, what: str, seq: int) -> None:
        with self._lock:
            self.events.append((what, seq))

    def count(self, what: str) -> int:
        return sum(1 for kind, _ in self.events if kind == what)

    def index(self, what: str, seq: int) -> int:
        return self.events.index((what, seq))

    def first_sync_after(self, position: int) -> int:
        later = [i for i, e in enumerate(self.events) if e[0] == "synced" and i > position]
        assert later, f"no sync follows event {position}: {self.events}"
        return later[0]


async def _append_all(log: AuditLog, rec: Recorder) -> list[asyncio.Task[Appended]]:
    async def one(i: int) -> Appended:
        def hook(at: Appended) -> None:
            rec.add("hooked", at.seq)

        appended = await log.append(record(i), after=hook if i % 2 else None)
        rec.add("returned", appended.seq)
        return appended

    tasks = [asyncio.create_task(one(i)) for i in range(N)]
    # One turn of the loop runs every task up to its wait: all N records are queued, while
    # the writer holds at most the first ones behind the held sync.
    await asyncio.sleep(0)
    rec.release.set()
    await asyncio.wait(tasks, timeout=30)
    return tasks


async def test_concurrent_appends_share_syncs_and_none_returns_before_its_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", SECRET)  # fsync "always", the policy's default
    rec = Recorder(monkeypatch)
    tasks = await _append_all(log, rec)
    seqs = sorted(task.result().seq for task in tasks)
    assert len(set(seqs)) == N
    # The records the writer took before the first sync, then every one queued behind it.
    assert rec.count("synced") <= 2 < N
    for seq in seqs:
        covering = rec.first_sync_after(rec.index("written", seq))
        assert rec.index("returned", seq) > covering, f"record {seq} returned before its sync"
    hooked = [seq for kind, seq in rec.events if kind == "hooked"]
    assert len(hooked) == N // 2
    for seq in hooked:  # a receipt's hook runs after its record is written, before it returns
        assert rec.index("written", seq) < rec.index("hooked", seq) < rec.index("returned", seq)
    await log.close()
    lines = (tmp_path / "audit.jsonl").read_bytes().count(b'"kind":"record"')
    assert lines == N


async def test_a_failed_sync_fails_every_append_it_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", SECRET)
    rec = Recorder(monkeypatch, fail=True)
    tasks = await _append_all(log, rec)
    assert rec.count("written") >= 1
    assert rec.count("returned") == 0  # none reported durable
    assert all(isinstance(task.exception(), AuditWriteError) for task in tasks)
    with pytest.raises(AuditWriteError):
        await log.append(record(N))
    await log.close()


async def test_a_written_only_record_returns_before_its_sync_and_the_next_sync_covers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's `open` record: written before the first byte, synced with what follows."""
    log = AuditLog(tmp_path / "audit.jsonl", SECRET)
    rec = Recorder(monkeypatch)  # every sync is held until released
    async with asyncio.timeout(30):
        opened = await log.append(record(0), written=True)
    assert rec.events == [("written", opened.seq)]  # returned with its sync still held
    final = asyncio.create_task(log.append(record(1)))
    await asyncio.sleep(0)
    rec.release.set()
    async with asyncio.timeout(30):
        closed = await final
    rec.add("returned", closed.seq)
    synced = rec.first_sync_after(rec.index("written", closed.seq))
    assert rec.index("written", opened.seq) < synced < rec.index("returned", closed.seq)
    await log.close()


async def test_a_written_only_record_costs_no_sync_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed answer's two records (`open`, then the final one) share one sync."""
    log = AuditLog(tmp_path / "audit.jsonl", SECRET, batch_max_ms=600_000)
    rec = Recorder(monkeypatch)
    rec.release.set()
    async with asyncio.timeout(30):
        opened = await log.append(record(0), written=True)
        closed = await log.append(record(1))
    assert rec.count("synced") == 1
    assert rec.index("written", opened.seq) < rec.index("written", closed.seq)
    assert rec.index("written", closed.seq) < rec.first_sync_after(0)
    await log.close()


async def test_a_written_only_record_alone_is_synced_within_batch_max_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No append follows the `open` record (a stream that runs on): a sync comes all the same."""
    log = AuditLog(tmp_path / "audit.jsonl", SECRET, batch_max_ms=20)
    rec = Recorder(monkeypatch)
    rec.release.set()
    async with asyncio.timeout(30):
        opened = await log.append(record(0), written=True)
    assert await asyncio.to_thread(rec.synced.wait, 30), "the `open` record was never synced"
    assert rec.index("written", opened.seq) < rec.first_sync_after(0)
    await log.close()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
async def test_the_writer_never_preempts_the_event_loop(tmp_path: Path) -> None:
    """The writer thread is SCHED_BATCH: its wake-ups wait for the serving loop's slice."""
    log = AuditLog(tmp_path / "audit.jsonl", SECRET)
    await log.append(record(0))
    writer = next(t for t in threading.enumerate() if t.name == "audit-log")
    assert writer.native_id is not None
    assert os.sched_getscheduler(writer.native_id) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the loop's own thread is untouched
    await log.close()
