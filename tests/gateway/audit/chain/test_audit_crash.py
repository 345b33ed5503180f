"""Crashes: an empty or torn active file, or a crash inside a rotation, is recovered at start
with a record saying so, and the whole chain verifies; one process holds each chain; a log cut
below its checkpoint or behind its anchor is refused, untouched. The real gateway: workers die
with their parent, a second gateway on the same port refuses to start, and requests completed
before a SIGKILL of everything are all in the log."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.audit.chain.chainfile import ChainFile
from gateway.audit.chain.format import mac_key
from gateway.audit.chain.log import AuditLocked, AuditLog, AuditWriteError
from gateway.audit.chain.verify import verify_chain
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.audit_processes import (
    chat,
    command,
    free_port,
    gateway_policy,
    gone,
    launch,
    reap,
)
from tests.kit.gateway import ENV
from tests.kit.polling import until, until_sync
from tests.kit.tamper import SECRET, record

KEY = mac_key(SECRET)


def entries(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def session(path: Path, anchor: Path, first: int, count: int) -> None:
    log = AuditLog(path, SECRET, anchor=anchor, rotate_bytes=4096)
    for i in range(first, first + count):
        await log.append(record(i))
    await log.close()


@pytest.fixture
def where(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "logs").mkdir()
    (tmp_path / "anchor").mkdir()
    return tmp_path / "logs" / "audit.jsonl", tmp_path / "anchor" / "audit.anchor"


def records_in(path: Path) -> int:
    return sum(
        s.records for s in verify_chain(path, KEY, path.parent.parent / "anchor" / "audit.anchor")
    )


async def test_an_empty_active_file_is_recovered(where: tuple[Path, Path]) -> None:
    """A crash between creating the file and writing its header (here: the first start)."""
    path, anchor = where
    path.write_bytes(b"")
    await session(path, anchor, 0, 2)
    assert [e["kind"] for e in entries(path)] == ["header", "recovery", "record", "record"]
    assert entries(path)[1]["found"] == "empty active file"
    assert records_in(path) == 2


@pytest.mark.parametrize(
    "torn", [b'{"kind":"rec', None], ids=["short", "a_whole_line_but_its_newline"]
)
async def test_a_torn_last_line_is_recovered(where: tuple[Path, Path], torn: bytes | None) -> None:
    """A crash in the middle of writing a line, after a rotation: recovered at the next start
    with a record of what was cut, and the whole chain, rotations included, verifies."""
    path, anchor = where
    await session(path, anchor, 0, 30)  # a rotated file and an active one
    last = path.read_bytes().splitlines(keepends=True)[-1]
    torn = last[:-1] if torn is None else torn
    with path.open("ab") as f:
        f.write(torn)
    await session(path, anchor, 30, 3)
    [recovery] = [e for e in entries(path) if e["kind"] == "recovery"]
    assert (recovery["found"], recovery["torn_bytes"]) == ("torn last line", len(torn))
    assert records_in(path) == 33
    assert len(list(path.parent.glob("audit.jsonl.[0-9]*"))) >= 1


async def test_a_crash_inside_a_rotation_is_recovered(where: tuple[Path, Path]) -> None:
    path, anchor = where
    await session(path, anchor, 0, 5)
    # A seal written and synced, then a crash: before the file moved to FILE.N; after the move,
    # before the next file was made; after it was made, before its header was written.
    for crash in ("before_move", "after_move", "empty_next_file"):
        chain = ChainFile(path, KEY, anchor)
        chain.write({"kind": "seal", "lines": chain.lines + 1})
        chain.sync()
        if crash != "before_move":
            chain._rotate_away()
        if crash == "empty_next_file":
            path.write_bytes(b"")
        chain.close()
        await session(path, anchor, 100, 2)
    assert records_in(path) == 11
    assert [e["found"] for e in entries(path) if e["kind"] == "recovery"] == ["empty active file"]


async def test_one_process_holds_each_chain(where: tuple[Path, Path]) -> None:
    path, anchor = where
    first = AuditLog(path, SECRET, anchor=anchor)
    with pytest.raises(AuditLocked) as info:
        AuditLog(path, SECRET, anchor=anchor)
    assert f"pid {os.getpid()}" in str(info.value)
    await first.close()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import fcntl,os,sys,time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\ntime.sleep(60)", str(path) + ".lock",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and await holder.stdout.readline() == b"held\n"
        with pytest.raises(AuditLocked):
            AuditLog(path, SECRET, anchor=anchor)
    finally:
        holder.kill()
        await holder.communicate()
    await session(path, anchor, 0, 1)  # free again once the holder is gone


@pytest.mark.parametrize(
    "tamper",
    ["cut_below_checkpoint", "rolled_back_with_checkpoint", "another_key", "forged_anchor"],
)
async def test_a_log_that_lost_history_is_refused_and_left_untouched(
    where: tuple[Path, Path], tamper: str
) -> None:
    path, anchor = where
    await session(path, anchor, 0, 3)
    saved = {p: p.read_bytes() for p in (path, path.with_name("audit.jsonl.head"))}
    await session(path, anchor, 3, 3)
    lines = path.read_bytes().splitlines(keepends=True)
    secret = SECRET
    if tamper == "cut_below_checkpoint":
        path.write_bytes(b"".join(lines[:3]))
    elif tamper == "rolled_back_with_checkpoint":
        for p, data in saved.items():
            p.write_bytes(data)
    elif tamper == "another_key":
        secret = b"another secret of enough length!"
    else:
        anchor.write_bytes(anchor.read_bytes().replace(b'"seq":', b'"seq":9'))
    before = {p: p.read_bytes() for p in path.parent.iterdir() if not p.name.endswith(".lock")}
    with pytest.raises(AuditWriteError):
        AuditLog(path, secret, anchor=anchor)
    after = {p: p.read_bytes() for p in path.parent.iterdir() if not p.name.endswith(".lock")}
    assert after == before


# The real gateway, as processes.


@pytest.fixture(autouse=True)
def _reaped() -> Iterator[None]:
    yield
    reap()  # a test that failed midway leaves no gateway running


def chains(tmp_path: Path) -> list[dict[str, Any]]:
    """Every record of every worker's chain, each chain verified with its anchor."""
    found = []
    for worker in (1, 2):
        path = tmp_path / "audit" / f"audit.w{worker}.jsonl"
        if path.exists():
            verify_chain(path, KEY, tmp_path / "anchor" / f"audit.w{worker}.anchor")
            files = [*sorted(path.parent.glob(path.name + ".*[0-9]")), path]
            found += [e for f in files for e in entries(f) if e["kind"] == "record"]
    return found


