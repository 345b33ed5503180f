"""The engine's thread governor: fewer threads while other processes take the host's cores, all
of them again once the cores are free, never outside [1, most]; its own process's work never
counts against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.threads import Reading, ThreadGovernor, read_host, readable


class Host:
    """Counters a test moves by hand, per period: cores' worth of other work and of ours."""

    def __init__(self) -> None:
        self.now = self.busy = self.ours = 0.0

    def read(self) -> Reading:
        return Reading(self.now, self.busy, self.ours)

    def clock(self) -> float:
        return self.now

    def period(self, others: float, ours: float = 1.0, seconds: float = 0.5) -> None:
        self.now += seconds
        self.busy += (others + ours) * seconds
        self.ours += ours * seconds


def governor(
    host: Host, most: int = 2, cores: int = 2, applied: list[int] | None = None
) -> ThreadGovernor:
    sink = applied if applied is not None else []
    return ThreadGovernor(most, sink.append, host.read, cores=cores, clock=host.clock)


def test_other_work_halves_the_count_and_free_cores_bring_it_back() -> None:
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    host.period(others=0.1, ours=2.0)
    gov.after_step()
    assert (gov.threads, applied) == (2, [])
    host.period(others=1.0, ours=1.0)  # another process took a core
    gov.after_step()
    assert (gov.threads, applied) == (1, [1])
    for _ in range(2):  # the core is free, but not yet for long enough
        host.period(others=0.0, ours=1.0)
        gov.after_step()
    assert gov.threads == 1
    host.period(others=0.0, ours=1.0)
    gov.after_step()
    assert (gov.threads, applied) == (2, [1, 2])


def test_its_own_threads_never_count_as_other_work() -> None:
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    for _ in range(20):  # both cores busy, all of it this process (kernels and event loop)
        host.period(others=0.0, ours=2.0)
        gov.after_step()
    assert (gov.threads, applied) == (2, [])


def test_a_busy_host_keeps_one_thread() -> None:
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    for _ in range(20):  # another process keeps a core or more
        host.period(others=1.2, ours=0.8)
        gov.after_step()
    assert (gov.threads, applied) == (1, [1])


def test_free_cores_must_hold_periods_in_a_row() -> None:
    host = Host()
    gov = governor(host)
    host.period(others=1.5)
    gov.after_step()
    for others in (0.0, 0.0, 0.6, 0.0, 0.0):  # a busy period starts the count over
        host.period(others=others)
        gov.after_step()
    assert gov.threads == 1
    host.period(others=0.0)
    gov.after_step()
    assert gov.threads == 2


def test_counts_halve_and_double_within_one_and_most() -> None:
    host, applied = Host(), []
    gov = governor(host, most=8, cores=8, applied=applied)
    for others in (1.0, 5.0, 7.0, 7.5, 7.5):
        host.period(others=others)
        gov.after_step()
    assert applied == [4, 2, 1] and gov.threads == 1
    for _ in range(30):
        host.period(others=0.0)
        gov.after_step()
    assert applied == [4, 2, 1, 2, 4, 8] and gov.threads == 8


def test_doubling_needs_free_cores_for_every_thread_it_adds() -> None:
    host = Host()
    gov = governor(host, most=8, cores=8)
    for others in (1.0, 5.0):
        host.period(others=others)
        gov.after_step()
    assert gov.threads == 2
    for _ in range(10):  # 5 cores taken: 3 free, not room for 4 threads
        host.period(others=5.0)
        gov.after_step()
    assert gov.threads == 2


def test_what_the_host_did_while_the_engine_rested_does_not_count() -> None:
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    host.period(others=0.0, ours=2.0)
    gov.after_step()
    gov.idle()
    host.period(others=2.0, ours=0.0, seconds=5.0)  # another server's turn while ours rests
    gov.after_step()  # the first step after the rest: a new period starts
    host.period(others=0.1, ours=2.0)
    gov.after_step()
    assert (gov.threads, applied) == (2, [])


def test_a_calm_last_look_in_a_rest_brings_every_thread_back_before_the_next_step() -> None:
    """A burst of other work halved the count; the host is calm while the engine rests, so the
    next request (a lone prompt is often a single step) runs on every thread from its start."""
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    host.period(others=1.5, ours=1.0)
    gov.after_step()
    assert gov.threads == 1
    gov.idle()
    host.period(others=0.05, ours=0.0)
    gov.resting()
    gov.resume()
    assert (gov.threads, applied) == (2, [1, 2])


def test_a_busy_last_look_in_a_rest_halves_before_the_next_step() -> None:
    host, applied = Host(), []
    gov = governor(host, most=4, cores=4, applied=applied)
    gov.idle()
    host.period(others=3.5, ours=0.0)  # another process took three and a half of four cores
    gov.resting()
    gov.resume()
    assert (gov.threads, applied) == (1, [1])


def test_only_the_last_look_in_a_rest_counts() -> None:
    """Another server's turn early in the rest says nothing of the cores the next steps find."""
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    gov.idle()
    host.period(others=2.0, ours=0.0, seconds=5.0)
    gov.resting()
    host.period(others=0.0, ours=0.0)
    gov.idle()  # called again while resting: the rest goes on
    gov.resting()
    gov.resume()
    assert (gov.threads, applied) == (2, [])


def test_a_rest_shorter_than_half_a_period_changes_nothing() -> None:
    host, applied = Host(), []
    gov = governor(host, applied=applied)
    gov.idle()
    host.period(others=2.0, ours=0.0, seconds=0.2)
    gov.resting()  # too soon to judge
    gov.resume()
    host.period(others=0.0, ours=2.0)
    gov.after_step()
    assert (gov.threads, applied) == (2, [])


def test_steps_within_a_period_read_nothing() -> None:
    host, reads = Host(), []

    def read() -> Reading:
        reads.append(host.now)
        return host.read()

    gov = ThreadGovernor(2, lambda n: None, read, cores=2, clock=host.clock)
    for _ in range(10):
        host.now += 0.01
        gov.after_step()
    assert len(reads) == 1  # the reading at construction only
    host.now += 0.5
    gov.after_step()
    assert len(reads) == 2


def test_most_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ThreadGovernor(0, lambda n: None, Host().read)


def test_this_host_reports_its_cpu_time_and_this_process() -> None:
    assert readable()
    first = read_host()
    sum(range(2_000_000))
    second = read_host()
    assert second.wall > first.wall and second.ours >= first.ours
    assert second.host_busy >= first.host_busy


def test_a_host_without_proc_is_not_readable(tmp_path: Path) -> None:
    assert not readable(tmp_path)
    (tmp_path / "stat").write_text("cpu  1 2 3 4 5 6 7 8\n")
    assert not readable(tmp_path)  # no /proc/self/stat
