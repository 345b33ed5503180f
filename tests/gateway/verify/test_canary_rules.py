"""A canary round's outcome and what it does to a backend's health (pure rules)."""

from __future__ import annotations

import pytest

from gateway.fleet.local_health import Health
from gateway.policy.backend_model import CanarySettings, OnShared
from gateway.verify import quarantine
from gateway.verify.canary import Result, Sample, decide
from kvfence.probe.client import Observation
from kvfence.probe.outcome import Outcome


def obs(ttft: float, cached: int | None) -> Observation:
    return Observation(ttft, cached, 300, 1)


def sample(
    a1: tuple[float, int | None], a2: tuple[float, int | None], b: tuple[float, int | None]
) -> Sample:
    return Sample(obs(*a1), obs(*a2), obs(*b))


@pytest.mark.parametrize(
    ("samples", "outcome"),
    [
        ([sample((0.5, 0), (0.1, 256), (0.5, 0))], Outcome.ISOLATED),
        ([sample((0.5, 0), (0.1, 256), (0.1, 256))], Outcome.SHARED),
        ([sample((0.5, 0), (0.5, 0), (0.5, 0))], Outcome.INCONCLUSIVE),  # caching off
        ([sample((0.5, None), (0.1, None), (0.5, None))] * 4, Outcome.ISOLATED),
        ([sample((0.5, None), (0.1, None), (0.12, None))] * 4, Outcome.SHARED),
        ([sample((0.5, None), (0.48, None), (0.5, None))] * 4, Outcome.INCONCLUSIVE),
        ([sample((0.5, None), (0.1, None), (0.3, None))] * 4, Outcome.INCONCLUSIVE),
    ],
)
def test_only_a_passing_control_and_a_clear_miss_is_isolated(
    samples: list[Sample], outcome: Outcome
) -> None:
    assert decide(samples)[0] is outcome


def result(outcome: Outcome) -> Result:
    return Result("b", "m", outcome, "why", "cached_tokens", 3)


def test_shared_quarantines_and_clean_rounds_release() -> None:
    settings = CanarySettings(clean_rounds=2)
    health = quarantine.after_round(Health(), result(Outcome.SHARED), settings, 10.0)
    assert health.quarantined and health.violations == {"canary": 1}
    health = quarantine.after_round(health, result(Outcome.ISOLATED), settings, 20.0)
    health = quarantine.after_round(health, result(Outcome.INCONCLUSIVE), settings, 30.0)
    assert health.quarantined and health.clean_streak == 0  # inconclusive is never clean
    health = quarantine.after_round(health, result(Outcome.ISOLATED), settings, 40.0)
    assert health.quarantined
    health = quarantine.after_round(health, result(Outcome.ISOLATED), settings, 50.0)
    assert not health.quarantined and health.rounds == 5


def test_alert_mode_records_but_does_not_quarantine() -> None:
    settings = CanarySettings(on_shared=OnShared.ALERT)
    health = quarantine.after_round(Health(), result(Outcome.SHARED), settings, 1.0)
    assert not health.quarantined and health.canary == "shared"
    health = quarantine.after_violation(health, "marker", settings, 2.0)
    assert not health.quarantined and health.violations == {"canary": 1, "marker": 1}
