"""The model runner over the paged KV pool: equal to the dense reference under any packing,
prefix reuse, zeroing, sampling, and the real model's reference answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan
from backend.model import LoadedModel, linear, load_model
from backend.model.row_plan import RowPlan
from backend.runner import ModelRunner
from tests.kit.device_reads import DeviceReads
from tests.kit.models import TEST_DEVICE

GREEDY = SamplingParams(max_tokens=64, temperature=0.0)
BS = 4  # small blocks so short prompts span several


def prefill(seq: int, ids: Sequence[int], table: Sequence[int], start: int = 0) -> Chunk:
    return Chunk(seq, tuple(ids[start:]), start, tuple(table), True, GREEDY, 0, len(ids))


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    tables: Sequence[Sequence[int]],
    n_new: int,
) -> list[list[int]]:
    """All prompts prefilled in one step, then batched greedy decode steps."""
    plan = StepPlan(
        tuple(prefill(i, p, t) for i, (p, t) in enumerate(zip(prompts, tables, strict=True)))
    )
    first = runner.execute(plan).tokens
    out = [[first[i]] for i in range(len(prompts))]
    for step in range(1, n_new):
        chunks = tuple(
            Chunk(i, (out[i][-1],), len(p) + step - 1, tuple(tables[i]), True, GREEDY, step, len(p))
            for i, p in enumerate(prompts)
        )
        tokens = runner.execute(StepPlan(chunks)).tokens
        for i in range(len(prompts)):
            out[i].append(tokens[i])
    return out


def generate_staggered(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    tables: Sequence[Sequence[int]],
    n_new: int,
) -> list[list[int]]:
    """Continuous batching: sequence i joins at step i, its prefill sharing the step with the
    others' decodes; each leaves after n_new tokens."""
    out: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(o) < n_new for o in out):
        chunks = []
        for i, p in enumerate(prompts[: step + 1]):
            done = out[i]
            if not done:
                chunks.append(prefill(i, p, tables[i]))
            elif len(done) < n_new:
                pos = len(p) + len(done) - 1
                chunks.append(
                    Chunk(i, (done[-1],), pos, tuple(tables[i]), True, GREEDY, len(done), len(p))
                )
        for seq, token in runner.execute(StepPlan(tuple(chunks))).tokens.items():
            out[seq].append(token)
        step += 1
    return out


def dense_greedy(loaded: LoadedModel, ids: Sequence[int], n_new: int) -> list[int]:
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n_new):
            seq.append(int(loaded.model.forward_dense(seq)[-1].argmax()))
    return seq[len(ids) :]


PROMPTS = [
    [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46],
    [2, 71, 82, 81],
    [7, 7, 7, 7, 7, 7, 7, 7, 9],
]
TABLES = [[9, 2, 17, 5, 11, 30], [0, 25, 3, 4], [12, 13, 28, 6, 1]]


