"""The detective's history as the detective sees it, whichever store holds it: who recorded a
prefix key (a tenant and one of its namespaces, by tag), what a key's recorders say about a
reported hit, and how far back each tenant's records reach.

Invariant: `own` is true only for a record this namespace wrote, read back intact; a record
that is missing, evicted or fails its integrity check never counts as the namespace's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class Recorder:
    """Who sends a prompt: its tenant and its namespace, as 64-bit tags."""

    tenant: int
    namespace: int


class Presence(NamedTuple):
    """What the history holds of one key at judging time."""

    own: bool  # the namespace recorded it, before this request or in a later one of its own
    other: int  # the tag of another namespace that recorded it (0: none)


@dataclass(frozen=True, slots=True)
class Reach:
    """How far back one tenant's records are complete: every record it wrote since
    `complete_since` is held (the history's start, when the tenant first recorded there, or the
    newest of its records evicted, whichever is latest)."""

    tenant: int
    entries: int
    cap: int
    complete_since: float
    evicted: bool  # the cap evicted records (a young history alone is not a shortage)


class History(Protocol):
    async def record(self, who: Recorder, keys: Sequence[int], nonce: int) -> list[bool]:
        """Record `keys` for `who` (tagged `nonce`, this request's); returns, per key, whether
        `who` had recorded it before."""
        ...

    async def presence(
        self, who: Recorder, keys: Sequence[int], nonce: int, before: Sequence[bool]
    ) -> list[Presence]:
        """Per key: whether `who` explains it (`before`, or a later request of its own
        re-recorded it), and another namespace that recorded it."""
        ...

    async def reach(self) -> list[Reach]:
        """Every tenant's reach, for /status and the shortage alert."""
        ...

    def close(self) -> None: ...
