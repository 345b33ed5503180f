"""The engine thread and its thread governor: while the engine rests the governor looks at the
host once a period, and the first step of a request after a rest runs on the count that look
allows: fewer threads beside other work, every thread once the host is calm again."""

from __future__ import annotations

import asyncio
import threading
import time

from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import SamplingParams
from backend.model import LoadedModel
from backend.runner import ModelRunner
from backend.threads import Reading, ThreadGovernor
from backend.worker import EngineWorker
from kvfence.capability import _mint

PERIOD_S = 0.05


class Host:
    """Other processes' work at a rate the test sets (cores' worth), on the real clock."""

    def __init__(self) -> None:
        self.others, self._busy, self._at = 0.0, 0.0, time.monotonic()
        self._lock = threading.Lock()

    def read(self) -> Reading:
        with self._lock:
            now = time.monotonic()
            self._busy += self.others * (now - self._at)
            self._at = now
            return Reading(now, self._busy, 0.0)

    def set(self, others: float) -> None:
        self.read()  # what ran so far ran at the old rate
        self.others = others


async def _answer(worker: EngineWorker, prompt: list[int]) -> None:
    _, outputs = worker.submit(_mint("tenant-a"), prompt, [SamplingParams(max_tokens=2)], ())
    while True:
        item = await asyncio.wait_for(outputs.get(), 60)
        assert not isinstance(item, BaseException), item
        if item[1].finished:
            return


async def test_a_request_after_a_rest_starts_on_the_threads_the_host_has_now(
    tiny_model: LoadedModel,
) -> None:
    engine = Engine(ModelRunner(tiny_model, num_blocks=64), EngineConfig(num_blocks=64))
    host, applied, first_steps = Host(), [], []
    governor = ThreadGovernor(2, applied.append, host.read, cores=2, period_s=PERIOD_S)
    worker = EngineWorker(engine)
    worker.governor = governor
    step, pending = engine.step, [False]

    def counted_step() -> list:  # type: ignore[type-arg]
        if pending[0]:  # the request's first step: what count did it run on?
            first_steps.append(governor.threads)
            pending[0] = False
        return step()

    engine.step = counted_step  # type: ignore[method-assign]
    worker.start()
    try:
        host.set(1.5)  # another process takes one and a half of the two cores
        await asyncio.sleep(PERIOD_S * 10)  # the engine rests: the governor looks
        pending[0] = True
        await _answer(worker, [1, 2, 3, 4])
        host.set(0.0)  # the other work ends while the engine rests
        await asyncio.sleep(PERIOD_S * 10)
        pending[0] = True
        await _answer(worker, [5, 6, 7, 8])
    finally:
        await worker.stop()
    assert first_steps == [1, 2]
    assert applied == [1, 2]
