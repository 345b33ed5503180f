"""Public prefixes and request-scoped namespaces in the engine (over a FakeRunner): leading
blocks in a public namespace are shared by every namespace allowed to read it, nothing after them
is, public blocks count against their own group's ceiling, and a request-scoped namespace reuses
nothing and leaves only zeroed blocks behind."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.engine.engine import Engine, EngineConfig, StepOutput
from backend.engine.plan import SamplingParams
from backend.engine.prefix_cache import chain_hashes
from backend.engine.scheduler import OverCapacity
from backend.engine.sequence import Segment
from kvfence.capability import Namespace, _mint
from kvfence.public import PUBLIC_GROUP
from tests.backend.engine.fake_runner import FakeRunner

A = _mint("tenant-a", "group-a", 0.25, 0.0)
B = _mint("tenant-b", "group-b", 0.25, 0.0)
P = _mint("public-ns", PUBLIC_GROUP, 0.5, 0.25)
BS = 4
SYSTEM = list(range(1000, 1010))  # 10 tokens: two whole public blocks and a partial one
ONE = SamplingParams(max_tokens=1)


def make_engine(**overrides: object) -> tuple[Engine, FakeRunner]:
    config = dataclasses.replace(EngineConfig(num_blocks=16, block_size=BS), **overrides)  # type: ignore[arg-type]
    runner = FakeRunner(config.num_blocks, config.block_size)
    return Engine(runner, config), runner


def run(engine: Engine, seq_id: int) -> list[StepOutput]:
    outs: list[StepOutput] = []
    for _ in range(200):
        outs += [o for o in engine.step() if o.seq_id == seq_id]
        if outs and outs[-1].finished:
            return outs
    raise AssertionError("the sequence never finished")


def ask(engine: Engine, ns: Namespace, prompt: list[int], public: int = 2) -> StepOutput:
    segments = (Segment(P, public),) if public else ()
    return run(engine, engine.add(ns, prompt, ONE, public=segments))[0]


def test_two_namespaces_share_the_public_blocks_and_nothing_after_them() -> None:
    engine, runner = make_engine()
    a_prompt, b_prompt = [*SYSTEM, 1, 2, 3, 4, 5], [*SYSTEM, 6, 7, 8, 9, 10]
    assert ask(engine, A, a_prompt).cached_tokens == 0
    b = ask(engine, B, b_prompt)
    assert b.cached_tokens == 2 * BS  # the public blocks, not the partial third one
    assert b.block_namespaces == frozenset({P, B})
    assert b.block_runs == ((P, 2), (B, 2))
    copy = ask(engine, B, a_prompt)  # B sends A's whole prompt: only the public part hits
    assert copy.cached_tokens == 2 * BS
    assert ask(engine, A, a_prompt).cached_tokens == 3 * BS  # its own full blocks are its own
    assert b.token_id == runner.reference(b_prompt, 1, frozenset())[0]
    engine.pool.check_integrity()


def test_without_the_public_segment_nothing_is_shared() -> None:
    engine, _ = make_engine()
    ask(engine, A, [*SYSTEM, 1, 2, 3], public=0)
    assert ask(engine, B, [*SYSTEM, 1, 2, 3], public=0).cached_tokens == 0
    # nor do a namespace's own blocks become public: P never saw these tokens
    assert ask(engine, B, [*SYSTEM, 1, 2, 3]).cached_tokens == 0


@given(st.lists(st.integers(0, 999), min_size=3 * BS, max_size=3 * BS))
def test_a_block_after_a_public_prefix_hashes_under_its_own_namespace(ids: list[int]) -> None:
    def layout(first: Namespace, rest: Namespace) -> list[bytes]:
        return chain_hashes(lambda i: first if i < 2 else rest, ids, BS, [])

    public_a, public_b, plain_a = layout(P, A), layout(P, B), chain_hashes(A, ids, BS, [])
    assert public_a[:2] == public_b[:2]  # the public blocks are one chain
    assert public_a[2] != public_b[2]  # what follows is re-rooted per namespace
    assert not set(public_a) & set(plain_a)  # and never equals the namespace's unshared chain


def test_public_blocks_count_against_their_own_ceiling_not_the_tenants() -> None:
    engine, _ = make_engine()  # A may hold 4 of 16 blocks; P 8
    long = [*range(2000, 2016), *range(50, 58)]  # 6 blocks
    with pytest.raises(OverCapacity):
        engine.add(A, long, ONE)
    out = run(engine, engine.add(A, long, ONE, public=(Segment(P, 4),)))[0]
    assert out.block_runs == ((P, 4), (A, 2))
    held = {ns: n for ns, n in engine.pool.held().items()}
    assert held[P] == 4 and held[A] <= 3
    engine.pool.check_integrity()


def test_segments_must_lie_within_the_prompt_in_namespaces_of_their_own() -> None:
    engine, _ = make_engine()
    for bad in ((Segment(P, 4),), (Segment(P, 0),), (Segment(A, 1),)):
        with pytest.raises(ValueError):
            engine.add(A, list(range(10)), ONE, public=bad)


R = _mint("request-1", "group-a", 0.25, 0.0, ephemeral=True)


def test_a_request_scoped_namespace_reuses_nothing_and_leaves_zeroed_blocks() -> None:
    engine, runner = make_engine()
    prompt = list(range(300, 311))
    first = run(engine, engine.add(R, prompt, SamplingParams(max_tokens=3)))
    again = run(engine, engine.add(R, prompt, SamplingParams(max_tokens=3)))
    assert first[0].cached_tokens == again[0].cached_tokens == 0
    used = {b for p in runner.plans for c in p.chunks for b in c.block_table}
    while engine.has_work():  # the blocks it freed are zeroed without waiting for other work
        engine.step()
    stats = engine.stats()
    assert stats.blocks_cached == 0 and stats.blocks_used == 0
    assert used <= set(runner.zeroed)
    assert all(slot is None for b in used for slot in runner._kv[b])  # nothing of it is left
    with pytest.raises(ValueError):
        engine.add(R, prompt, ONE, public=(Segment(P, 1),))
    engine.pool.check_integrity()
