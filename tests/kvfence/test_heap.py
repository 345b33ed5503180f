"""The collector around a server's start-up: off while it loads, its garbage collected and what
lives on frozen once it is ready, and nothing left switched off by a command that stops early."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from kvfence import heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A garbage cycle, reachable only by the weak reference returned."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    was_on = gc.isenabled()
    yield
    gc.unfreeze()
    if was_on:
        gc.enable()


def test_loading_holds_the_collector_off_and_gives_it_back() -> None:
    assert gc.isenabled()
    with heap.loading():
        assert not gc.isenabled()
        dead = _cycle()
        gc.collect(0)  # an explicit collection still runs; only the automatic ones stop
        assert dead() is None
    assert gc.isenabled()


def test_a_command_that_fails_while_loading_leaves_the_collector_on() -> None:
    with pytest.raises(RuntimeError), heap.loading():
        raise RuntimeError("the policy does not load")
    assert gc.isenabled()


def test_loading_leaves_a_collector_that_was_off_off() -> None:
    gc.disable()
    with heap.loading():
        pass
    assert not gc.isenabled()


def test_loaded_collects_what_loading_left_and_freezes_the_rest() -> None:
    kept = _Node()
    with heap.loading():
        dead = _cycle()
        heap.loaded()
        assert gc.isenabled()  # from the moment it serves, inside the loading block or not
    assert dead() is None  # collected, never frozen for life
    assert gc.get_freeze_count() > 0
    assert all(o is not kept for o in gc.get_objects())  # frozen: no collection walks it


def test_forking_freezes_without_collecting_and_the_parent_collects_after() -> None:
    with heap.loading():
        left = _cycle()
        with heap.forking():
            assert gc.get_freeze_count() > 0
            assert not gc.isenabled()  # a worker forked here loads with it off
        assert gc.isenabled()
    assert left() is not None  # frozen as it was: no collection freed holes in shared pages
    gc.unfreeze()
    gc.collect()
    assert left() is None
