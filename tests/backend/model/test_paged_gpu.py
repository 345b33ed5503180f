"""Decode attention read in place from the paged pool by our Triton kernel: it agrees with
float32 over shuffled, padded tables, contexts that end mid-block or at a block's end, grouped
and ungrouped heads and strided queries; a query gets the same bits alone and in any batch; new
tables and ends written into the same tensors give the new contexts' answers (a CUDA graph's
replay); the layer index picks the layer; an empty context gives zeros and a table outside the
pool gives NaN. Without a GPU the kernel runs in Triton's interpreter, which must be chosen
before triton jits anything: those checks run in one child process (this file as a script)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from backend.model import native
from backend.model.paged_gpu import PagedDecodeAttention, available

ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
ON_CUDA = available(torch.device("cuda"), torch.bfloat16, 64)  # None where the kernel runs there


def _pool(
    blocks: int, bs: int, kv_heads: int, d: int, dtype: torch.dtype, layers: int = 1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (layers, blocks, bs, kv_heads, d)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def _tables(ends: list[int], nb: int, blocks: int, bs: int, seed: int = 1) -> torch.Tensor:
    """[B, nb] int32: shuffled block ids, padded with block 0 past each context."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(blocks, generator=gen)[:nb] for _ in ends]
    for row, end in zip(rows, ends, strict=True):
        row[-(-end // bs) :] = 0
    return torch.stack(rows).to(torch.int32)


def _queries(
    b: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int = 2
) -> torch.Tensor:
    """[B, Hq, D], a view into a fused qkv tensor (rows (Hq + 2 Hkv) * D apart)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    return qkv[:, : heads * d].view(b, heads, d)


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: torch.Tensor,
    ends: torch.Tensor,
    layer: int = 0,
) -> torch.Tensor:
    # q: [B, Hq, D]; k, v: the pool -> [B, Hq * D] float32, each context gathered
    flat = (k[layer].flatten(0, 1), v[layer].flatten(0, 1))
    return native.reference_attention(q, *flat, blocks, ends, k.shape[2])


def _agrees(out: torch.Tensor, ref: torch.Tensor) -> None:
    tol = TOL[out.dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


def _check_agrees_with_float32() -> None:
    """SmolLM2's 9 heads over 3 and one head per KV head; a block dividing the tile, one that
    does not (5) and one wider than a tile (48); one position, mid-block, a block's end, full."""
    cases = [
        (9, 3, 16, torch.float32, [1, 16, 21, 32, 80]),
        (9, 3, 16, torch.float16, [7, 48]),
        (9, 3, 16, torch.bfloat16, [33, 2]),
        (4, 4, 16, torch.float32, [5, 16, 64]),
        (9, 3, 5, torch.float16, [1, 5, 13, 25]),
        (6, 2, 48, torch.float32, [47, 48, 49]),
    ]
    for heads, kv_heads, bs, dtype, ends in cases:
        nb = -(-max(ends) // bs)
        k, v = _pool(nb + 3, bs, kv_heads, 64, dtype)
        blocks, lens = _tables(ends, nb, nb + 3, bs), torch.tensor(ends, dtype=torch.int32)
        q = _queries(len(ends), heads, kv_heads, 64, dtype)
        assert q.stride(0) == (heads + 2 * kv_heads) * 64
        out = PagedDecodeAttention(blocks, lens, k, v, heads)(0, q)
        assert out.shape == (len(ends), heads * 64) and out.dtype == dtype
        _agrees(out, _reference(q, k, v, blocks, lens))


def _check_a_query_gets_its_bits_alone_and_in_any_batch() -> None:
    ends = [3, 16, 40, 17, 64, 1]
    k, v = _pool(10, 16, 3, 64, torch.float32)
    blocks, lens = _tables(ends, 4, 10, 16), torch.tensor(ends, dtype=torch.int32)
    q = _queries(6, 9, 3, 64, torch.float32)
    batched = PagedDecodeAttention(blocks, lens, k, v, 9)(0, q)
    for i in range(6):
        alone = PagedDecodeAttention(blocks[i : i + 1].clone(), lens[i : i + 1].clone(), k, v, 9)
        assert torch.equal(alone(0, q[i : i + 1]), batched[i : i + 1])
    order = torch.tensor([5, 2, 0, 4])
    shuffled = PagedDecodeAttention(blocks[order].clone(), lens[order].clone(), k, v, 9)
    assert torch.equal(shuffled(0, q[order]), batched[order])


def _check_new_tables_and_ends_in_the_same_tensors_are_read() -> None:
    """What a CUDA graph's replay does: the same object, its tensors rewritten in place."""
    k, v = _pool(12, 16, 3, 64, torch.float32)
    blocks, ends = _tables([5, 20], 6, 12, 16), torch.tensor([5, 20], dtype=torch.int32)
    q = _queries(2, 9, 3, 64, torch.float32)
    attention = PagedDecodeAttention(blocks, ends, k, v, 9)
    before = attention(0, q)
    blocks.copy_(_tables([90, 33], 6, 12, 16, seed=7))
    ends.copy_(torch.tensor([90, 33]))
    after = attention(0, q)
    _agrees(after, _reference(q, k, v, blocks, ends))
    assert not torch.allclose(before, after)
    out = torch.empty_like(after)
    assert attention(0, q, out=out) is out and torch.equal(out, after)


def _check_the_layer_index_picks_the_layer() -> None:
    k, v = _pool(6, 16, 3, 64, torch.float32, layers=3)
    blocks, ends = _tables([30, 50], 4, 6, 16), torch.tensor([30, 50], dtype=torch.int32)
    q = _queries(2, 9, 3, 64, torch.float32)
    attention = PagedDecodeAttention(blocks, ends, k, v, 9)
    outs = [attention(layer, q) for layer in range(3)]
    for layer, out in enumerate(outs):
        _agrees(out, _reference(q, k, v, blocks, ends, layer))
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[1], outs[2])


def _check_an_empty_context_gives_zeros_and_a_table_outside_the_pool_nan() -> None:
    k, v = _pool(6, 16, 3, 64, torch.float32)
    blocks = _tables([20, 0, 20, 20, 70], 4, 6, 16)
    blocks[2, 1] = 6  # past the pool, inside the context
    blocks[3, 3] = -1  # past the context: never read
    ends = torch.tensor([20, 0, 20, 20, 70], dtype=torch.int32)  # 70 > 4 blocks of 16
    q = _queries(5, 9, 3, 64, torch.float32)
    out = PagedDecodeAttention(blocks, ends, k, v, 9)(0, q)
    assert torch.equal(out[1], torch.zeros(9 * 64))
    assert out[2].isnan().all() and out[4].isnan().all()
    keep = torch.tensor([0, 3])
    _agrees(out[keep], _reference(q[keep], k, v, blocks[keep], ends[keep]))


def _check_the_interpreter_runs_cpu_tensors_only() -> None:
    assert available(CPU, torch.float16, 64) is None
    assert "interpret" in str(available(torch.device("cuda"), torch.float16, 64))


def _check_the_start_up_probe_passes_a_good_kernel_and_names_a_bad_one() -> None:
    from backend.model import paged_gpu

    probe = paged_gpu.checked.__wrapped__  # type: ignore[attr-defined]  # uncached
    assert probe(CPU, torch.float32, 9, 3, 64) is None
    assert probe(CPU, torch.float16, 4, 4, 64) is None
    assert "power of two" in probe(CPU, torch.float32, 9, 3, 48)
    real = PagedDecodeAttention.__call__
    try:  # a kernel that computes something else, then one that cannot run
        PagedDecodeAttention.__call__ = lambda self, layer, q, out=None: q.reshape(q.shape[0], -1)  # type: ignore[method-assign]
        assert "disagrees with float32" in probe(CPU, torch.float32, 9, 3, 64)

        def fails(self: PagedDecodeAttention, layer: int, q: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("no kernel image is available")

        PagedDecodeAttention.__call__ = fails  # type: ignore[method-assign, assignment]
        assert "no kernel image" in probe(CPU, torch.float32, 9, 3, 64)
    finally:
        PagedDecodeAttention.__call__ = real  # type: ignore[method-assign]


def _check_misshapen_inputs_are_refused() -> None:
    k, v = _pool(6, 16, 3, 64, torch.float32, layers=2)
    blocks, ends = _tables([20, 9], 4, 6, 16), torch.tensor([20, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="int32"):
        PagedDecodeAttention(blocks.long(), ends, k, v, 9)
    with pytest.raises(ValueError, match="heads"):
        PagedDecodeAttention(blocks, ends, k, v, 8)
    attention = PagedDecodeAttention(blocks, ends, k, v, 9)
    q = _queries(2, 9, 3, 64, torch.float32)
    with pytest.raises(ValueError, match="layer"):
        attention(2, q)
    with pytest.raises(ValueError, match="heads dense"):
        attention(0, q.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="float32"):
        attention(0, q.half())


INTERPRETED: dict[str, Callable[[], None]] = {
    f.__name__.removeprefix("_check_"): f
    for f in (
        _check_agrees_with_float32,
        _check_a_query_gets_its_bits_alone_and_in_any_batch,
        _check_new_tables_and_ends_in_the_same_tensors_are_read,
        _check_the_layer_index_picks_the_layer,
        _check_an_empty_context_gives_zeros_and_a_table_outside_the_pool_nan,
        _check_the_interpreter_runs_cpu_tensors_only,
        _check_the_start_up_probe_passes_a_good_kernel_and_names_a_bad_one,
        _check_misshapen_inputs_are_refused,
    )
}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, str]:
    """Every check's traceback ('' where it passed), run in Triton's interpreter in a child."""
    pytest.importorskip("triton", reason="triton is not installed: the kernel cannot run")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    child = [sys.executable, "-W", "error", "-m", "tests.backend.model.test_paged_gpu"]
    done = subprocess.run(child, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results: dict[str, str] = json.loads(done.stdout)
    return results


@pytest.mark.parametrize("check", list(INTERPRETED))
def test_in_the_interpreter(interpreted: dict[str, str], check: str) -> None:
    assert interpreted[check] == "", interpreted[check]


def test_what_the_kernel_cannot_run_is_named() -> None:
    assert "int8" in str(available(CPU, torch.int8, 64))
    assert "power of two" in str(available(CPU, torch.float16, 48))
    assert "power of two" in str(available(CPU, torch.float16, 512))
    assert available(torch.device("meta"), torch.float16, 64) is not None


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="this process runs Triton's interpreter"
)
def test_a_cpu_pool_is_refused_without_the_interpreter() -> None:
    k, v = _pool(4, 16, 3, 64, torch.float16)
    blocks, ends = _tables([9], 1, 4, 16), torch.tensor([9], dtype=torch.int32)
    assert available(CPU, torch.float16, 64) is not None
    with pytest.raises(RuntimeError, match="does not run here"):
        PagedDecodeAttention(blocks, ends, k, v, 9)


@pytest.mark.skipif(ON_CUDA is not None, reason=f"the kernel does not run on CUDA here: {ON_CUDA}")
def test_a_cuda_graph_replays_new_tables_and_ends() -> None:
    """Captured once, replayed with new tables, ends and queries written into its tensors: the
    same bits as an uncaptured call, and float32's answer."""
    dev = torch.device("cuda")
    k, v = (t.to(dev) for t in _pool(16, 16, 3, 64, torch.bfloat16, layers=2))
    blocks = _tables([1, 40], 6, 16, 16).to(dev)
    ends = torch.tensor([1, 40], dtype=torch.int32, device=dev)
    q = _queries(2, 9, 3, 64, torch.bfloat16).to(dev)
    attention = PagedDecodeAttention(blocks, ends, k, v, 9)
    attention(1, q)  # compiles before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(1, q)
    for seed, lens in ((3, [17, 96]), (4, [80, 2])):
        blocks.copy_(_tables(lens, 6, 16, 16, seed=seed))
        ends.copy_(torch.tensor(lens))
        q.copy_(_queries(2, 9, 3, 64, torch.bfloat16, seed=seed))
        graph.replay()
        eager = PagedDecodeAttention(blocks.clone(), ends.clone(), k, v, 9)(1, q)
        assert torch.equal(out, eager)
        _agrees(out.cpu(), _reference(q.cpu(), k.cpu(), v.cpu(), blocks.cpu(), ends.cpu(), 1))


def _run_checks() -> dict[str, str]:
    results = {}
    for name, check in INTERPRETED.items():
        try:
            check()
            results[name] = ""
        except Exception:
            results[name] = traceback.format_exc()
    return results


if __name__ == "__main__":
    print(json.dumps(_run_checks()))
