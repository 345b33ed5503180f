"""Where one gateway's CPU goes, per component, in the same run as its figures: the gateway runs
under cProfile (on at SIGUSR1, off at SIGUSR2, which also writes what it saw), the loop thread's
self time is grouped by component, and the audit writer thread's CPU is read from /proc.
Run (as bench.gateway.side_by_side --components does it):
python -m bench.gateway.components OUT_PREFIX -m kvfence.cli gateway --policy ...
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import runpy
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

_TICK = os.sysconf("SC_CLK_TCK")
# Path fragments to component, first match wins (the loop thread's self time).
_COMPONENTS: tuple[tuple[str, str], ...] = (
    ("/gateway/audit/", "audit (loop side: judge, settle, record)"),
    ("/gateway/verify/detective", "detective"),
    ("/gateway/verify/fingerprints", "detective"),
    ("/gateway/verify/history", "detective"),
    ("/gateway/verify/store", "detective"),
    ("/gateway/verify/markers", "marker scan"),
    ("/gateway/verify/scan", "marker scan"),
    ("/gateway/verify/", "verify (other)"),
    ("/gateway/filters/", "filters"),
    ("/gateway/listener/", "listener"),
    ("/gateway/relay/", "relay"),
    ("/gateway/adapters/", "adapters"),
    ("/gateway/", "gateway (other)"),
    ("/kvfence/", "kvfence (handles, namespaces)"),
    ("/aiohttp/", "aiohttp"),
    ("/multidict/", "aiohttp"),
    ("/yarl/", "aiohttp"),
    ("/propcache/", "aiohttp"),
    ("/asyncio/", "event loop"),
)


def component(filename: str, function: str) -> str:
    """The component a profiled function's self time is charged to."""
    for fragment, name in _COMPONENTS:
        if fragment in filename:
            return name
    if filename == "~":  # a builtin: its name says whose it is
        if "orjson" in function:
            return "json (orjson)"
        if "aiohttp" in function or "multidict" in function or "yarl" in function:
            return "aiohttp"
        if "uvloop" in function or "socket" in function:
            return "event loop"
        if "hmac" in function or "hashlib" in function or "blake2" in function:
            return "hashing"
        return "builtins (other)"
    return "stdlib (other)"


def written(path: Path, deadline_s: float = 30.0) -> dict[str, float]:
    """What the profiled gateway wrote at SIGUSR2 (`path`), once it is there."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the profiled gateway wrote no {path.name}")
        time.sleep(0.05)
    loaded: dict[str, float] = orjson.loads(path.read_bytes())
    return loaded


def shares(profile: Path) -> dict[str, float]:
    """Each component's share of the loop thread's profiled self time."""
    stats: dict[Any, Any] = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    own: dict[str, float] = {}
    for (filename, _line, function), (_cc, _nc, tt, _ct, _callers) in stats.items():
        name = component(filename, function)
        own[name] = own.get(name, 0.0) + tt
    total = sum(own.values()) or 1.0
    return dict(sorted(((k, v / total) for k, v in own.items()), key=lambda kv: -kv[1]))


def _thread_cpu(tid: int) -> float:
    with contextlib.suppress(FileNotFoundError):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    return 0.0


class _Probe:
    """Counts the audit log's writes and syncs and finds its writer threads (patched in before
    the gateway starts)."""

    def __init__(self) -> None:
        from gateway.audit.chain import log as audit_log
        from gateway.audit.chain.chainfile import ChainFile

        self.writers: list[int] = []
        self.writes = self.syncs = self.marks = 0
        run, write = audit_log.AuditLog._run, ChainFile.write
        sync, mark = ChainFile.sync_data, ChainFile.mark
        probe = self

        def traced_run(log: audit_log.AuditLog) -> None:
            probe.writers.append(threading.get_native_id())
            run(log)

        def counted_write(chain: ChainFile, entry: dict[str, Any]) -> int:
            probe.writes += 1
            return write(chain, entry)

        def counted_sync(chain: ChainFile) -> None:
            probe.syncs += 1
            sync(chain)

        def counted_mark(chain: ChainFile) -> None:
            probe.marks += 1
            mark(chain)

        audit_log.AuditLog._run = traced_run  # type: ignore[method-assign,assignment]
        ChainFile.write = counted_write  # type: ignore[method-assign,assignment]
        ChainFile.sync_data = counted_sync  # type: ignore[method-assign,assignment]
        ChainFile.mark = counted_mark  # type: ignore[method-assign,assignment]

    def snapshot(self) -> dict[str, float]:
        return {
            "writer_cpu_s": sum(_thread_cpu(t) for t in self.writers),
            "writes": self.writes,
            "syncs": self.syncs,
            "marks": self.marks,
        }


def main() -> None:
    prefix, module, argv = Path(sys.argv[1]), sys.argv[3], sys.argv[4:]
    probe = _Probe()
    profiler = cProfile.Profile()
    started: dict[str, float] = {}

    def on(_sig: int, _frame: FrameType | None) -> None:
        started.update(probe.snapshot())
        profiler.enable()

    def off(_sig: int, _frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(str(prefix.with_suffix(".prof")))
        now = probe.snapshot()
        delta = {k: now[k] - started.get(k, 0.0) for k in now}
        tmp = prefix.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(delta))
        tmp.replace(prefix.with_suffix(".json"))  # whole or absent for the harness polling it

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
