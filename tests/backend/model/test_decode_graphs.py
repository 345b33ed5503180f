"""Steps of decodes alone from static buffers (captured as CUDA graphs on a GPU; here the same
buffers run eagerly): every step's tokens, logprobs and pool are those of the usual path, padding
rows write only the scratch block, and any other step takes the usual path. A model set up as on
a GPU (torch's layers, decodes through our Triton kernel, run by Triton's interpreter in a child
process) gives the same bits with and without the buffers, and torch's attention's answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from backend.engine.plan import Chunk, SamplingParams, StepPlan, StepResult
from backend.model import LoadedModel
from backend.model.decode_graphs import DecodeGraphs, decodes_alone, scratch_blocks
from backend.model.weights import build_llama
from backend.runner import ModelRunner
from tests.backend.model.conftest import WIDE, needs_our_kernels
from tests.kit.models import TINY, tiny_tensors

BS = 4
BLOCKS = 40
GREEDY = SamplingParams(max_tokens=64, temperature=0.0, logprobs=3)
PROMPTS = [[5, 9, 2, 7, 1, 3], [4, 4, 8, 1, 6, 2, 9, 9, 3, 5, 7], [2, 6, 1]]
# Tables out of order and interleaved, as a pool in use hands them out.
TABLES = [(7, 3, 30, 12, 21), (1, 25, 9, 14, 2), (33, 0, 18, 5, 27)]


@pytest.fixture(scope="module")
def torch_layers() -> LoadedModel:
    """`wide` run as on a GPU: torch's layers (rotary by position), our decode attention."""
    model = build_llama(WIDE, tiny_tensors(3, WIDE), torch.device("cpu"), torch.bfloat16)
    model._own, model._rows = None, None
    return LoadedModel(model, WIDE, None, torch.device("cpu"), torch.bfloat16, "wide")  # type: ignore[arg-type]


def _prefill(seq: int) -> Chunk:
    ids = PROMPTS[seq]
    return Chunk(seq, tuple(ids), 0, TABLES[seq], True, GREEDY, 0, len(ids))


def _decode(seq: int, token: int, done: int) -> Chunk:
    start = len(PROMPTS[seq]) + done - 1
    return Chunk(seq, (token,), start, TABLES[seq], True, GREEDY, done, len(PROMPTS[seq]))


def _run(runner: ModelRunner, steps: int, drop_after: int) -> tuple[list[StepResult], int]:
    """Prefills every prompt, then decodes them together (the last sequence stops after
    `drop_after` steps) -> each step's result, and how many steps the static buffers ran."""
    ran = 0
    if runner.graphs is not None:
        graphs, logits = runner.graphs, runner.graphs.logits

        def counted(chunks: list[Chunk]) -> torch.Tensor:
            nonlocal ran
            ran += 1
            return logits(chunks)

        graphs.logits = counted  # type: ignore[method-assign]
    first = runner.execute(StepPlan(tuple(_prefill(s) for s in range(3))))
    results, last = [first], dict(first.tokens)
    for done in range(1, steps + 1):
        seqs = range(3) if done <= drop_after else range(2)
        result = runner.execute(StepPlan(tuple(_decode(s, last[s], done) for s in seqs)))
        results.append(result)
        last.update(result.tokens)
    return results, ran


@needs_our_kernels
@pytest.mark.parametrize("layers", ["ours", "torch"])
def test_decode_steps_from_static_buffers_answer_as_the_usual_path(
    layers: str, wide: LoadedModel, torch_layers: LoadedModel
) -> None:
    loaded = wide if layers == "ours" else torch_layers
    usual = ModelRunner(loaded, num_blocks=BLOCKS, block_size=BS, graphs=False)
    static = ModelRunner(loaded, num_blocks=BLOCKS, block_size=BS, graphs=True)
    assert usual.graphs is None and static.graphs is not None
    assert "steps of decodes alone: static buffers" in static.kernel_plans()
    theirs, _ = _run(usual, steps=9, drop_after=5)
    ours, ran = _run(static, steps=9, drop_after=5)
    assert ran == 9  # every decode step: 3 rows (a padding row in a size of 4), then 2
    assert ours == theirs  # tokens and logprobs, bit for bit
    for mine, other in ((static.pool.k, usual.pool.k), (static.pool.v, usual.pool.v)):
        assert torch.equal(mine[:, :BLOCKS], other)