async def test_workers_die_with_their_parent(tmp_path: Path, upstream: FakeUpstream) -> None:
    policy, port = gateway_policy(tmp_path, upstream), free_port()
    proc, workers = await launch(policy, port)
    assert [await chat(port, f"a-{i}") for i in range(4)] == [200] * 4
    proc.kill()  # the parent alone
    await proc.wait()
    assert until_sync(lambda: all(gone(pid) for pid in workers), 20, 0.1), "workers outlived it"
    # The port and the chains are free: a new gateway takes over, and every chain verifies.
    proc, _ = await launch(policy, port)
    assert await chat(port, "b-0") == 200
    proc.terminate()
    assert await proc.wait() == 0
    assert sorted(r["request_id"] for r in chains(tmp_path)) == [
        *(f"a-{i}" for i in range(4)),
        "b-0",
    ]


async def test_a_second_gateway_does_not_write_the_same_chains(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    policy, port = gateway_policy(tmp_path, upstream), free_port()
    first, _ = await launch(policy, port)
    try:
        second = await asyncio.create_subprocess_exec(
            *command(policy, port), env={**os.environ, **ENV},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(60):
            _, err = await second.communicate()
        assert second.returncode == 2
        [line] = err.decode().strip().splitlines()
        assert "refusing to start" in line and "held by another process" in line
        assert [await chat(port, f"r-{i}") for i in range(4)] == [200] * 4
    finally:
        first.terminate()
        assert await first.wait() == 0
    assert len(chains(tmp_path)) == 4


async def test_a_dead_worker_stops_the_gateway(tmp_path: Path, upstream: FakeUpstream) -> None:
    proc, workers = await launch(gateway_policy(tmp_path, upstream), free_port())
    os.kill(workers[0], signal.SIGKILL)
    async with asyncio.timeout(30):
        assert await proc.wait() != 0
    assert until_sync(lambda: gone(workers[1]), 20, 0.1)


async def test_every_completed_request_survives_sigkills(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Three rounds of requests, each ended by a SIGKILL of the parent and its workers at
    once; every request answered 200 is in a chain, and every chain verifies."""
    policy, port = gateway_policy(tmp_path, upstream), free_port()
    completed: list[str] = []
    for round_ in range(3):
        proc, _ = await launch(policy, port)
        stop = asyncio.Event()

        async def client(n: int, round_: int = round_, stop: asyncio.Event = stop) -> None:
            i = 0
            while not stop.is_set():
                rid = f"k{round_}-{n}-{i}"
                i += 1
                try:
                    if await chat(port, rid) == 200:
                        completed.append(rid)
                except aiohttp.ClientError:
                    return

        clients = [asyncio.create_task(client(n)) for n in range(4)]
        enough = 10 * (round_ + 1)
        await until(lambda n=enough: len(completed) > n, what="requests flowing")
        os.killpg(proc.pid, signal.SIGKILL)
        stop.set()
        await asyncio.gather(*clients)
        await proc.wait()
    logged = {r["request_id"] for r in chains(tmp_path)}
    assert set(completed) <= logged
