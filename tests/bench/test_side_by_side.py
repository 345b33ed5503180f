"""The backend side-by-side harness: the hog it runs beside, and the goals it judges."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator

import pytest

from bench.backend_side_by_side import judge, parse_args, start_all
from bench.hog import cpu_hog
from bench.targets import Target


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_hog_keeps_one_busy_process_per_core_and_leaves_none_behind() -> None:
    before = _children()
    with cpu_hog(2) as count:
        hogs = _children() - before
        assert count == 2 and len(hogs) == 2
        deadline = time.monotonic() + 60  # a loaded host gives them little, but never nothing
        while not all(_cpu_s(pid) > 0.2 for pid in hogs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_cpu_s(pid) > 0.2 for pid in hogs)  # busy, not asleep
    assert not (_children() - before)


def test_no_hog_starts_nothing() -> None:
    before = _children()
    with cpu_hog(0) as count:
        assert count == 0 and _children() == before


def test_the_hog_stops_when_the_work_fails() -> None:
    before = _children()
    with pytest.raises(RuntimeError), cpu_hog(1):
        raise RuntimeError("the run failed")
    assert not (_children() - before)


def _row(target: str, streams: int, prefix: str, rate: float, ttft: float) -> dict[str, object]:
    return {"target": target, "streams": streams, "prefix": prefix, "tokens_per_s": rate,
            "ttft_p50_s": ttft}  # fmt: skip


def test_goals_are_judged_per_cell_against_vllm_and_the_roofline_at_sixty_percent() -> None:
    rows = [
        _row("ours", 8, "miss", 150.0, 1.0), _row("vllm", 8, "miss", 100.0, 2.0),
        _row("ours", 8, "hit", 140.0, 0.1), _row("vllm", 8, "hit", 100.0, 1.0),
    ]  # fmt: skip
    verdict = judge(rows, "ours", "vllm", {"decode_share_of_roofline_best": 0.6})
    assert [c["tokens_per_s_ratio"] for c in verdict["cells"]] == [1.4, 1.5]
    assert not verdict["tokens_per_s_8_streams_met"]  # the hit cell's 1.4x misses 1.5x
    assert verdict["first_token_met"] and verdict["roofline_met"]
    below = judge(rows, "ours", "vllm", {"decode_share_of_roofline_best": 0.59})
    assert not below["roofline_met"]


def test_the_hog_is_off_unless_asked() -> None:
    assert not parse_args(["--label", "x"]).hog
    assert parse_args(["--label", "x", "--hog"]).hog


@pytest.mark.parametrize("reverse", [False, True])
def test_servers_start_in_the_order_asked_and_stop_in_reverse(reverse: bool) -> None:
    """On a shared VM the server started first has run slower: a run can start vLLM first."""
    events: list[str] = []

    def starter(name: str) -> Callable[[], contextlib.AbstractContextManager[Target]]:
        @contextlib.contextmanager
        def start() -> Iterator[Target]:
            events.append(f"start {name}")
            yield Target(name, f"http://{name}", "smollm2")
            events.append(f"stop {name}")

        return start

    names = ["ours", "before", "vllm"]
    with contextlib.ExitStack() as stack:
        targets = start_all(stack, [starter(n) for n in names], reverse)
        assert [t.name for t in targets] == names  # the rows keep their order
    order = names[::-1] if reverse else names
    assert events == [f"start {n}" for n in order] + [f"stop {n}" for n in order[::-1]]


def test_start_reversed_is_off_unless_asked() -> None:
    assert not parse_args(["--label", "x"]).start_reversed
    assert parse_args(["--label", "x", "--start-reversed"]).start_reversed
