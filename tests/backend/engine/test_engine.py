"""The engine end to end over a FakeRunner: isolation, hits, zeroing, provenance, stops, stats."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from backend.engine.engine import Engine, EngineConfig, StepOutput
from backend.engine.plan import PrefillPolicy, SamplingParams
from backend.engine.pool_check import IntegrityError
from backend.engine.scheduler import OverCapacity
from kvfence.capability import Namespace, _mint
from tests.backend.engine.fake_runner import FakeRunner
from tests.kit.leaky_engine import LeakyEngine

A = _mint("tenant-a")
B = _mint("tenant-b")
C = _mint("tenant-c")
EOS = 0


def make_engine(leaky: bool = False, **overrides: object) -> tuple[Engine, FakeRunner]:
    config = dataclasses.replace(EngineConfig(num_blocks=16, block_size=4), **overrides)  # type: ignore[arg-type]
    runner = FakeRunner(config.num_blocks, config.block_size)
    return (LeakyEngine if leaky else Engine)(runner, config), runner


def run(engine: Engine, seq_id: int) -> list[StepOutput]:
    """Step until seq_id finishes; its outputs in order."""
    outs: list[StepOutput] = []
    for _ in range(500):
        outs += [o for o in engine.step() if o.seq_id == seq_id]
        if outs and outs[-1].finished:
            return outs
    raise AssertionError("the sequence never finished")


PROMPT = list(range(100, 111))  # 11 tokens: two whole blocks of 4 can hit
GREEDY = SamplingParams(max_tokens=5)


def test_repeat_in_one_namespace_hits_whole_blocks_and_another_namespace_never_does() -> None:
    engine, runner = make_engine()
    first = run(engine, engine.add(A, PROMPT, GREEDY))
    again = run(engine, engine.add(A, PROMPT, GREEDY))
    other = run(engine, engine.add(B, PROMPT, GREEDY))
    assert first[0].cached_tokens == 0
    assert again[0].cached_tokens == 8
    assert other[0].cached_tokens == 0
    assert again[0].block_namespaces == frozenset({A})
    assert other[0].block_namespaces == frozenset({B})
    assert all(o.cached_tokens is None for o in again[1:])
    # the hit changed nothing the user sees
    expected = runner.reference(PROMPT, 5, frozenset())
    for outs in (first, again, other):
        assert [o.token_id for o in outs] == expected
    # and the prefill after the hit only computed the uncached tail
    chunk = next(c for p in runner.plans for c in p.chunks if c.seq_id == again[0].seq_id)
    assert chunk.start == 8 and chunk.token_ids == tuple(PROMPT[8:])
    stats = engine.stats()
    assert (stats.prompt_tokens, stats.hit_tokens) == (33, 8)


@pytest.mark.parametrize("zero", [True, False])
def test_blocks_taken_from_another_namespace_are_zeroed_first(zero: bool) -> None:
    engine, runner = make_engine(num_blocks=4, zero_on_reuse=zero)
    run(engine, engine.add(A, list(range(12)), SamplingParams(max_tokens=1)))
    seq = engine.add(B, list(range(50, 62)), SamplingParams(max_tokens=1))
    run(engine, seq)
    plan = next(p for p in runner.plans if p.chunks[0].seq_id == seq)
    if zero:
        assert plan.zero_blocks and set(plan.zero_blocks) <= set(plan.chunks[0].block_table)
    else:
        assert plan.zero_blocks == ()


def test_a_foreign_block_is_reported_from_block_metadata() -> None:
    engine, _ = make_engine(leaky=True)
    run(engine, engine.add(A, PROMPT, GREEDY))
    seq = engine.add(B, [7] * 11, GREEDY)
    first = engine.step()[0]
    assert first.seq_id == seq
    assert first.block_namespaces == frozenset({A, B})
    with pytest.raises(IntegrityError, match="two namespaces"):
        engine.pool.check_integrity()


def test_the_shipped_engine_reports_only_its_own_namespace() -> None:
    engine, _ = make_engine()
    run(engine, engine.add(A, PROMPT, GREEDY))
    outs = run(engine, engine.add(B, [7] * 11, GREEDY))
    assert outs[0].block_namespaces == frozenset({B})
    engine.pool.check_integrity()


def test_abort_frees_blocks_at_once() -> None:
    engine, _ = make_engine()
    seq = engine.add(A, list(range(10)), SamplingParams(max_tokens=100))
    engine.step()
    assert engine.stats().blocks_used == 3
    assert engine.abort(seq)
    stats = engine.stats()
    assert stats.blocks_used == 0 and stats.running == 0 and not engine.has_work()
    assert not engine.abort(seq)
    engine.pool.check_integrity()


def test_stop_conditions() -> None:
    engine, runner = make_engine()
    natural = runner.reference(PROMPT, 50, frozenset())
    stop_at = natural[2]
    outs = run(engine, engine.add(A, PROMPT, SamplingParams(max_tokens=50), [stop_at]))
    cut = natural.index(stop_at) + 1
    assert [o.token_id for o in outs] == natural[:cut]
    assert outs[-1].finish_reason == "stop"
    sampling = SamplingParams(max_tokens=50, stop_token_ids=(stop_at,))
    assert run(engine, engine.add(B, PROMPT, sampling))[-1].finish_reason == "stop"
    outs = run(engine, engine.add(C, [1, 2], SamplingParams(max_tokens=3)))
    assert len(outs) == 3 and outs[-1].finish_reason == "length"
    assert [o.finished for o in outs] == [False, False, True]


def test_finish_from_outside_frees_the_sequence() -> None:
    engine, _ = make_engine()
    seq = engine.add(A, PROMPT, SamplingParams(max_tokens=100))
    engine.step()
    assert engine.finish(seq, "stop")
    assert engine.step() == [] and engine.stats().blocks_used == 0


def test_flush_drops_one_namespace() -> None:
    engine, _ = make_engine()
    run(engine, engine.add(A, PROMPT, GREEDY))
    run(engine, engine.add(B, PROMPT, GREEDY))
    assert engine.flush(A) == 3  # the full blocks of the 15 computed tokens
    assert run(engine, engine.add(A, PROMPT, GREEDY))[0].cached_tokens == 0
    assert run(engine, engine.add(B, PROMPT, GREEDY))[0].cached_tokens == 8


def test_stats_report_namespaces_by_digest() -> None:
    engine, _ = make_engine()
    seq = engine.add(A, list(range(9)), SamplingParams(max_tokens=100))
    engine.add(B, list(range(9)), SamplingParams(max_tokens=100))
    engine.step()
    engine.abort(seq)
    stats = engine.stats()
    assert stats.namespace_blocks == {A.label: 2, B.label: 3}  # A's full blocks stay cached
    assert (stats.blocks_used, stats.blocks_cached, stats.blocks_free) == (3, 2, 11)
    held = {group: n for group, (n, _floor) in stats.group_blocks.items()}
    assert held == {A.group: 2, B.group: 3}  # one capacity group per tenant


def test_bad_requests_are_refused() -> None:
    engine, _ = make_engine(num_blocks=4)
    with pytest.raises(TypeError):
        engine.add("tenant-a", [1], GREEDY)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        engine.add(A, [], GREEDY)
    with pytest.raises(OverCapacity):
        engine.add(A, list(range(17)), GREEDY)
    with pytest.raises(ValueError):
        Engine(FakeRunner(4, 8), EngineConfig(num_blocks=4, block_size=4))


MACHINE_BLOCKS = 10
MACHINE_QUOTA = 6  # blocks: 0.6 of the pool
PROMPTS = [[1000 + i, *range(i, i + n)] for i, n in enumerate([3, 7, 8, 11, 13])]


class EngineMachine(RuleBasedStateMachine):
    """Random add / step / abort / finish / flush across three namespaces."""

    policy: PrefillPolicy = "fill"

    def __init__(self) -> None:
        super().__init__()
        self.engine, self.runner = make_engine(
            num_blocks=MACHINE_BLOCKS,
            max_num_seqs=4,
            max_step_tokens=10,
            max_share=0.6,
            prefill_policy=self.policy,
        )
        self.live: dict[int, tuple[Namespace, list[int], int]] = {}
        self.generated: dict[int, list[int]] = {}
        self.seen: dict[Namespace, set[int]] = {A: set(), B: set(), C: set()}

    @rule(ns=st.sampled_from([A, B, C]), p=st.integers(0, len(PROMPTS) - 1), n=st.integers(1, 10))
    def add(self, ns: Namespace, p: int, n: int) -> None:
        seq = self.engine.add(ns, PROMPTS[p], SamplingParams(max_tokens=n), [EOS])
        self.live[seq] = (ns, PROMPTS[p], n)
        self.generated[seq] = []
        self.seen[ns].add(p)

    @precondition(lambda self: self.engine.has_work())
    @rule()
    def step(self) -> None:
        for out in self.engine.step():
            ns, prompt, n = self.live[out.seq_id]
            if out.cached_tokens is not None:
                self.check_first_output(out, ns, prompt)
            self.generated[out.seq_id].append(out.token_id)
            expected = self.runner.reference(prompt, n, frozenset({EOS}))
            assert self.generated[out.seq_id] == expected[: len(self.generated[out.seq_id])]
            if out.finished:
                del self.live[out.seq_id]

    def check_first_output(self, out: StepOutput, ns: Namespace, prompt: list[int]) -> None:
        assert out.block_namespaces == frozenset({ns})
        assert out.cached_tokens is not None and out.cached_tokens % 4 == 0
        assert out.cached_tokens <= len(prompt) - 1
        if out.cached_tokens:
            assert PROMPTS.index(prompt) in self.seen[ns]

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), external=st.booleans())
    def stop(self, data: st.DataObject, external: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.live)))
        assert self.engine.finish(seq, "stop") if external else self.engine.abort(seq)
        del self.live[seq]

    @rule(ns=st.sampled_from([A, B, C]))
    def flush(self, ns: Namespace) -> None:
        before = self.engine.stats()
        dropped = self.engine.flush(ns)
        after = self.engine.stats()
        others = {d: n for d, n in before.namespace_blocks.items() if d != ns.label}
        assert others == {d: n for d, n in after.namespace_blocks.items() if d != ns.label}
        freed = before.blocks_cached - after.blocks_cached
        assert 0 <= freed <= dropped and after.blocks_free - before.blocks_free == freed
        self.seen[ns] = {PROMPTS.index(p) for n, p, _ in self.live.values() if n == ns}

    @invariant()
    def pool_is_consistent(self) -> None:
        self.engine.pool.check_integrity()
        stats = self.engine.stats()
        assert stats.blocks_used + stats.blocks_free + stats.blocks_cached == MACHINE_BLOCKS
        assert all(n <= MACHINE_QUOTA for n in stats.namespace_blocks.values())
        assert stats.waiting + stats.running == len(self.live)


class WholePromptEngineMachine(EngineMachine):
    """The same properties when prompts that fit a step are never split."""

    policy: PrefillPolicy = "whole"


EngineMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
WholePromptEngineMachine.TestCase.settings = EngineMachine.TestCase.settings
TestEngineMachine = EngineMachine.TestCase
TestWholePromptEngineMachine = WholePromptEngineMachine.TestCase
