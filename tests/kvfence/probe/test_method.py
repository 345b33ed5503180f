"""The whole procedure against simulated endpoints: a pooled cache is `shared` (by the counter
at once, by timing alone within 20 per arm), separate caches are `isolated` only with a passing
control and enough power, and an endpoint without a cache signal is never `isolated`."""

from __future__ import annotations

import random

import pytest

from kvfence.probe.client import Identity
from kvfence.probe.method import ProbeConfig, ProbeResult, run_probe
from kvfence.probe.outcome import Outcome
from kvfence.probe.prompts import PromptFactory
from kvfence.probe.rounds import Arm, Phase
from tests.kvfence.probe.sim import SimCache, SimEndpoint, pooled

A, B = Identity("A", key="sk-a"), Identity("B", key="sk-b")
SMALL = ProbeConfig(letters=96, partial_letters=32, budget=40, control_rounds=10)


async def probe(sim: SimEndpoint, config: ProbeConfig = SMALL, seed: int = 1) -> ProbeResult:
    rng = random.Random(seed)
    prompts = PromptFactory(config.letters, random.Random(seed + 1))
    return await run_probe(sim, A, B, config, rng=rng, prompts=prompts)


async def test_pooled_cache_is_shared_by_the_counter_after_one_round() -> None:
    result = await probe(SimEndpoint(scope=pooled))
    assert result.decision.outcome is Outcome.SHARED
    assert result.rounds == 1
    assert result.metadata.control_passed and result.metadata.cross_hits == 1
    assert result.decision.exit_code == 1


async def test_pooled_cache_is_shared_by_timing_alone_within_20_per_arm() -> None:
    for seed in range(5):
        result = await probe(SimEndpoint(scope=pooled, report=False), seed=seed)
        assert result.decision.outcome is Outcome.SHARED
        assert not result.metadata.available
        assert result.timing.shared and result.rounds <= 20


async def test_timing_only_ignores_the_counter() -> None:
    config = ProbeConfig(letters=96, partial_letters=32, budget=40, use_metadata=False)
    result = await probe(SimEndpoint(scope=pooled), config)
    assert result.decision.outcome is Outcome.SHARED
    assert result.timing.shared and not result.metadata.available
    assert result.rounds >= 15  # the counter would have said so after one round


async def test_separate_caches_are_isolated_with_control_and_power() -> None:
    result = await probe(SimEndpoint())
    assert result.decision.outcome is Outcome.ISOLATED
    assert result.rounds == SMALL.budget  # isolation is only claimed at the full budget
    assert result.metadata.control_passed and result.timing.control_passed
    power = result.decision.timing_power
    assert power is not None and power.power >= 0.9
    # the chat template's block is cached for B too: the baseline keeps it from counting
    assert all(
        m.cached_tokens == 16
        for m in result.measurements
        if m.phase is Phase.CROSS and m.arm is Arm.MISS
    )
    assert result.metadata.cross_excess == (0,) * SMALL.budget


async def test_isolated_without_a_counter_says_timing_only() -> None:
    result = await probe(SimEndpoint(report=False))
    assert result.decision.outcome is Outcome.ISOLATED
    assert any("timing only" in reason for reason in result.decision.reasons)


@pytest.mark.parametrize("report", [True, False])
async def test_caching_off_is_inconclusive_and_spends_no_cross_rounds(report: bool) -> None:
    result = await probe(SimEndpoint(SimCache(caching=False), report=report))
    assert result.decision.outcome is Outcome.INCONCLUSIVE
    assert result.decision.exit_code == 2
    assert "positive control failed" in result.decision.reasons[0]
    assert result.rounds == 0


async def test_prompts_shorter_than_a_block_are_inconclusive() -> None:
    sim = SimEndpoint(SimCache(block=256, template=0))
    result = await probe(sim, ProbeConfig(letters=96, partial_letters=32, budget=40))
    assert result.decision.outcome is Outcome.INCONCLUSIVE