def test_paged_batch_matches_dense_reference(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    expected = [dense_greedy(tiny_model, p, 8) for p in PROMPTS]
    assert generate(runner, PROMPTS, TABLES, n_new=8) == expected
    fresh = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    assert generate_staggered(fresh, PROMPTS, TABLES, n_new=8) == expected


def test_chunked_prefill_and_mixed_steps(tiny_model: LoadedModel) -> None:
    """Sequence 0 prefills in two chunks while sequence 1 decodes in the same steps."""
    runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    p0, p1 = PROMPTS[0], PROMPTS[1]
    first = runner.execute(StepPlan((prefill(1, p1, TABLES[1]),))).tokens
    head = Chunk(0, tuple(p0[:6]), 0, tuple(TABLES[0]), False, GREEDY, 0, len(p0))
    assert runner.execute(StepPlan((head,))).tokens == {}  # nothing to sample: nothing returned
    step1 = runner.execute(
        StepPlan((head, Chunk(1, (first[1],), len(p1), tuple(TABLES[1]), True, GREEDY, 1, len(p1))))
    ).tokens
    assert 0 not in step1
    step2 = runner.execute(
        StepPlan(
            (
                Chunk(1, (step1[1],), len(p1) + 1, tuple(TABLES[1]), True, GREEDY, 2, len(p1)),
                prefill(0, p0, TABLES[0], start=6),
            )
        )
    ).tokens
    assert step2[0] == dense_greedy(tiny_model, p0, 1)[0]
    assert [first[1], step1[1], step2[1]] == dense_greedy(tiny_model, p1, 3)


def test_a_step_reads_nothing_back_from_the_device_but_its_tokens(
    tiny_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill, decodes and every kind of sampling in one step, then a decode step: no scalar
    is read back on the way (on a GPU each would wait for the device); the tokens come back
    once per step, together. (Inference mode hides reads from the counter: no_grad instead.)"""
    monkeypatch.setattr(torch, "inference_mode", torch.no_grad)
    runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    sampled = [GREEDY, SamplingParams(temperature=0.9, top_p=0.5, seed=4),
               SamplingParams(temperature=0.7, top_p=0.9)]  # fmt: skip
    plan = StepPlan(tuple(replace(prefill(i, p, t), sampling=s) for i, (p, t, s) in
                          enumerate(zip(PROMPTS, TABLES, sampled, strict=True))))  # fmt: skip
    with DeviceReads() as reads:
        first = runner.execute(plan).tokens
        decode = StepPlan(tuple(
            Chunk(i, (first[i],), len(p), tuple(TABLES[i]), True, sampled[i], 1, len(p))
            for i, p in enumerate(PROMPTS)
        ))  # fmt: skip
        second = runner.execute(decode).tokens
    assert not reads.seen
    assert len(first) == len(second) == 3
    assert [first[0], second[0]] == dense_greedy(tiny_model, PROMPTS[0], 2)


def test_prefix_blocks_in_the_pool_are_reused(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    prompt = PROMPTS[0]
    whole = runner.execute(StepPlan((prefill(0, prompt, [1, 2, 3]),))).tokens
    # A second sequence shares the first two full blocks and computes only the rest.
    reused = runner.execute(StepPlan((prefill(1, prompt, [1, 2, 7], start=2 * BS),))).tokens
    assert reused[1] == whole[0]
    # Control: with the shared blocks zeroed, the same chunk no longer sees the prefix.
    runner.zero_blocks([1, 2])
    blind = runner.execute(StepPlan((prefill(2, prompt, [1, 2, 8], start=2 * BS),))).tokens
    assert blind[2] != whole[0]


def test_zero_blocks_zeroes_exactly_those_blocks(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    runner.execute(StepPlan((prefill(0, PROMPTS[0], [1, 2, 3]),)))
    before = [k.clone() for k in runner.k_cache]
    runner.execute(StepPlan((), zero_blocks=(2,)))
    for layer, (k, v) in enumerate(zip(runner.k_cache, runner.v_cache, strict=True)):
        assert not k[2].any() and not v[2].any()
        assert torch.equal(k[1], before[layer][1]) and torch.equal(k[3], before[layer][3])
        assert k[1].any()


def test_zeroing_happens_before_the_step_writes(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    runner.execute(StepPlan((prefill(0, PROMPTS[0], [1, 2, 3]),)))
    runner.execute(StepPlan((prefill(1, PROMPTS[1], [2]),), zero_blocks=(2,)))
    assert runner.k_cache[0][2].any()  # block 2 now holds the new sequence's K


def test_bad_block_tables_are_refused(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=4, block_size=BS)
    with pytest.raises(ValueError, match="does not cover"):
        runner.execute(StepPlan((prefill(0, PROMPTS[0], [0, 1]),)))
    with pytest.raises(ValueError, match="outside the pool"):
        runner.execute(StepPlan((prefill(0, PROMPTS[1], [4]),)))
    with pytest.raises(ValueError, match="outside the pool"):
        runner.execute(StepPlan((), zero_blocks=(9,)))
    beyond = tiny_model.config.max_positions
    with pytest.raises(ValueError, match="beyond the model's context"):
        runner.execute(StepPlan((Chunk(0, (1,), beyond, (0, 1, 2), True, GREEDY, 0, 1),)))
    assert not any(k.any() for k in runner.k_cache)


def test_kv_cache_tensors_and_bytes(tiny_model: LoadedModel) -> None:
    c = tiny_model.config
    runner = ModelRunner(tiny_model, num_blocks=10, block_size=BS)
    assert len(runner.k_cache) == len(runner.v_cache) == c.n_layers
    assert runner.k_cache[0].shape == (10, BS, c.n_kv_heads, c.head_dim)
    assert runner.kv_cache_bytes() == 2 * c.n_layers * 10 * BS * c.n_kv_heads * c.head_dim * 4
    assert runner.device == tiny_model.device and runner.dtype == torch.float32
    assert runner.k_cache[0].device.type == tiny_model.device.type


def sampled_token(runner: ModelRunner, sampling: SamplingParams, n: int, others: int) -> int:
    """Sequence 0's sample at num_generated n, decoded beside `others` other sequences."""
    chunks = [Chunk(0, (5,), 3, (0,), True, sampling, n, 3)]
    chunks += [Chunk(i, (i,), 2, (i,), True, sampling, i, 2) for i in range(1, others + 1)]
    return runner.execute(StepPlan(tuple(chunks))).tokens[0]


def test_seeded_sampling_is_reproducible_across_batches(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    runner.execute(StepPlan((prefill(0, [1, 2, 3], [0]),)))
    hot = SamplingParams(temperature=5.0, top_p=1.0, seed=1234)
    draws = [sampled_token(runner, hot, n, others=0) for n in range(12)]
    assert draws == [sampled_token(runner, hot, n, others=3) for n in range(12)]
    assert len(set(draws)) > 3  # a hot temperature really samples
    other_seed = SamplingParams(temperature=5.0, seed=99)
    assert draws != [sampled_token(runner, other_seed, n, others=0) for n in range(12)]


def test_tiny_top_p_is_greedy(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    runner.execute(StepPlan((prefill(0, [1, 2, 3], [0]),)))
    greedy = sampled_token(runner, GREEDY, 0, others=0)
    narrow = SamplingParams(temperature=1.0, top_p=1e-6)
    assert {sampled_token(runner, narrow, n, others=2) for n in range(6)} == {greedy}


def test_logprobs_are_the_log_softmax_of_the_unmodified_logits(tiny_model: LoadedModel) -> None:
    """Only the chunks that ask get logprobs; they are the dense reference's log_softmax of the
    raw logits whatever the temperature, the chosen token's and the top k, most likely first."""
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    prompt = [1, 2, 3, 4, 5]
    greedy = replace(GREEDY, logprobs=5)
    hot = SamplingParams(temperature=1.7, top_p=0.9, seed=3, logprobs=3)
    plan = StepPlan(
        (
            Chunk(0, tuple(prompt), 0, (0, 1), True, greedy, 0, len(prompt)),
            Chunk(1, tuple(prompt), 0, (2, 3), True, hot, 0, len(prompt)),
            Chunk(2, tuple(prompt), 0, (4, 5), True, GREEDY, 0, len(prompt)),
        )
    )
    result = runner.execute(plan)
    assert set(result.logprobs) == {0, 1}  # seq 2 did not ask
    with torch.inference_mode():
        reference = torch.log_softmax(tiny_model.model.forward_dense(prompt)[-1], dim=-1)
    expected = reference.topk(5)
    for seq, k in ((0, 5), (1, 3)):
        lp = result.logprobs[seq]
        token = result.tokens[seq]
        assert lp.logprob == pytest.approx(float(reference[token]), abs=1e-4)
        assert [t for t, _ in lp.top] == expected.indices[:k].tolist()
        assert [v for _, v in lp.top] == pytest.approx(expected.values[:k].tolist(), abs=1e-4)
    assert result.tokens[0] == result.logprobs[0].top[0][0]  # greedy takes the top entry
    assert result.logprobs[0].logprob == result.logprobs[0].top[0][1]
    no_top = runner.execute(
        StepPlan(
            (Chunk(0, tuple(prompt), 0, (0, 1), True, replace(GREEDY, logprobs=0), 0, len(prompt)),)
        )
    )
    assert no_top.logprobs[0].top == () and no_top.logprobs[0].logprob <= 0


REFERENCE_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
BATCH_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about snow.",
    "Name three colors.",
    "Who wrote Hamlet?",
]


def chat_ids(loaded: LoadedModel, question: str) -> list[int]:
    tok = loaded.tokenizer
    return tok.encode(tok.render_chat([{"role": "user", "content": question}]))


def tables_for(prompts: Sequence[Sequence[int]], n_new: int, block_size: int) -> list[list[int]]:
    """Disjoint tables, interleaved across the pool so no sequence's blocks are contiguous."""
    need = [-(-(len(p) + n_new) // block_size) for p in prompts]
    return [[s + j * len(prompts) for j in range(n)] for s, n in enumerate(need)]


@pytest.mark.slow
def test_reference_answer_through_the_paged_pool(smollm2: LoadedModel) -> None:
    runner = ModelRunner(smollm2, num_blocks=64, block_size=16)
    ids = chat_ids(smollm2, BATCH_QUESTIONS[0])
    [answer] = generate(runner, [ids], tables_for([ids], 10, 16), n_new=10)
    assert smollm2.tokenizer.decode(answer).startswith("The capital of France is Paris.")


@pytest.mark.slow
def test_batched_generation_equals_one_at_a_time(smollm2: LoadedModel) -> None:
    prompts = [chat_ids(smollm2, q) for q in BATCH_QUESTIONS]
    tables = tables_for(prompts, 24, 16)
    together = generate(ModelRunner(smollm2, num_blocks=64, block_size=16), prompts, tables, 24)
    staggered = generate_staggered(
        ModelRunner(smollm2, num_blocks=64, block_size=16), prompts, tables, 24
    )
    alone = [
        generate(ModelRunner(smollm2, num_blocks=64, block_size=16), [p], [t], 24)[0]
        for p, t in zip(prompts, tables, strict=True)
    ]
    assert together == alone
    assert staggered == alone
    assert len({tuple(a) for a in alone}) == len(prompts)


@pytest.mark.slow
def test_prefix_reuse_gives_the_same_next_token(smollm2: LoadedModel) -> None:
    runner = ModelRunner(smollm2, num_blocks=16, block_size=16)
    ids = chat_ids(smollm2, BATCH_QUESTIONS[1])
    full = len(ids) // 16
    assert full >= 1
    whole = runner.execute(StepPlan((prefill(0, ids, list(range(full + 1))),))).tokens
    reused_table = [*range(full), 15]  # shared prefix blocks, a fresh block for the tail
    reused = runner.execute(StepPlan((prefill(1, ids, reused_table, start=full * 16),))).tokens
    assert reused[1] == whole[0]


# Every row of a projection in one call: what a model without row plans does.
_WHOLE = RowPlan(generated_rows=1 << 30, prompt_sizes=(), single_row=True)


@pytest.fixture(scope="module")
def float32_reference() -> LoadedModel:
    """SmolLM2 in float32 through plain F.linear, every row of a projection in one call (no
    prepacked kernel, no row plan): the reference."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(linear, "_packable", lambda weight: False)
        patch.setattr(linear, "_probe", lambda weight, prompt: linear._Choice(False, _WHOLE))
        return load_model("smollm2", device=str(TEST_DEVICE), dtype="float32")


@pytest.fixture(scope="module")
def float32_planned() -> LoadedModel:
    """SmolLM2 in float32 as the backend runs it: prepacked kernels and row plans."""
    return load_model("smollm2", device=str(TEST_DEVICE), dtype="float32")


@pytest.mark.slow
def test_greedy_answers_equal_the_float32_reference(
    float32_planned: LoadedModel, float32_reference: LoadedModel
) -> None:
    """In float32 (what `auto` picks without native bfloat16), the paged, batched runner with
    its prepacked kernels and row plans writes the same greedy tokens as the plain model."""
    prompts = [chat_ids(float32_planned, q) for q in BATCH_QUESTIONS]
    expected = [dense_greedy(float32_reference, p, 24) for p in prompts]
    runner = ModelRunner(float32_planned, num_blocks=64, block_size=16)
    assert generate(runner, prompts, tables_for(prompts, 24, 16), 24) == expected
    assert float32_reference.tokenizer.decode(expected[0]).startswith(
        "The capital of France is Paris."
    )


@pytest.mark.slow
def test_the_dtype_auto_picked_answers_like_float32(
    smollm2: LoadedModel, float32_reference: LoadedModel
) -> None:
    """Whatever dtype `auto` picked on this host, the paged, batched runner's answers start as
    float32's. In bfloat16 answers are not float32's token for token, with any kernel: on an
    AVX-512 host 10 of 16 chat answers of 32 tokens were whole, with oneDNN's kernel and with
    ours alike (a near tie that one rounding tips, others not); the first 8 tokens of these held
    with both."""
    prompts = [chat_ids(smollm2, q) for q in BATCH_QUESTIONS]
    expected = [dense_greedy(float32_reference, p, 8) for p in prompts]
    runner = ModelRunner(smollm2, num_blocks=64, block_size=16)
    assert generate(runner, prompts, tables_for(prompts, 8, 16), 8) == expected
    assert smollm2.tokenizer.decode(expected[0]).startswith("The capital of France is Paris.")
