"""The probe's procedure: warm-up, positive control (A against A), then cross rounds (A primes,
B probes) with the metadata test after every round and the timing test at the scheduled looks,
stopping at the first evidence of sharing; then the verdict.

Invariant: requests go out one at a time in a fixed shape per arm and a random arm order; the
cross phase only starts after a control has passed, and stops early only on evidence of sharing;
its length is the budget, extended (up to the maximum budget) only on what the control measured.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvfence.probe.client import Identity, Sender
from kvfence.probe.decision import Decision, decide
from kvfence.probe.findings import MetadataFinding, TimingFinding, metadata_finding, timing_finding
from kvfence.probe.power import POWER_TARGET, budget_for, power
from kvfence.probe.prompts import PromptFactory
from kvfence.probe.rounds import Arm, Measurement, Phase, Shape, run_round, times, warm_up
from kvfence.probe.sequential import Schedule, evaluate, plan
from kvfence.probe.stats import TimingTest

Progress = Callable[[Phase, int, int], None]  # phase, rounds done, rounds planned in it


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    letters: int = 1200  # prompt length: several blocks, and over the 1,024 some providers need
    shared_fraction: float = 0.95  # of the letters the hit arm shares (Gu et al.)
    partial_letters: int = 256  # the partial arm shares this many: a block or two
    partial_rounds: int = 4  # cross rounds that also run a partial-prefix procedure
    primes: int = 1
    control_rounds: int = 12  # at 1e-4 the control still passes with 11 of 144 pairs out of order
    budget: int = 50  # cross rounds: the n per arm of the timing test
    max_budget: int | None = None  # up to this many when the control's effect needs more
    alpha: float = 1e-8
    control_alpha: float = 1e-4  # the timing control's level: how rarely no cache passes it
    test: TimingTest = TimingTest.RANK_SUM
    min_effect: float = 0.9
    block_tokens: int = 16  # cached tokens beyond the baseline that count as a hit
    use_metadata: bool = True  # False: timing alone, the counter is ignored

    def shape(self) -> Shape:
        shared = min(self.letters - 1, max(1, round(self.letters * self.shared_fraction)))
        partial = self.partial_letters if 0 < self.partial_letters < shared else 0
        return Shape(self.letters, shared, partial, self.primes)

    def check(self) -> None:
        """Raises ValueError naming the first setting that cannot work."""
        self.shape()
        if self.budget < 1 or self.control_rounds < 2 or self.partial_rounds < 0:
            raise ValueError(
                "the budget must be >= 1, the control needs >= 2 rounds, partial rounds >= 0"
            )
        if self.max_budget is not None and self.max_budget < self.budget:
            raise ValueError("the maximum budget must be at least the budget")
        if not 0 < self.alpha < 0.5 or not 0 < self.control_alpha < 0.5:
            raise ValueError("significance levels must be in (0, 0.5)")
        if not 0 < self.min_effect <= 1:
            raise ValueError("the minimum effect is a share of requests in (0, 1]")
        if self.block_tokens < 1:
            raise ValueError("block tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class ProbeResult:
    config: ProbeConfig
    schedule: Schedule
    measurements: tuple[Measurement, ...]
    metadata: MetadataFinding
    timing: TimingFinding
    decision: Decision
    rounds: int  # cross rounds completed (n per arm)
    elapsed_s: float

    @property
    def requests(self) -> int:
        return sum(m.requests for m in self.measurements)

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.measurements)


class _Run:
    def __init__(self, send: Sender, config: ProbeConfig, progress: Progress | None) -> None:
        self.send, self.config, self.progress = send, config, progress
        self.schedule = plan(config.test, config.alpha, config.budget)
        self.measurements: list[Measurement] = []

    def metadata(self) -> MetadataFinding:
        return metadata_finding(
            self.measurements, self.config.block_tokens, self.config.use_metadata
        )

    def timing(self) -> TimingFinding:
        return timing_finding(self.measurements, self.schedule, self.config.control_alpha)

    def tick(self, phase: Phase, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)

    def sharing_seen(self, rounds: int) -> bool:
        if self.config.use_metadata and self.metadata().shared:
            return True
        look = self.schedule.look_at(rounds)
        if look is None:
            return False
        hit = times(self.measurements, Phase.CROSS, Arm.HIT)
        miss = times(self.measurements, Phase.CROSS, Arm.MISS)
        return evaluate(self.schedule, look, hit, miss).rejected


def cross_schedule(config: ProbeConfig, timing: TimingFinding) -> Schedule:
    """The cross phase's timing schedule: `budget` rounds, or more (up to `max_budget`) when
    the effect the control measured, scaled by `min_effect`, needs more for the target power.
    The control's sends are not part of the cross test, so planning from them leaves its level
    intact; a noisy host then gets more rounds instead of a verdict without power."""
    schedule = plan(config.test, config.alpha, config.budget)
    if config.max_budget is None or config.max_budget <= config.budget:
        return schedule
    assert timing.control_auc is not None
    target = round(0.5 + config.min_effect * (timing.control_auc - 0.5), 4)
    if power(schedule, target) >= POWER_TARGET:
        return schedule
    needed = budget_for(config.test, config.alpha, target) or config.max_budget
    return plan(config.test, config.alpha, min(config.max_budget, needed))


async def run_probe(
    send: Sender,
    a: Identity,
    b: Identity,
    config: ProbeConfig,
    *,
    progress: Progress | None = None,
    rng: random.Random | None = None,
    prompts: PromptFactory | None = None,
) -> ProbeResult:
    """Runs the whole probe against `send`; endpoint errors propagate (`ProbeError`)."""
    config.check()
    started = time.monotonic()
    order = rng if rng is not None else random.SystemRandom()
    factory = prompts if prompts is not None else PromptFactory(config.letters)
    shape, run = config.shape(), _Run(send, config, progress)
    for identity in (a, b, a, b):  # twice each: the second shows the template-cached baseline
        run.measurements.append(await warm_up(send, factory, identity))
    run.tick(Phase.WARMUP, 1, 1)
    for i in range(config.control_rounds):
        run.measurements += await run_round(send, factory, shape, Phase.CONTROL, a, a, order)
        run.tick(Phase.CONTROL, i + 1, config.control_rounds)
    meta, timing = run.metadata(), run.timing()
    rounds = 0
    if timing.control_passed:
        run.schedule = cross_schedule(config, timing)
    if meta.control_passed or (timing.control_passed and run.schedule.looks):
        while rounds < run.schedule.budget:
            partial = rounds < config.partial_rounds
            run.measurements += await run_round(
                send, factory, shape, Phase.CROSS, a, b, order, partial
            )
            rounds += 1
            run.tick(Phase.CROSS, rounds, run.schedule.budget)
            if run.sharing_seen(rounds):
                break
        meta, timing = run.metadata(), run.timing()
    decision = decide(meta, timing, run.schedule, config.min_effect, rounds)
    return ProbeResult(
        config,
        run.schedule,
        tuple(run.measurements),
        meta,
        timing,
        decision,
        rounds,
        time.monotonic() - started,
    )
