"""A canary round's decision and what it does to a backend's health (pure rules), and the timing
mode's error rates on simulated servers: a jittery healthy one whose load follows A's sends
never says `shared`; a sharing one whose count lies is found within the stated requests."""

from __future__ import annotations

import random

import pytest

from gateway.fleet.local_health import Health
from gateway.policy.backend_model import CanarySettings, OnShared
from gateway.verify import quarantine
from gateway.verify.canary import ABSENT, COLD_HITS, HONEST, SILENT, Result, Sample, decide
from gateway.verify.sends import Sent
from gateway.verify.shapes import Shape
from gateway.verify.timing import config, most_requests
from kvfence.probe.client import Identity
from kvfence.probe.method import run_probe
from kvfence.probe.outcome import Outcome
from kvfence.probe.prompts import PromptFactory
from tests.kit.simulated_timing import SimulatedServer


def sent(cached: int | None, tiers: tuple[tuple[str, int], ...] = ()) -> Sent:
    return Sent(0.1, cached, 300, tiers)


@pytest.mark.parametrize(
    ("first", "repeat", "other", "outcome", "counter"),
    [
        (sent(0), sent(256), sent(0), Outcome.ISOLATED, HONEST),
        (sent(0), sent(256), sent(256), Outcome.SHARED, HONEST),
        (sent(0), sent(256), sent(0, (("device", 0), ("host", 256))), Outcome.SHARED, HONEST),
        (sent(0), sent(0), sent(0), None, SILENT),  # caching off, or a count that lies
        (sent(None), sent(None), sent(None), None, ABSENT),
        (sent(299), sent(299), sent(299), None, COLD_HITS),  # disaggregated prefill
    ],
)
def test_the_count_decides_only_when_it_can(
    first: Sent, repeat: Sent, other: Sent, outcome: Outcome | None, counter: str
) -> None:
    got, reason, learned = decide(Sample(first, repeat, other))
    assert (got, learned) == (outcome, counter)
    if other.tiers:
        assert "host 256" in reason  # per tier: the offload tier's hit is named


def result(outcome: Outcome, trigger: str = "schedule") -> Result:
    return Result("b", "m", outcome, "why", "cached_tokens", 3, "r1", "chat/plain/1m/64t",
                  HONEST, trigger)  # fmt: skip


def test_shared_quarantines_and_clean_rounds_release() -> None:
    settings = CanarySettings(clean_rounds=2)
    health = quarantine.after_round(Health(), result(Outcome.SHARED), settings, 10.0)
    assert health.quarantined and health.violations == {"canary": 1}
    health = quarantine.after_round(health, result(Outcome.ISOLATED), settings, 20.0)
    health = quarantine.after_round(health, result(Outcome.INCONCLUSIVE), settings, 30.0)
    assert health.quarantined and health.clean_streak == 0  # inconclusive is never clean
    health = quarantine.after_round(health, result(Outcome.ISOLATED, "tenant"), settings, 40.0)
    assert health.quarantined
    health = quarantine.after_round(health, result(Outcome.ISOLATED), settings, 50.0)
    assert not health.quarantined and health.rounds == 5 and health.triggered == 1
    assert health.canary_id == "r1" and list(health.canary_shapes) == ["chat/plain/1m/64t"] * 5


def test_a_marker_quarantines_a_detective_finding_does_not() -> None:
    settings = CanarySettings()
    health = quarantine.after_finding(Health())
    assert not health.quarantined and health.violations == {"detective": 1}
    health = quarantine.after_marker(health, settings, 2.0)
    assert health.quarantined and health.violations == {"detective": 1, "marker": 1}


def test_alert_mode_records_but_does_not_quarantine() -> None:
    settings = CanarySettings(on_shared=OnShared.ALERT)
    health = quarantine.after_round(Health(), result(Outcome.SHARED), settings, 1.0)
    assert not health.quarantined and health.canary == "shared"
    health = quarantine.after_marker(health, settings, 2.0)
    assert not health.quarantined and health.violations == {"canary": 1, "marker": 1}


SETTINGS = CanarySettings()
SHAPE = Shape("/v1/chat/completions", True, 1, 64)


async def test_timing_never_says_shared_on_a_jittery_healthy_server() -> None:
    a, b = Identity("A"), Identity("B")
    outcomes = []
    for seed in range(120):
        server = SimulatedServer(seed)
        factory = PromptFactory(64, random.Random(seed))
        probe = await run_probe(server.send, a, b, config(SETTINGS, SHAPE), prompts=factory,
                                rng=random.Random(seed))  # fmt: skip
        outcomes.append(probe.decision.outcome)
        assert server.requests <= most_requests(SETTINGS)
    assert Outcome.SHARED not in outcomes
    assert outcomes.count(Outcome.ISOLATED) > len(outcomes) // 2  # mostly with the power


async def test_timing_finds_a_sharing_server_whose_count_lies() -> None:
    a, b = Identity("A"), Identity("B")
    for seed in range(10):
        server = SimulatedServer(seed, shared=True)
        factory = PromptFactory(64, random.Random(seed))
        probe = await run_probe(server.send, a, b, config(SETTINGS, SHAPE), prompts=factory,
                                rng=random.Random(seed))  # fmt: skip
        assert probe.decision.outcome is Outcome.SHARED
        assert server.requests <= most_requests(SETTINGS)
