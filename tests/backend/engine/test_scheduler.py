"""Continuous batching: chunked prefill, joining decodes, cache-skipping prefill, preemption."""

from __future__ import annotations

import itertools

import pytest

from backend.engine.block_pool import BlockPool
from backend.engine.plan import PrefillPolicy, SamplingParams, StepPlan
from backend.engine.scheduler import OverCapacity, Scheduler
from backend.engine.sequence import Sequence, SequenceStatus
from kvfence.capability import Namespace, _mint
from tests.backend.engine.fake_runner import FakeRunner

A = _mint("tenant-a")
B = _mint("tenant-b")
_ids = itertools.count(1)


def make_seq(ns: Namespace, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(
        seq_id=next(_ids),
        namespace=ns,
        token_ids=list(prompt),
        prompt_len=len(prompt),
        sampling=SamplingParams(max_tokens=max_tokens),
        stop_token_ids=frozenset(),
    )


class Harness:
    def __init__(
        self,
        num_blocks: int = 16,
        bs: int = 4,
        budget: int = 64,
        max_num_seqs: int = 8,
        quota: float = 1.0,
        policy: PrefillPolicy = "fill",
    ) -> None:
        self.pool = BlockPool(num_blocks, bs, max_share=quota)
        self.sched = Scheduler(
            self.pool, max_num_seqs=max_num_seqs, max_step_tokens=budget, prefill_policy=policy
        )
        self.runner = FakeRunner(num_blocks, bs)

    def step(self) -> StepPlan:
        plan = self.sched.schedule()
        sampled = self.runner.execute(plan).tokens if plan.chunks else {}
        self.sched.update(plan, sampled)
        self.pool.check_integrity()
        return plan

    def run(self, limit: int = 200) -> None:
        for _ in range(limit):
            if not self.sched.has_work():
                return
            self.step()
        raise AssertionError("the scheduler did not drain")


def test_long_prompt_is_prefilled_in_budget_sized_chunks() -> None:
    h = Harness(budget=8)
    seq = make_seq(A, list(range(20)))
    h.sched.add(seq)
    plans = [h.step() for _ in range(3)]
    chunks = [p.chunks[0] for p in plans]
    assert [(c.start, len(c.token_ids), c.sample) for c in chunks] == [
        (0, 8, False),
        (8, 8, False),
        (16, 4, True),
    ]
    assert seq.num_generated == 1


def test_new_request_joins_the_running_decodes() -> None:
    h = Harness()
    first = make_seq(A, [1, 2, 3], max_tokens=8)
    h.sched.add(first)
    h.step()
    second = make_seq(B, [4, 5, 6, 7, 8])
    h.sched.add(second)
    plan = h.step()
    assert [(c.seq_id, len(c.token_ids)) for c in plan.chunks] == [
        (first.seq_id, 1),
        (second.seq_id, 5),
    ]
    plan = h.step()
    assert [len(c.token_ids) for c in plan.chunks] == [1, 1]  # batched decode


def test_running_set_is_capped_at_max_num_seqs() -> None:
    h = Harness(max_num_seqs=2)
    seqs = [make_seq(A, [i, i + 1]) for i in range(3)]
    for seq in seqs:
        h.sched.add(seq)
    plan = h.step()
    assert {c.seq_id for c in plan.chunks} == {seqs[0].seq_id, seqs[1].seq_id}
    assert h.sched.num_waiting == 1
    h.run()
    assert all(s.status is SequenceStatus.FINISHED for s in seqs)


@pytest.mark.parametrize(("prompt_len", "cached"), [(10, 8), (8, 4), (3, 0)])
def test_prefill_skips_cached_full_blocks(prompt_len: int, cached: int) -> None:
    h = Harness()
    prompt = list(range(100, 100 + prompt_len))
    h.sched.add(make_seq(A, prompt))
    h.run()
    again = make_seq(A, prompt)
    h.sched.add(again)
    chunk = h.step().chunks[0]
    # only whole blocks hit, and the last prompt token is always recomputed
    assert chunk.start == cached and chunk.token_ids == tuple(prompt[cached:])
    assert again.cached_tokens == cached
    other = make_seq(B, prompt)
    h.sched.add(other)
    h.step()
    assert other.cached_tokens == 0


def test_out_of_blocks_preempts_the_newest_and_both_still_finish_correctly() -> None:
    h = Harness(num_blocks=4, bs=4)
    old = make_seq(A, list(range(7)), max_tokens=6)
    new = make_seq(B, list(range(50, 57)), max_tokens=6)
    h.sched.add(old)
    h.sched.add(new)
    h.step()  # both prefilled: 2 blocks each, pool full
    h.step()  # both reach 8 tokens: block boundary next
    h.step()
    assert new.status is SequenceStatus.WAITING and old.status is SequenceStatus.RUNNING
    h.run()
    for seq in (old, new):
        expected = h.runner.reference(seq.token_ids[: seq.prompt_len], 6, frozenset())
        assert seq.token_ids[seq.prompt_len :] == expected


def test_prompt_that_can_never_fit_is_rejected() -> None:
    h = Harness(num_blocks=4, bs=4)
    with pytest.raises(OverCapacity):
        h.sched.add(make_seq(A, list(range(17))))
    h.sched.add(make_seq(A, list(range(16))))  # exactly the pool: accepted
    quota = Harness(num_blocks=4, bs=4, quota=0.5)
    with pytest.raises(OverCapacity):
        quota.sched.add(make_seq(A, list(range(9))))


def test_a_namespace_at_its_quota_does_not_stall_another() -> None:
    h = Harness(num_blocks=8, bs=4, quota=0.5)
    a1 = make_seq(A, list(range(12)), max_tokens=8)
    a2 = make_seq(A, list(range(20, 28)), max_tokens=2)
    b1 = make_seq(B, list(range(40, 44)), max_tokens=2)
    for seq in (a1, a2, b1):
        h.sched.add(seq)
    plan = h.step()
    assert {c.seq_id for c in plan.chunks} == {a1.seq_id, b1.seq_id}
    assert a2.status is SequenceStatus.WAITING
    h.run()
    assert a2.finish_reason == "length"  # ran to its max_tokens once room came


def test_finish_frees_blocks_at_once() -> None:
    h = Harness()
    seq = make_seq(A, list(range(9)), max_tokens=50)
    h.sched.add(seq)
    h.step()
    assert h.pool.num_used == 3
    assert h.sched.finish(seq.seq_id, "abort")
    assert h.pool.num_used == 0 and not h.sched.has_work()
    assert not h.sched.finish(seq.seq_id, "abort")
    h.pool.check_integrity()


def prefill_shape(plan: StepPlan) -> list[tuple[int, int]]:
    """(seq id, tokens) of the plan's prompt chunks (decodes left out)."""
    return [(c.seq_id, len(c.token_ids)) for c in plan.chunks if len(c.token_ids) > 1]


def test_fill_splits_the_next_prompt_and_whole_does_not() -> None:
    """Three 6-token prompts on an 8-token budget: "fill" starts the second prompt in the first
    step (so the first step does more work and the first token comes later); "whole" runs one
    prompt per step, each in one piece."""
    shapes = {}
    for policy in ("fill", "whole"):
        h = Harness(num_blocks=32, budget=8, policy=policy)
        seqs = [make_seq(A, list(range(10 * i, 10 * i + 6)), max_tokens=3) for i in range(3)]
        for seq in seqs:
            h.sched.add(seq)
        a, b, c = (seq.seq_id for seq in seqs)
        shapes[policy] = [prefill_shape(h.step()) for _ in range(3)]
        h.run()
        assert all(s.num_generated == 3 for s in seqs)
        expected = {
            "fill": [[(a, 6), (b, 2)], [(b, 4), (c, 3)], [(c, 3)]],
            "whole": [[(a, 6)], [(b, 6)], [(c, 6)]],
        }
        assert shapes[policy] == expected[policy]


def test_whole_still_chunks_a_prompt_longer_than_the_budget_and_packs_short_ones() -> None:
    h = Harness(num_blocks=32, budget=8, policy="whole")
    long = make_seq(A, list(range(20)), max_tokens=2)
    short = [make_seq(B, [50 + i, 60 + i], max_tokens=2) for i in range(3)]
    for seq in (long, *short):
        h.sched.add(seq)
    s0, s1, s2 = (seq.seq_id for seq in short)
    steps = [prefill_shape(h.step()) for _ in range(4)]
    # The long prompt is chunked; short prompts fill what it leaves, each in one piece.
    assert steps == [
        [(long.seq_id, 8)],
        [(long.seq_id, 8)],
        [(long.seq_id, 4), (s0, 2), (s1, 2)],
        [(s2, 2)],
    ]
    h.run()
    assert long.num_generated == 2 and all(s.num_generated == 2 for s in short)


@pytest.mark.parametrize("policy", ["fill", "whole"])
def test_a_prompt_being_prefilled_never_starves_a_decode(policy: PrefillPolicy) -> None:
    """An older sequence still prefilling (here: added after a newer one started) leaves room
    for the newer sequence's decode in every step."""
    h = Harness(num_blocks=32, budget=8, policy=policy)
    old = make_seq(A, list(range(30)), max_tokens=2)  # the smaller id: earlier in running order
    new = make_seq(B, [90, 91], max_tokens=12)
    h.sched.add(new)
    h.step()
    h.sched.add(old)
    while old.num_generated == 0:
        plan = h.step()
        assert any(c.seq_id == new.seq_id and len(c.token_ids) == 1 for c in plan.chunks)
        assert sum(len(c.token_ids) for c in plan.chunks) <= 8
