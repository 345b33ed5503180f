"""A greedy answer does not depend on what shares its steps: each sequence gets the same tokens
and the same logprobs, bit for bit, alone, batched with staggered arrivals (its prompt chunked
differently, its rows beside decodes and other prompts), and recomputed after a preemption."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import torch

from backend.engine.engine import Engine, EngineConfig
from backend.engine.plan import Chunk, SamplingParams, StepPlan, StepResult
from backend.model import LoadedModel
from backend.model.decode_graphs import SIZES
from backend.runner import ModelRunner
from kvfence.capability import _mint

NS = _mint("tenant-a")
SAMPLING = SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)
QUESTIONS = [
    "What is the capital of France?",
    "Explain pallets in one line.",
    "List three uses of a depot, with one sentence about each and an example of the last.",
    "Why is the sky blue?",
    "Write a haiku about customs forms.",
    "How do refunds usually work when a parcel is lost in transit and the sender is abroad?",
    "Name a prime number.",
    "What does insurance cover?",
    "Describe parcel tracking to a child, then to an engineer, then to a lawyer.",
    "Say hello.",
]
Answer = list[tuple[int, float, tuple[tuple[int, float], ...]]]


class RecordingRunner(ModelRunner):
    """The real runner, keeping every plan it ran."""

    plans: list[StepPlan]

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        return super().execute(plan)


def make_engine(
    loaded: LoadedModel, blocks: int, step_tokens: int, graphs: bool = False
) -> tuple[Engine, RecordingRunner]:
    runner = RecordingRunner(loaded, num_blocks=blocks, block_size=16, graphs=graphs)
    runner.plans = []
    config = EngineConfig(num_blocks=blocks, block_size=16, max_step_tokens=step_tokens)
    return Engine(runner, config), runner


def run(engine: Engine, prompts: Sequence[list[int]], arrivals: Sequence[int]) -> list[Answer]:
    """Prompt i joins at step arrivals[i]; every answer with its logprobs, in prompt order."""
    index: dict[int, int] = {}
    out: list[Answer] = [[] for _ in prompts]
    step = 0
    while len(index) < len(prompts) or engine.has_work():
        for i, prompt in enumerate(prompts):
            if arrivals[i] == step:
                index[engine.add(NS, prompt, SAMPLING)] = i
        for o in engine.step():
            assert o.logprobs is not None
            out[index[o.seq_id]].append((o.token_id, o.logprobs.logprob, o.logprobs.top))
        step += 1
        assert step < 1000
    return out


@pytest.fixture(scope="module")
def prompts(smollm2: LoadedModel) -> list[list[int]]:
    tok = smollm2.tokenizer
    return [tok.encode(tok.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]


@pytest.fixture(scope="module")
def alone(smollm2: LoadedModel, prompts: list[list[int]]) -> list[Answer]:
    engine, _ = make_engine(smollm2, blocks=64, step_tokens=64)
    return [run(engine, [p], [0])[0] for p in prompts]


@pytest.mark.slow
def test_batched_with_staggered_arrivals_gives_the_bits_alone(
    smollm2: LoadedModel, prompts: list[list[int]], alone: list[Answer]
) -> None:
    engine, runner = make_engine(smollm2, blocks=128, step_tokens=64)
    together = run(engine, prompts, [i // 3 for i in range(len(prompts))])
    plans = runner.plans
    # Steps held more rows than a decode batch, prompts beside decodes, prompts cut differently.
    assert max(sum(len(c.token_ids) for c in p.chunks) for p in plans) > 32
    assert any({len(c.token_ids) for c in p.chunks} - {1} and len(p.chunks) > 2 for p in plans)
    assert together == alone


@pytest.mark.slow
def test_decode_steps_from_static_buffers_give_the_bits_alone(
    smollm2: LoadedModel, prompts: list[list[int]], alone: list[Answer]
) -> None:
    """As a GPU runs decode steps (CUDA graphs of padded sizes; here the same buffers, eager)."""
    if not ModelRunner(smollm2, num_blocks=4, block_size=16, graphs=False).pool.plan.own_decodes:
        pytest.skip("decodes are not read in place on this host: no static buffers")
    engine, runner = make_engine(smollm2, blocks=128, step_tokens=64, graphs=True)
    together = run(engine, prompts, [i // 3 for i in range(len(prompts))])
    sizes = {len(p.chunks) for p in runner.plans if all(len(c.token_ids) == 1 for c in p.chunks)}
    assert sizes - set(SIZES)  # decode steps padded to a larger size, with padding rows
    assert together == alone


@pytest.mark.slow
def test_a_preempted_sequence_computed_again_keeps_its_bits(
    smollm2: LoadedModel, prompts: list[list[int]], alone: list[Answer]
) -> None:
    engine, runner = make_engine(smollm2, blocks=12, step_tokens=64)
    together = run(engine, prompts, [0] * len(prompts))
    plans = runner.plans
    recomputed = [
        c
        for p in plans
        for c in p.chunks
        if len(c.token_ids) > 1 and c.start + len(c.token_ids) > c.prompt_len
    ]
    assert recomputed  # generated tokens computed again in a prompt-sized chunk
    assert together == alone


PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]


def prefilled(loaded: LoadedModel, cuts: Sequence[int]) -> tuple[StepResult, torch.Tensor]:
    """PROMPT prefilled in chunks ending at `cuts`, then one decode: its result and the pool."""
    runner = ModelRunner(loaded, num_blocks=8, block_size=4)
    table, n = tuple(range(8)), len(PROMPT)
    bounds = [0, *cuts, n]
    first: dict[int, int] = {}
    for a, b in itertools.pairwise(bounds):
        chunk = Chunk(0, tuple(PROMPT[a:b]), a, table, b == n, SAMPLING, 0, n)
        first = runner.execute(StepPlan((chunk,))).tokens
    decode = Chunk(0, (first[0],), n, table, True, SAMPLING, 1, n)
    return runner.execute(StepPlan((decode,))), torch.cat((runner.pool.k, runner.pool.v))


@pytest.mark.parametrize("cuts", [[1], [5, 6], [3, 8, 13], [4, 8, 12, 16], list(range(1, 20))])
def test_a_prompt_leaves_the_same_bits_however_it_is_chunked(
    tiny_model: LoadedModel, cuts: list[int]
) -> None:
    whole_result, whole_kv = prefilled(tiny_model, [])
    result, kv = prefilled(tiny_model, cuts)
    assert torch.equal(kv, whole_kv)
    assert result == whole_result


def test_the_runner_says_how_this_hosts_kernels_are_fed(tiny_model: LoadedModel) -> None:
    plans = ModelRunner(tiny_model, num_blocks=4, block_size=4).kernel_plans()
    assert "qkv: generated rows <=" in plans and "head: generated rows <=" in plans
    assert plans.endswith("batch invariance holds")
