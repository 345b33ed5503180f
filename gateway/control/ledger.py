"""The spend ledger's transactions as `Steps`: a batch of holds (a request's reservation, asked
when it is admitted) and charges (what it used, when it ends) applied in order, and a subject's
spend in the current windows.

Invariant: a batch is one transaction, its operations applied in the order given; a hold is
granted only while what each of its subjects spent plus what is reserved for them (holds
granted earlier in the same batch included) is below every budget, so concurrent requests pass
a budget by at most one reservation; a charge releases its reservation and adds its tokens to
every window of each subject.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from gateway.control.engine import Steps

Ask = tuple[str, Mapping[str, int], Mapping[str, int]]  # subject, windows, budgets (by period)
Full: TypeAlias = tuple[str, str, int] | None  # the first budget spent (subject, period, budget)
Spends: TypeAlias = dict[str, dict[str, int]]  # each subject's spend after a charge, by period


@dataclass(frozen=True, slots=True)
class Hold:
    """Reserve `tokens` for each subject of `asks` for `lease_s`, if every budget allows."""

    rid: str
    asks: tuple[Ask, ...]
    tokens: int
    lease_s: float


@dataclass(frozen=True, slots=True)
class Charge:
    """Release `rid`'s reservation and add `tokens` to each subject's windows."""

    rid: str
    charges: tuple[tuple[str, Mapping[str, int]], ...]
    tokens: int


def apply(ops: Sequence[Hold | Charge], now: float) -> Steps[list[Full | Spends]]:
    """Each operation's outcome, in order: a hold's `Full` (None: held), a charge's `Spends`."""
    if any(isinstance(op, Hold) for op in ops):
        yield "DELETE FROM reservations WHERE expires < ?", (now,)
    out: list[Full | Spends] = []
    for op in ops:
        if isinstance(op, Hold):
            out.append((yield from _hold(op, now)))
        else:
            out.append((yield from _charge(op)))
    return out


def needs_sync(ops: Sequence[Hold | Charge]) -> bool:
    """Whether the batch's commit must be on disk before its callers go on: a charge (spend, or a
    reservation released) must be; holds alone need not. A hold reserves for a request that
    lives in this gateway's process: a machine crash that loses the hold ends the request too,
    and a process crash loses nothing the OS already has."""
    return any(isinstance(op, Charge) for op in ops)


def spent(subject: str, windows: Mapping[str, int]) -> Steps[dict[str, int]]:
    out = dict.fromkeys(windows, 0)
    for period, start in windows.items():
        rows = yield (
            "SELECT tokens FROM spend WHERE subject = ? AND period = ? AND window_start = ?",
            (subject, period, start),
        )
        if rows:
            out[period] = int(rows[0][0])
    return out


def _hold(op: Hold, now: float) -> Steps[Full]:
    for subject, windows, budgets in op.asks:
        spend = yield from spent(subject, windows)
        rows = yield (
            "SELECT COALESCE(SUM(tokens), 0) FROM reservations WHERE subject = ?",
            (subject,),
        )
        held = int(rows[0][0]) if rows else 0
        for period, budget in budgets.items():
            if budget and spend.get(period, 0) + held >= budget:
                return subject, period, budget
    for subject, _, _ in op.asks:
        yield (
            "INSERT INTO reservations (id, subject, tokens, expires) VALUES (?, ?, ?, ?)",
            (f"{op.rid} {subject}", subject, op.tokens, now + op.lease_s),
        )
    return None


def _charge(op: Charge) -> Steps[Spends]:
    out: Spends = {}
    for subject, windows in op.charges:
        yield "DELETE FROM reservations WHERE id = ?", (f"{op.rid} {subject}",)
        if op.tokens > 0:
            for period, start in windows.items():
                yield (
                    "INSERT INTO spend (subject, period, window_start, tokens) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (subject, period, window_start) "
                    "DO UPDATE SET tokens = spend.tokens + excluded.tokens",
                    (subject, period, start, op.tokens),
                )
        out[subject] = yield from spent(subject, windows)
    return out
