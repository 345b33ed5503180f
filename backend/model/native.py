"""Our own CPU kernels (backend.model.native_c): bfloat16 dot products for generated rows, and
attention of decodes and of prompt rows read in place from the paged KV pool. Built
from C with the host's compiler on first use and kept in a cache folder. oneDNN reads a weight at
about half the memory's speed at one or two rows; ours streams each weight row once, in order.
Attention reads each query's context where it lies, without gathering it into a copy; a
prompt's rows share every key and value they read, in tiles.

Invariant: every output is reduced and rounded the same way whatever the row count, the call's
other rows or queries, or the thread that runs it, so a row gets the same bits alone and in any
batch. Where the kernels cannot be built, loaded or do not check out against float32, they are
not used (and `unavailable()` says why); they never change what a host without them computes.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

from backend.model import native_build

Kernel = Callable[[torch.Tensor], torch.Tensor]  # x: [M, K] -> [M, N]

OFF_ENV: Final = "KVFENCE_NATIVE_KERNELS"  # "0": never build or use it
_CPU_FLAGS: Final = ("avx512f", "avx512bw", "avx512_bf16")
_MAX_HEAD_DIM: Final = 256  # MAX_CHUNKS in the source
PROMPT_GROUP_MAX: Final = 48  # TILE_ROWS in the source: query heads per KV head


def unavailable() -> str | None:
    """Why our kernels are not used on this host (None: they are)."""
    return _loaded()[1]


def gemv_kernel(weight: torch.Tensor) -> Kernel | None:
    """x @ weight.T for bfloat16 rows on this CPU, or None where the kernel is not used."""
    lib = _loaded()[0]
    if lib is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
    fn = lib.kvfence_gemv_bf16
    w = weight.contiguous()
    n, k = w.shape

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.dtype != torch.bfloat16 or x.shape[1] != k:
            raise ValueError(
                f"rows {tuple(x.shape)} {x.dtype} against a [{n}, {k}] bfloat16 weight"
            )
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
        if x.shape[0]:
            fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.shape[0], n, k, torch.get_num_threads())
        return y

    return run


def attends(head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether decode attention of this shape goes to our kernel."""
    return (
        _loaded()[0] is not None
        and dtype == torch.bfloat16
        and device.type == "cpu"
        and head_dim % 16 == 0
        and head_dim <= _MAX_HEAD_DIM
    )


def library() -> ctypes.CDLL | None:
    """The built and checked library, or None where it is not used (see `unavailable`)."""
    return _loaded()[0]


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get(OFF_ENV) == "0":
        return None, f"{OFF_ENV}=0"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None, f"not built for {platform.system()} on {platform.machine()}"
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None, "this CPU (or its cap) lacks " + (", ".join(missing) or "AVX-512 in torch")
    compiler = native_build.compiler()
    if compiler is None:
        return None, "no C compiler (gcc or cc) on PATH"
    try:
        lib = _open(native_build.library(compiler))
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"build failed: {str(exc).splitlines()[0][:200]}"
    problem = _check(lib)
    return (None, problem) if problem else (lib, None)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _open(lib: Path) -> ctypes.CDLL:
    """The built library, loaded, each function given its argument types."""
    # torch is loaded first: the library's OpenMP is torch's own (one pool of threads).
    loaded = ctypes.CDLL(str(lib))
    gemv = loaded.kvfence_gemv_bf16
    gemv.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    gemv.restype = None
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    for attention in (loaded.kvfence_decode_attention, loaded.kvfence_prompt_attention):
        attention.argtypes = [
            pointer, ctypes.c_long, pointer, pointer, pointer, integer, pointer, pointer,
            integer, integer, integer, integer, integer, ctypes.c_float, integer,
        ]  # fmt: skip
        attention.restype = None
    loaded.kvfence_rms_norm.argtypes = [pointer] * 3 + [integer] * 2 + [ctypes.c_float, integer]
    loaded.kvfence_rope.argtypes = [pointer] + [integer] * 4 + [pointer] * 3 + [integer]
    loaded.kvfence_swiglu.argtypes = [pointer] * 2 + [integer] * 3
    for fn in (loaded.kvfence_rms_norm, loaded.kvfence_rope, loaded.kvfence_swiglu):
        fn.restype = None
    return loaded


def _check(lib: ctypes.CDLL) -> str | None:
    """The built kernels against float32 on odd shapes: products with a tail in K, an odd N and
    1-9 rows; both attentions over scattered blocks with a part-filled last one; SwiGLU (our
    e^x) far into both tails."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 1000, generator=gen).to(torch.bfloat16)
    for m in (1, 2, 3, 5, 9):
        x = torch.randn(m, 1000, generator=gen).to(torch.bfloat16)
        y = torch.empty(m, 37, dtype=torch.bfloat16)
        lib.kvfence_gemv_bf16(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, 37, 1000, 1)
        ref = x.float() @ w.float().T
        if not torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-1):
            return f"the built kernel disagrees with float32 at {m} rows"
    # 19 rows of one prompt (a table of scattered blocks, the last part-filled), then 2 others.
    bs, hq, hkv, d = 4, 6, 2, 32
    k, v = torch.randn(2, 8 * bs, hkv, d, generator=gen).to(torch.bfloat16)
    q = torch.randn(21, hq, d, generator=gen).to(torch.bfloat16)
    blocks = torch.tensor([[5, 2, 7, 4, 6]] * 19 + [[1, 0, 3, 0, 0], [3, 1, 0, 0, 0]])
    blocks = blocks.to(torch.int32)
    ends = torch.tensor([*range(1, 20), 11, 3], dtype=torch.int32)
    ref = reference_attention(q, k, v, blocks, ends, bs)
    for kernel in (lib.kvfence_decode_attention, lib.kvfence_prompt_attention):
        out = torch.empty(21, hq * d, dtype=torch.bfloat16)
        kernel(
            q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), blocks.data_ptr(), 5,
            ends.data_ptr(), out.data_ptr(), 21, hq, hkv, d, bs, d**-0.5, 2,
        )  # fmt: skip
        if not torch.allclose(out.float(), ref, rtol=1e-2, atol=1e-2):
            return "the built attention disagrees with float32"
    gate_up = (torch.randn(3, 2 * 37, generator=gen) * 20).to(torch.bfloat16)  # a tail past 16s
    act = torch.empty(3, 37, dtype=torch.bfloat16)
    lib.kvfence_swiglu(gate_up.data_ptr(), act.data_ptr(), 3, 37, 2)
    gate, up = gate_up.float().chunk(2, dim=-1)
    if not torch.allclose(act.float(), torch.nn.functional.silu(gate) * up, rtol=1e-2, atol=1e-3):
        return "the built SwiGLU disagrees with float32"
    return None


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: torch.Tensor,
    ends: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """decode_attention's result in float32 by gathering each context (the check's yardstick)."""
    out = []
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        n = int(ends[b])
        pos = torch.arange(n)
        slots = blocks[b].long()[pos // block_size] * block_size + pos % block_size
        kb = k[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        vb = v[slots].float().repeat_interleave(group, dim=1).transpose(0, 1)
        weights = torch.softmax(
            q[b].float().unsqueeze(1) @ kb.transpose(1, 2) / q.shape[2] ** 0.5, -1
        )
        out.append((weights @ vb).reshape(-1))
    return torch.stack(out)
