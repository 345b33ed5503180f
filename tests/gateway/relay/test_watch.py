"""The stream's one deadline (`gateway.relay.watch.Watch`): a wait past its deadline ends in
TimeoutError, never before it; later waits move the deadline without a timer each; a
cancellation it did not cause stays a cancellation; no timer outlives the answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.relay.watch import Watch
from tests.kit.gateway import Gateway
from tests.kit.polling import until

MSG = [{"role": "user", "content": "hi"}]
SLACK_S = 1e-3  # a loop may run a timer up to its clock's resolution early


def live_timers(loop: asyncio.AbstractEventLoop) -> list[asyncio.TimerHandle]:
    """The loop's pending timers that belong to a Watch (asyncio's own loop keeps them here)."""
    scheduled: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]
    return [
        h
        for h in scheduled
        if not h.cancelled() and isinstance(getattr(h._callback, "__self__", None), Watch)  # type: ignore[attr-defined]
    ]


@pytest.fixture
async def timers_set(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The loop times every Watch timer is set for, from now on."""
    loop = asyncio.get_running_loop()
    calls: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        if isinstance(getattr(callback, "__self__", None), Watch):
            calls.append(when)
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_at", counting)
    return calls


async def test_a_wait_past_its_deadline_ends_in_timeout_and_not_before() -> None:
    loop, watch = asyncio.get_running_loop(), Watch()
    start = loop.time()
    with pytest.raises(TimeoutError), watch.within(0.05):
        await asyncio.sleep(10)
    assert loop.time() >= start + 0.05 - SLACK_S
    assert loop.time() < start + 5


async def test_a_wait_done_in_time_keeps_its_result_and_the_task_is_not_cut_later() -> None:
    watch = Watch()
    with watch.within(0.05):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # the timer fires now, outside any wait: nothing to cut
    with watch.within(0.05):
        await asyncio.sleep(0)  # and the watch still works
    watch.close()


async def test_waits_move_the_deadline_on_without_a_timer_each(timers_set: list[float]) -> None:
    calls = timers_set
    watch = Watch()
    for _ in range(50):
        with watch.within(10):
            await asyncio.sleep(0)
    assert len(calls) == 1  # one timer for fifty waits
    for _ in range(6):  # 0.2 s of waits, each well within its own 0.1 s
        with watch.within(0.1):
            await asyncio.sleep(0.035)
    watch.close()


async def test_a_watch_told_its_shortest_wait_sets_one_timer_for_a_long_then_short_waits(
    timers_set: list[float],
) -> None:
    """An answer: the upstream call may take 600 s, each read after it 0.1 s."""
    loop, calls = asyncio.get_running_loop(), timers_set
    watch = Watch(shortest_s=0.1)
    with watch.within(600):
        await asyncio.sleep(0)
    for _ in range(3):
        with watch.within(0.1):
            await asyncio.sleep(0)
    assert len(calls) == 1  # the first timer was set early enough for the reads
    start = loop.time()
    with pytest.raises(TimeoutError), watch.within(0.1):  # and a read past it still times out
        await asyncio.sleep(10)
    assert start + 0.1 - SLACK_S <= loop.time() < start + 5
    watch.close()


async def test_a_long_first_wait_outlasts_the_early_first_timer() -> None:
    loop, watch = asyncio.get_running_loop(), Watch(shortest_s=0.02)
    start = loop.time()
    with watch.within(0.2):  # the timer fires at 0.02 s and is set again for 0.2 s
        await asyncio.sleep(0.1)
    with pytest.raises(TimeoutError), watch.within(0.05):
        await asyncio.sleep(10)
    assert loop.time() >= start + 0.15 - SLACK_S
    watch.close()


async def test_a_shorter_deadline_after_a_longer_one_still_holds() -> None:
    loop, watch = asyncio.get_running_loop(), Watch()
    with watch.within(30):  # a read: the timer is set 30 s ahead
        await asyncio.sleep(0)
    start = loop.time()
    with pytest.raises(TimeoutError), watch.within(0.05):  # then a write may take 0.05 s
        await asyncio.sleep(10)
    assert start + 0.05 - SLACK_S <= loop.time() < start + 5
    watch.close()


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def waits(deadline_s: float, leaves: bool) -> None:
        watch = Watch()
        if leaves:  # the client leaves in the same turn of the loop as the deadline passes
            asyncio.get_running_loop().call_soon(asyncio.current_task().cancel)  # type: ignore[union-attr]
        with watch.within(deadline_s):
            await asyncio.sleep(10)

    with pytest.raises(TimeoutError):  # the deadline alone: a timeout
        await asyncio.create_task(waits(0, leaves=False))
    for deadline_s in (0, 10):  # with and without the timer firing beside it
        task = asyncio.create_task(waits(deadline_s, leaves=True))
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()


async def test_no_timer_is_left_once_closed() -> None:
    loop, watch = asyncio.get_running_loop(), Watch()
    with watch.within(10):
        await asyncio.sleep(0)
    assert len(live_timers(loop)) == 1
    watch.close()
    assert live_timers(loop) == []


async def test_no_timer_is_left_after_a_stream_or_a_plain_answer(gw: Gateway) -> None:
    loop = asyncio.get_running_loop()
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG, "stream": True})
    assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    await until(lambda: not live_timers(loop), what="no watch timer after the stream")
    resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
    assert resp.status == 200
    await resp.read()
    await until(lambda: not live_timers(loop), what="no watch timer after the plain answer")
