"""A simulated server for the timing mode's error rates, in memory (no HTTP): per-identity
prefix caching or one cache for all, first-token times with jitter and with load that follows
A's sends. The verification tests and bench/verify_classes.py both run it."""

from __future__ import annotations

import random

from kvfence.probe.client import Identity, Observation


class SimulatedServer:
    """First-token times of a server with per-identity prefix caching (or one cache for all,
    `shared`): a miss costs 100 ms, a hit 30 ms, plus exponential jitter of 15 ms on average,
    and a request right after one of A's pays 0-40 ms more (load timed against A's sends)."""

    def __init__(self, seed: int, shared: bool = False) -> None:
        self.rng, self.shared = random.Random(seed), shared
        self.cached: set[tuple[str, str]] = set()
        self.after_a = False
        self.requests = 0

    async def send(self, who: Identity, text: str) -> Observation:
        self.requests += 1
        scope = "" if self.shared else who.name
        prefix = text[: len(text) * 9 // 10]  # the probe's hit arm shares 95% of the letters
        hit = (scope, prefix) in self.cached
        self.cached.add((scope, prefix))
        load = self.rng.uniform(0, 0.04) if self.after_a else 0.0
        self.after_a = who.name == "A"
        ttft = (0.03 if hit else 0.1) + self.rng.expovariate(1 / 0.015) + load
        return Observation(ttft, 0, 300, 1)  # the count lies: always 0
