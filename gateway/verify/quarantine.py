"""Quarantine rules: how a canary round, a live marker in an answer, a detective finding or an
operator's release changes one backend's shared health. Pure functions over `Health`.

Invariant: only evidence no tenant can manufacture quarantines: a round that says `shared` (a
timing-only `shared` only once a second round confirmed it: the watch runs that round and
hands over the confirmed result) or a live canary marker in an answer. A detective finding
never quarantines; it triggers a round. A quarantine ends after `clean_rounds` isolated rounds
in a row, or by an operator's release; an inconclusive round never counts as clean.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from gateway.fleet.local_health import Health
from gateway.policy.backend_model import CanarySettings, OnShared
from gateway.verify.canary import Result
from kvfence.probe.outcome import Outcome

RECENT_SHAPES: Final = 8  # shapes of the last rounds that /status shows


def _violation(health: Health, kind: str) -> dict[str, int]:
    counts = dict(health.violations)
    counts[kind] = counts.get(kind, 0) + 1
    return counts


def after_round(health: Health, result: Result, settings: CanarySettings, now: float) -> Health:
    clean = result.outcome is Outcome.ISOLATED
    shapes = [*health.canary_shapes, result.shape] if result.shape else list(health.canary_shapes)
    changed = dataclasses.replace(
        health,
        canary=result.outcome.value,
        canary_at=now,
        canary_reason=result.reason,
        canary_id=result.round_id,
        canary_by=result.by,
        canary_shapes=shapes[-RECENT_SHAPES:],
        counter=result.counter or health.counter,
        rounds=health.rounds + 1,
        clean_streak=health.clean_streak + 1 if clean else 0,
        triggered=health.triggered + (result.trigger == "tenant"),
    )
    if result.outcome is Outcome.SHARED:
        changed = dataclasses.replace(changed, violations=_violation(health, "canary"))
        return quarantine(changed, settings, f"canary: {result.reason}", now)
    if changed.quarantined and changed.clean_streak >= settings.clean_rounds:
        return release(changed)
    return changed


def after_marker(health: Health, settings: CanarySettings | None, now: float) -> Health:
    """A live canary marker in a tenant's answer: content only a canary prompt carried."""
    changed = dataclasses.replace(health, violations=_violation(health, "marker"), clean_streak=0)
    return quarantine(changed, settings, "marker violation in an answer", now)


def after_finding(health: Health) -> Health:
    """A detective finding (an attributed hit): counted; the round it triggers decides."""
    return dataclasses.replace(health, violations=_violation(health, "detective"))


def quarantine(health: Health, settings: CanarySettings | None, reason: str, now: float) -> Health:
    if settings is not None and settings.on_shared is OnShared.ALERT:
        return health
    if health.quarantined:
        return dataclasses.replace(health, clean_streak=0)
    return dataclasses.replace(
        health, quarantined=True, quarantine_reason=reason, quarantined_at=now, clean_streak=0
    )


def release(health: Health) -> Health:
    return dataclasses.replace(health, quarantined=False, quarantine_reason="", quarantined_at=0.0)