@needs_our_kernels
def test_padding_rows_write_the_scratch_block_only(wide: LoadedModel) -> None:
    runner = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, graphs=True)
    assert runner.pool.k.shape[1] == BLOCKS + scratch_blocks(256, BS)  # past the engine's
    _run(runner, steps=4, drop_after=4)
    # positions 0 .. len(prompt) + 3 of each sequence: the blocks its table names for them
    used = {b for p, t in zip(PROMPTS, TABLES, strict=True) for b in t[: -(-(len(p) + 4) // BS)]}
    for b in range(BLOCKS):
        written = bool(runner.pool.k[:, b].any()) or bool(runner.pool.v[:, b].any())
        assert written == (b in used), b
    assert runner.pool.k[:, BLOCKS, 3].any()  # 3 rows ran as 4: the fourth wrote its slot


@needs_our_kernels
def test_padding_rows_alone_write_one_slot_each_and_repeat_their_bits(wide: LoadedModel) -> None:
    runner = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, max_batch=8, graphs=True)
    graphs = runner.graphs
    assert graphs is not None
    graphs._fill([], 8)
    with torch.inference_mode():
        first = graphs._forward(graphs._attention(8), 8)
        again = graphs._forward(graphs._attention(8), 8)
    assert torch.equal(first, again)
    written = runner.pool.k[0, BLOCKS:].flatten(2).any(dim=2)  # [scratch blocks, slot]
    assert written.tolist() == [[True] * BS, [True] * BS]  # rows 0-7: slots 0-7, one each
    assert not runner.pool.k[:, :BLOCKS].any()  # nothing of the engine's


@needs_our_kernels
def test_a_step_larger_than_the_largest_size_takes_the_usual_path(wide: LoadedModel) -> None:
    usual = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, graphs=False)
    static = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, max_batch=2, graphs=True)
    assert static.graphs is not None and static.graphs.sizes == (1, 2)
    theirs, _ = _run(usual, steps=4, drop_after=2)
    ours, ran = _run(static, steps=4, drop_after=2)
    assert ran == 2  # the steps of 2 rows; those of 3 ran the usual way
    assert ours == theirs


def test_only_steps_of_plain_decodes_qualify() -> None:
    assert decodes_alone([_decode(0, 1, 1), _decode(1, 2, 3)])
    assert not decodes_alone([])
    assert not decodes_alone([_prefill(0)])
    assert not decodes_alone([_decode(0, 1, 1), _prefill(1)])
    prompt_tail = Chunk(0, (3,), 5, TABLES[0], True, GREEDY, 0, 6)  # a prompt's last token
    assert not decodes_alone([prompt_tail])
    unsampled = Chunk(0, (3,), 6, TABLES[0], False, GREEDY, 1, 6)
    assert not decodes_alone([unsampled])
    recomputed = Chunk(0, (3, 4), 6, TABLES[0], True, GREEDY, 2, 6)
    assert not decodes_alone([recomputed])


def test_static_buffers_need_decodes_read_in_place(tiny_model: LoadedModel) -> None:
    # float32 and a head of 8: attention gathers its context, which no buffer can hold fixed
    with pytest.raises(ValueError, match="read in place"):
        ModelRunner(tiny_model, num_blocks=8, block_size=4, graphs=True)
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=4)  # the default on a CPU: off
    assert runner.graphs is None and runner.pool.k.shape[1] == 8


@needs_our_kernels
def test_sizes_and_what_a_graph_needs(wide: LoadedModel) -> None:
    runner = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, max_batch=20, graphs=True)
    assert runner.graphs is not None
    assert runner.graphs.sizes == (1, 2, 4, 8, 12, 16, 20)
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(wide.model, runner.pool, BLOCKS, 4, capture=True)
    assert runner.pool.k.shape[1] == BLOCKS + 5  # 20 padding rows at most: 5 blocks of 4
    with pytest.raises(ValueError, match="scratch"):
        DecodeGraphs(wide.model, runner.pool, BLOCKS + 5, 4, capture=False)


