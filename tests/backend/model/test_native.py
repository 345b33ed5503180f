"""Our own kernel for generated rows: it agrees with float32, gives a row the same bits alone, in
a call of any size and on any thread count, is what a projection's generated rows use (prompt
rows stay with oneDNN), and is not used, with a reason, where it is switched off or cannot be
built. The kernel's own checks need a CPU with AVX-512 BF16; the rest runs anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from backend.model import native, native_build
from backend.model.linear import Projection, RowPlanner
from backend.model.row_plan import GENERATED_MAX

REPO = Path(__file__).resolve().parents[3]
needs_kernel = pytest.mark.skipif(
    native.unavailable() is not None, reason=f"our kernel is not used here: {native.unavailable()}"
)


def _rows(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize(("n", "k"), [(37, 1000), (960, 576), (576, 1536), (5, 31)])
def test_it_agrees_with_float32(n: int, k: int) -> None:
    w = _rows(n, k, 1)
    kernel = native.gemv_kernel(w)
    assert kernel is not None
    for m in (1, 2, 3, 4, 5, 8, 33):
        x = _rows(m, k, m)
        ref = x.float() @ w.float().T
        # bfloat16 rounding of the output, as F.linear's own; nothing more.
        torch.testing.assert_close(kernel(x).float(), ref, rtol=8e-3, atol=1e-2)


@needs_kernel
def test_a_row_gets_the_same_bits_alone_in_any_call_and_on_any_thread_count() -> None:
    w = _rows(576, 1000, 2)  # K with a tail: the masked last step runs too
    kernel = native.gemv_kernel(w)
    assert kernel is not None
    x = _rows(GENERATED_MAX + 1, 1000, 3)
    alone = torch.cat([kernel(x[i : i + 1]) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            for m in range(1, x.shape[0] + 1):  # one and two rows take another path than 3+
                assert torch.equal(kernel(x[:m]), alone[:m]), (count, m)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_generated_rows_use_it_and_prompt_rows_stay_with_onednn() -> None:
    w = _rows(960, 576, 4)
    proj = Projection(w, RowPlanner())
    kernel = native.gemv_kernel(w)
    assert proj.native and kernel is not None
    decode = _rows(8, 576, 5)
    assert torch.equal(proj(decode, generated=8), kernel(decode))
    chunk = _rows(proj.plan.prompt_sizes[-1], 576, 6)
    ours = kernel(chunk)
    theirs = proj(chunk, generated=0)
    assert torch.allclose(theirs.float(), F.linear(chunk, w).float(), rtol=1e-2, atol=1e-2)
    assert not torch.equal(theirs, ours)  # another kernel: prompt rows never go to ours


def test_a_float32_weight_never_uses_it() -> None:
    w = torch.randn(64, 128)
    assert native.gemv_kernel(w) is None
    assert not Projection(w, RowPlanner()).native


def _unavailable(env: dict[str, str]) -> str:
    code = "from backend.model import native; print(native.unavailable())"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, **env}, timeout=120,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_host_that_can_run_our_kernels_uses_them() -> None:
    """The kernels' tests skip where the kernels are not used, so not being used must be for a
    reason outside them: switched off, this platform or CPU, no compiler. A kernel that fails
    its own check against float32, or a build that fails, fails here instead of skipping."""
    why = native.unavailable()
    outside = (f"{native.OFF_ENV}=0", "not built for ", "this CPU ", "no C compiler")
    assert why is None or why.startswith(outside), why


def test_switched_off_it_is_not_used_and_says_so() -> None:
    assert _unavailable({native.OFF_ENV: "0"}) == f"{native.OFF_ENV}=0"


@needs_kernel
def test_a_compiler_that_fails_leaves_onednn_in_place(tmp_path: Path) -> None:
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: cannot compile here' >&2\nexit 1\n")
    failing.chmod(0o755)
    why = _unavailable({"CC": str(failing), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert why.startswith("build failed: cc: cannot compile here"), why


@needs_kernel
def test_it_is_built_once_and_kept(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert _unavailable(env) == "None"
    built = list((tmp_path / "kvfence" / "native").iterdir())
    assert [p.suffix for p in built] == [".so"]  # no half-written or source file left
    stamp = built[0].stat().st_mtime_ns
    assert _unavailable(env) == "None"
    assert built[0].stat().st_mtime_ns == stamp


@needs_kernel
def test_a_cache_folder_others_may_write_to_is_never_loaded_from(tmp_path: Path) -> None:
    shared = tmp_path / "kvfence" / "native"
    shared.mkdir(parents=True)
    planted = shared / "kvfence-gemv-0000000000000000.so"
    planted.write_bytes(b"not a library")
    shared.chmod(0o777)  # anyone could have put a library there
    with pytest.raises(OSError, match="not this user's alone"):
        native_build._owned(shared)
    assert _unavailable({"XDG_CACHE_HOME": str(tmp_path)}) == "None"  # built elsewhere, its own
    assert sorted(p.name for p in shared.iterdir()) == [planted.name]


@needs_kernel
def test_a_prebuilt_library_is_loaded_where_the_cache_folder_holds_none(tmp_path: Path) -> None:
    """As in the backend image: built ahead of time, then found there by a process whose own
    cache folder is empty (a container's writable folders may not hold code that runs)."""
    prebuilt = tmp_path / "prebuilt"
    done = subprocess.run(
        [sys.executable, "-m", "backend.model.native_build", str(prebuilt)], capture_output=True,
        text=True, cwd=REPO, timeout=120, check=True,
    )  # fmt: skip
    [lib] = prebuilt.iterdir()
    assert done.stdout.strip() == str(lib) and lib.suffix == ".so"
    cache = tmp_path / "cache"
    env = {native_build.PREBUILT_ENV: str(prebuilt), "XDG_CACHE_HOME": str(cache)}
    assert _unavailable(env) == "None"
    assert not (cache / "kvfence" / "native").exists() or not any(
        (cache / "kvfence" / "native").iterdir()
    )


@needs_kernel
def test_a_prebuilt_folder_others_may_write_to_is_never_loaded_from(tmp_path: Path) -> None:
    prebuilt = tmp_path / "prebuilt"
    subprocess.run(
        [sys.executable, "-m", "backend.model.native_build", str(prebuilt)], capture_output=True,
        cwd=REPO, timeout=120, check=True,
    )  # fmt: skip
    prebuilt.chmod(0o777)  # anyone could have swapped the library
    env = {native_build.PREBUILT_ENV: str(prebuilt), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert "not this user's alone" in _unavailable(env)