async def test_too_small_a_budget_is_inconclusive_and_names_one_that_would_do() -> None:
    result = await probe(SimEndpoint(report=False), ProbeConfig(letters=96, budget=20))
    assert result.decision.outcome is Outcome.INCONCLUSIVE
    power = result.decision.timing_power
    assert power is not None and power.power < 0.9 and power.budget_needed is not None
    assert f"--budget {power.budget_needed}" in result.decision.reasons[0]


async def test_partial_arm_catches_a_server_that_shares_only_short_prefixes() -> None:
    class ShortPrefixesShared(SimCache):
        """Scopes its cache per credential from the third block on (a salt applied late)."""

        def answer(self, namespace: str, text: str) -> tuple[float, int, int]:
            _, cached, prompt = super().answer("everyone", text)
            own_ttft, own, _ = super().answer(namespace, text)
            return own_ttft, max(own, min(cached, 2 * self.block)), prompt

    result = await probe(SimEndpoint(ShortPrefixesShared()))
    assert result.decision.outcome is Outcome.SHARED
    assert result.metadata.partial_hits >= 1


FAST_NULL = ProbeConfig(
    letters=24,
    partial_letters=0,
    budget=20,
    control_rounds=4,
    alpha=0.05,
    control_alpha=0.2,
    use_metadata=False,
)


async def test_whole_procedure_false_shared_rate_within_alpha() -> None:
    """Isolated endpoint, timing alone, alpha 0.05: at most 5% of runs may say shared."""
    runs = 300
    shared = tested = 0
    for seed in range(runs):
        sim = SimEndpoint(SimCache(block=8, template=0, rng=random.Random(seed)))
        result = await probe(sim, FAST_NULL, seed)
        shared += result.decision.outcome is Outcome.SHARED
        tested += result.rounds > 0
    assert tested >= 0.95 * runs  # the control passed: these runs really tested B
    assert shared / runs <= 0.05


async def test_the_false_shared_check_can_fail() -> None:
    """The same simulation counts a pooled cache as shared nearly every time."""
    shared = 0
    for seed in range(20):
        sim = SimEndpoint(SimCache(block=8, template=0, rng=random.Random(seed)), scope=pooled)
        shared += (await probe(sim, FAST_NULL, seed)).decision.outcome is Outcome.SHARED
    assert shared >= 19


async def test_a_noisy_control_extends_the_cross_phase_up_to_the_maximum_budget() -> None:
    # Noise of the same size as the cache's effect: 10 rounds per arm lack the power, so the
    # probe plans more from the control (never past the maximum) instead of ending inconclusive.
    noisy = SimCache(per_token_s=0.0004, noise_s=0.015)
    fixed = ProbeConfig(letters=96, partial_letters=32, budget=10, control_rounds=12)
    short = await probe(SimEndpoint(cache=noisy), fixed, seed=3)
    assert short.rounds == 10 and short.decision.outcome is Outcome.INCONCLUSIVE
    noisy = SimCache(per_token_s=0.0004, noise_s=0.015)
    extended = ProbeConfig(
        letters=96, partial_letters=32, budget=10, max_budget=75, control_rounds=12
    )
    longer = await probe(SimEndpoint(cache=noisy), extended, seed=3)
    assert 10 < longer.rounds <= 75 and longer.schedule.budget == longer.rounds
    assert longer.decision.outcome is Outcome.ISOLATED


async def test_a_clear_control_keeps_the_budget_even_with_a_maximum() -> None:
    config = ProbeConfig(letters=96, partial_letters=32, budget=40, max_budget=75)
    result = await probe(SimEndpoint(), config)
    assert result.rounds == 40 and result.decision.outcome is Outcome.ISOLATED


def test_a_maximum_below_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="maximum budget"):
        ProbeConfig(budget=40, max_budget=20).check()