def _as_on_a_gpu(triton: bool, graphs: bool) -> list[StepResult]:
    """The tiny float32 model's steps with decodes through the Triton kernel (as on CUDA) or
    through torch's attention; run where TRITON_INTERPRET=1 was set before triton loaded."""
    from backend.model import kv_pool
    from backend.model.paged_gpu import PagedDecodeAttention

    loaded = LoadedModel(
        build_llama(TINY, tiny_tensors(), torch.device("cpu"), torch.float32),
        TINY, None, torch.device("cpu"), torch.float32, "tiny",  # type: ignore[arg-type]
    )  # fmt: skip
    plan, own = kv_pool.plan_attention, kv_pool._own
    if triton:  # what kv_pool does on CUDA
        kv_pool.plan_attention = lambda *a: replace(plan(*a), own_decodes=True)  # type: ignore[assignment]
        kv_pool._own = lambda pool, g, slots: (  # type: ignore[assignment]
            own(pool, g, slots)
            if g.ends is None
            else PagedDecodeAttention(g.blocks, g.ends, pool.k, pool.v, pool.config.n_heads)
        )
    try:
        runner = ModelRunner(loaded, num_blocks=BLOCKS, block_size=BS, graphs=graphs)
        return _run(runner, steps=7, drop_after=4)[0]
    finally:
        kv_pool.plan_attention, kv_pool._own = plan, own  # type: ignore[method-assign]


def _gpu_setup_in_the_interpreter() -> None:
    """The child: prints each run's tokens and logprobs as JSON."""
    runs = {
        name: [[r.tokens, {s: [lp.logprob, lp.top] for s, lp in r.logprobs.items()}]
               for r in _as_on_a_gpu(triton, graphs)]
        for name, triton, graphs in (
            ("triton_graphs", True, True), ("triton", True, False), ("torch", False, False)
        )
    }  # fmt: skip
    print(json.dumps(runs))


def test_the_gpu_setup_answers_alike_with_and_without_static_buffers() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = f"from {__name__} import _gpu_setup_in_the_interpreter as f; f()"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["triton_graphs"] == runs["triton"]  # bit for bit, padding rows and all
    for ours, theirs in zip(runs["triton"], runs["torch"], strict=True):
        assert ours[0] == theirs[0]  # the same greedy tokens as torch's attention
        for seq, (logprob, _) in ours[1].items():
            assert logprob == pytest.approx(theirs[1][seq][0], abs=1e-4)


def test_a_failed_capture_costs_the_speed_not_the_server(
    wide: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where graphs are on by default (a GPU) and capturing fails, steps run the usual way and
    the start-up log says why; asked for explicitly, the failure is the runner's."""
    import backend.runner

    def broken(*args: object, **kwargs: object) -> DecodeGraphs:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(backend.runner, "_by_default", lambda device: True)
    monkeypatch.setattr(backend.runner, "DecodeGraphs", broken)
    runner = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS)
    assert runner.graphs is None
    assert "CUDA graphs not used: RuntimeError('operation not permitted" in runner.kernel_plans()
    usual = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, graphs=False)
    assert _run(runner, steps=3, drop_after=3)[0] == _run(usual, steps=3, drop_after=3)[0]
    with pytest.raises(RuntimeError, match="capturing"):
        ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, graphs=True)


class _Replay:
    """Stands in for a captured graph: `replay` writes the logits of `rows` into `out`."""

    def __init__(self, graphs: DecodeGraphs, size: int, fresh: bool) -> None:
        self.graphs, self.size, self.fresh = graphs, size, fresh
        with torch.inference_mode():
            self.out = graphs._forward(graphs._attention(size), size)

    def replay(self) -> None:
        if self.fresh:  # what a correct graph does: the step on the buffers as they are now
            with torch.inference_mode():
                self.out.copy_(self.graphs._forward(self.graphs._attention(self.size), self.size))


@needs_our_kernels
def test_a_graph_that_replays_its_capture_and_not_the_step_is_refused(wide: LoadedModel) -> None:
    runner = ModelRunner(wide, num_blocks=BLOCKS, block_size=BS, graphs=True)
    graphs = runner.graphs
    assert graphs is not None
    good = _Replay(graphs, 4, fresh=True)
    graphs._verify(4, good, good.out)  # type: ignore[arg-type]
    stale = _Replay(graphs, 4, fresh=False)  # its logits: those of the capture's inputs
    with pytest.raises(RuntimeError, match="other bits than a direct step"):
        graphs._verify(4, stale, stale.out)  # type: ignore[arg-type]
    assert not graphs._rows[0].any()  # the buffers hold padding rows again
