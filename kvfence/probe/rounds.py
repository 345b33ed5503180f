"""The paired procedures of the probe (Gu et al.): a victim primes a fresh prompt, then the
attacker sends either a prompt sharing the victim's prefix (hit arm, or only its first blocks:
partial arm) or a fresh prompt of the same length (miss arm). A round runs one of each arm in
random order.

Invariant: every arm has the same shape (the victim's primes, then exactly one attacker
request of the same length), so under isolation the attacker's timing cannot depend on the arm.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvfence.probe.client import Identity, Observation, Sender
from kvfence.probe.prompts import Prompt, PromptFactory


class Arm(StrEnum):
    HIT = "hit"  # the attacker shares the victim's prefix, all but a short suffix
    MISS = "miss"  # the attacker sends a fresh prompt
    PARTIAL = "partial"  # the attacker shares only the victim's first block or two


class Phase(StrEnum):
    WARMUP = "warmup"  # one fresh request per credential: connections, templates, auth
    CONTROL = "control"  # victim and attacker are both A: the cache must show itself
    CROSS = "cross"  # victim A, attacker B: the test


@dataclass(frozen=True, slots=True)
class Shape:
    letters: int  # prompt length in letters (about tokens)
    shared: int  # letters the hit arm shares with the victim
    partial: int  # letters the partial arm shares (0: no partial arm)
    primes: int = 1  # times the victim sends its prompt first

    def __post_init__(self) -> None:
        if not 0 < self.shared < self.letters:
            raise ValueError("the hit arm must share some but not all letters")
        if not 0 <= self.partial < self.shared:
            raise ValueError("the partial arm must share fewer letters than the hit arm")
        if self.primes < 1:
            raise ValueError("the victim must prime at least once")


@dataclass(frozen=True, slots=True)
class Measurement:
    phase: Phase
    arm: Arm
    victim: str
    attacker: str
    ttft_s: float
    cached_tokens: int | None
    prompt_tokens: int | None
    requests: int  # the procedure's requests (primes included)
    tokens: int  # prompt tokens the procedure spent (reported, else estimated)


def _spent(obs: Observation, prompt: Prompt) -> int:
    return (obs.prompt_tokens if obs.prompt_tokens is not None else prompt.estimated_tokens()) + 1


async def run_procedure(
    send: Sender,
    prompts: PromptFactory,
    shape: Shape,
    phase: Phase,
    arm: Arm,
    victim: Identity,
    attacker: Identity,
) -> Measurement:
    """One procedure of `arm`; the measurement is the attacker's request."""
    target = prompts.fresh()
    tokens = 0
    for _ in range(shape.primes):
        tokens += _spent(await send(victim, target.text), target)
    if arm is Arm.MISS:
        probe = prompts.fresh()
    else:
        probe = prompts.sharing(target, shape.shared if arm is Arm.HIT else shape.partial)
    obs = await send(attacker, probe.text)
    tokens += _spent(obs, probe)
    return Measurement(
        phase,
        arm,
        victim.name,
        attacker.name,
        obs.ttft_s,
        obs.cached_tokens,
        obs.prompt_tokens,
        shape.primes + 1,
        tokens,
    )


async def warm_up(send: Sender, prompts: PromptFactory, identity: Identity) -> Measurement:
    """A fresh request: opens the connection, checks the credential, caches shared template
    blocks (a chat template's system prompt) so later baselines already include them."""
    prompt = prompts.fresh()
    obs = await send(identity, prompt.text)
    return Measurement(
        Phase.WARMUP,
        Arm.MISS,
        identity.name,
        identity.name,
        obs.ttft_s,
        obs.cached_tokens,
        obs.prompt_tokens,
        1,
        _spent(obs, prompt),
    )


def round_arms(rng: random.Random, partial: bool) -> list[Arm]:
    arms = [Arm.HIT, Arm.MISS, *([Arm.PARTIAL] if partial else [])]
    rng.shuffle(arms)
    return arms


async def run_round(
    send: Sender,
    prompts: PromptFactory,
    shape: Shape,
    phase: Phase,
    victim: Identity,
    attacker: Identity,
    rng: random.Random,
    partial: bool = False,
) -> list[Measurement]:
    """One hit and one miss procedure (and a partial one if asked), in random order."""
    return [
        await run_procedure(send, prompts, shape, phase, arm, victim, attacker)
        for arm in round_arms(rng, partial and shape.partial > 0)
    ]


def times(measurements: Sequence[Measurement], phase: Phase, arm: Arm) -> list[float]:
    """The arm's first-token times in measurement order."""
    return [m.ttft_s for m in measurements if m.phase is phase and m.arm is arm]
