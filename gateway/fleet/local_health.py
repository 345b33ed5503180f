"""Per-backend verification state that every worker of one gateway shares: the last canary
outcome, rounds, violations, and whether the backend is quarantined. A small JSON file in the
state directory, changed under an exclusive lock and re-read by every worker within
`REFRESH_S`; its twin for several gateways is `health` (Redis). Its metrics are read at scrape.

Invariant: a change is a read-modify-write under the lock, so two workers never lose each
other's updates; readers see either the old or the new file, never a torn one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

REFRESH_S: Final = 0.25  # how stale a worker's view may be (workers agree within this)


@dataclass(frozen=True, slots=True)
class Health:
    canary: str = "none"  # none | isolated | shared | inconclusive
    canary_at: float = 0.0
    canary_reason: str = ""
    rounds: int = 0
    clean_streak: int = 0  # isolated rounds in a row
    quarantined: bool = False
    quarantine_reason: str = ""
    quarantined_at: float = 0.0
    violations: Mapping[str, int] = field(default_factory=dict)  # by kind
    canary_id: str = ""  # the last round's id, and what it sent and decided by
    canary_by: str = ""  # cached_tokens | timing | -
    canary_shapes: Sequence[str] = ()  # the shapes of the recent rounds, newest last
    counter: str = ""  # what rounds learned of the cached-token count (verify.canary)
    triggered: int = 0  # rounds tenants' answers triggered
    updated_at: float = 0.0  # when a gateway last changed it (its clock): the newest one wins

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Any) -> Health:
        if not isinstance(data, dict):
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return cls()


NEVER_CHECKED: Final = Health()  # a backend with no entry yet (read on every request: built once)


def stamped(before: Health, after: Health) -> Health:
    """`after` dated now, and always later than `before`: a change is newer than what it
    changed, whatever the clocks of the gateways that made the two."""
    return dataclasses.replace(after, updated_at=max(time.time(), before.updated_at + 0.001))


def newest(held: Health, found: Health | None) -> Health:
    """The newer of two states of one backend (`held` on a tie)."""
    return found if found is not None and found.updated_at > held.updated_at else held


class HealthBoard:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._seen: tuple[int, int, int] | None = None
        self.view: dict[str, Health] = {}
        # Per backend, its newest quarantine or release decision from the control database: a
        # state older than it (a replayed value, a state folder lost) does not override it.
        self.floor: dict[str, Health] = {}
        self._load()

    def get(self, backend: str) -> Health:
        return self.floored(backend, self.view.get(backend) or NEVER_CHECKED)

    def floored(self, backend: str, health: Health) -> Health:
        floor = self.floor.get(backend) if self.floor else None
        if floor is None or health.updated_at >= floor.updated_at:
            return health
        return dataclasses.replace(
            health,
            quarantined=floor.quarantined,
            quarantine_reason=floor.quarantine_reason,
            quarantined_at=floor.quarantined_at,
            clean_streak=0 if floor.quarantined else health.clean_streak,
            updated_at=floor.updated_at,
        )

    def _load(self) -> None:
        """Blocking: re-read the file when it changed."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        try:
            data = orjson.loads(self.path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return  # replaced under us; the next refresh reads the new file
        self._seen = seen
        if isinstance(data, dict):
            self.view = {str(k): Health.from_json(v) for k, v in data.items()}

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            await asyncio.to_thread(self._load)

    def _update_locked(
        self, backend: str, change: Callable[[Health], Health], stamp: bool = True
    ) -> tuple[Health, Health]:
        """Apply `change` to the backend's state under the lock (dated now unless `stamp` is
        False: a state taken as it is); returns (before, after)."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._seen = None
            self._load()
            before = self.floored(backend, self.view.get(backend) or NEVER_CHECKED)
            after = stamped(before, change(before)) if stamp else change(before)
            view = {**self.view, backend: after}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(orjson.dumps({k: v.as_json() for k, v in view.items()}))
            os.replace(tmp, self.path)
            self.view = view
            return before, after
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    async def update(
        self, backend: str, change: Callable[[Health], Health]
    ) -> tuple[Health, Health]:
        return await asyncio.to_thread(self._update_locked, backend, change)

    async def claim_round(self, backend: str, interval_s: float) -> bool:
        """Whether this gateway runs the backend's due canary round; its workers already take
        turns by a file lock (a board shared by several gateways says more)."""
        return True


class HealthCollector(Collector):
    """Per-backend verification state, read from the board every worker shares, at scrape time;
    every backend of the policy appears (a backend never checked: no canary, not quarantined)."""

    def __init__(self, board: HealthBoard, backends: Callable[[], Iterable[str]]) -> None:
        self.board = board
        self.backends = backends

    def collect(self) -> Iterator[Metric]:
        p = "kvfence_gateway_backend_"
        quarantined = GaugeMetricFamily(
            p + "quarantined", "1 while quarantined", labels=["backend"]
        )
        outcome = GaugeMetricFamily(
            p + "canary_outcome", "1 for the last canary outcome", labels=["backend", "outcome"]
        )
        at = GaugeMetricFamily(
            p + "canary_timestamp_seconds", "When the last canary round ended", labels=["backend"]
        )
        rounds = GaugeMetricFamily(p + "canary_rounds", "Canary rounds run", labels=["backend"])
        found = GaugeMetricFamily(
            p + "violations", "Violations by kind (shared count)", labels=["backend", "kind"]
        )
        for name in sorted(self.backends()):
            health = self.board.get(name)
            quarantined.add_metric([name], float(health.quarantined))
            outcome.add_metric([name, health.canary], 1.0)
            at.add_metric([name], health.canary_at)
            rounds.add_metric([name], float(health.rounds))
            for kind, count in sorted(health.violations.items()):
                found.add_metric([name, kind], float(count))
        yield from (quarantined, outcome, at, rounds, found)
