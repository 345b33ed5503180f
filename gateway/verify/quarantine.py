"""Quarantine rules: how a canary round, a violation or an operator's release changes one
backend's shared health. Pure functions over `Health`.

Invariant: a backend found sharing (or with a violation) is quarantined unless its policy says
`on_shared: alert`; it comes back only after `clean_rounds` isolated rounds in a row, or by an
operator's release. An inconclusive round never counts as clean.
"""

from __future__ import annotations

import dataclasses

from gateway.fleet.local_health import Health
from gateway.policy.backend_model import CanarySettings, OnShared
from gateway.verify.canary import Result
from kvfence.probe.outcome import Outcome


def _violation(health: Health, kind: str) -> dict[str, int]:
    counts = dict(health.violations)
    counts[kind] = counts.get(kind, 0) + 1
    return counts


def after_round(health: Health, result: Result, settings: CanarySettings, now: float) -> Health:
    clean = result.outcome is Outcome.ISOLATED
    changed = dataclasses.replace(
        health,
        canary=result.outcome.value,
        canary_at=now,
        canary_reason=result.reason,
        rounds=health.rounds + 1,
        clean_streak=health.clean_streak + 1 if clean else 0,
    )
    if result.outcome is Outcome.SHARED:
        changed = dataclasses.replace(changed, violations=_violation(health, "canary"))
        return quarantine(changed, settings, f"canary: {result.reason}", now)
    if changed.quarantined and changed.clean_streak >= settings.clean_rounds:
        return release(changed)
    return changed


def after_violation(
    health: Health, kind: str, settings: CanarySettings | None, now: float
) -> Health:
    """A violation found in a tenant's answer (`marker` or `detective`)."""
    changed = dataclasses.replace(health, violations=_violation(health, kind), clean_streak=0)
    return quarantine(changed, settings, f"{kind} violation in an answer", now)


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
