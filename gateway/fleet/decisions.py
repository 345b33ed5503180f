"""Quarantine and release decisions kept in the control database: every transition a gateway
decides is written there, and every worker reads the newest decision per backend each second
into its health board's floor.

Invariant: a quarantine stands until a newer decision releases it: a fleet restarted on empty
state folders, or a Redis holding an older authentic value, comes up quarantined all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from gateway.control.engine import ControlUnavailable
from gateway.control.service import origin
from gateway.control.store import ControlStore, Decision
from gateway.fleet.local_health import Health, HealthBoard

INTERVAL_S: Final = 1.0
log = logging.getLogger("kvfence.gateway.control")


async def decide(store: ControlStore, board: HealthBoard, decision: Decision) -> None:
    """Record one transition (a failure is logged: Redis and the state folder still hold it)."""
    try:
        await store.decide(decision, origin())
    except ControlUnavailable as exc:
        log.error("quarantine decision not recorded in the control database",
                  extra={"backend": decision.backend, "error": str(exc)})  # fmt: skip
        return
    board.floor[decision.backend] = floor_of(decision)


def floor_of(decision: Decision) -> Health:
    return Health(
        quarantined=decision.quarantined,
        quarantine_reason=decision.reason if decision.quarantined else "",
        quarantined_at=decision.decided if decision.quarantined else 0.0,
        updated_at=decision.decided,
    )


async def load(store: ControlStore, board: HealthBoard) -> None:
    decisions = await store.decisions()
    board.floor = {name: floor_of(d) for name, d in decisions.items()}


async def follow(store: ControlStore, board: HealthBoard) -> None:
    """Forever: the newest decisions, every `INTERVAL_S` (an outage keeps the floor it had)."""
    while True:
        with contextlib.suppress(ControlUnavailable):
            await load(store, board)
        await asyncio.sleep(INTERVAL_S)
