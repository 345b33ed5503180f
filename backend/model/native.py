"""A matrix kernel of our own for the rows a decode step projects (few rows, every weight read
from memory once): bfloat16 dot products on AVX-512, built from C with the host's compiler on
first use and kept in a cache folder. oneDNN reads a weight at about half the memory's speed at
one or two rows; this kernel streams each weight row once, in order.

Invariant: every output is one accumulator over its row in order, reduced and rounded the same
way whatever the row count, the call's other rows or the thread that runs it, so a row gets the
same bits alone and in any batch. Where it cannot be built, loaded or does not check out against
float32, it is not used (and `unavailable()` says why); it never changes what a host without it
computes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

Kernel = Callable[[torch.Tensor], torch.Tensor]  # x: [M, K] -> [M, N]

OFF_ENV: Final = "KVFENCE_NATIVE_KERNELS"  # "0": never build or use it
_FLAGS: Final = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-fopenmp", "-shared", "-fPIC")
_CPU_FLAGS: Final = ("avx512f", "avx512bw", "avx512_bf16")

SOURCE: Final = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t to_bf16(float f) {  /* round to nearest even, as torch does */
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* The 16 lanes' sum in one fixed order, written out (not a compiler builtin whose expansion
   another compiler version could order otherwise): the same bits from every build. */
static inline float lanes_sum(__m512 v) {
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}

#define LOAD(p) ((__m512bh)_mm512_loadu_si512((const void*)(p)))
#define LOADM(p) ((__m512bh)_mm512_maskz_loadu_epi16(mask, (p)))

/* Weight rows n .. n+NB-1 against x rows m0 .. m0+MB-1 (NB <= 2, MB <= 4: constants once
   inlined). Every output has its own accumulator, fed its row's 32 products at a time in order,
   then reduced and rounded: the same instructions in the same order for any NB, MB and M. */
static inline __attribute__((always_inline)) void tile(const uint16_t* x, const uint16_t* w,
    uint16_t* y, int m0, const int MB, int n, const int NB, int N, int K, int full,
    __mmask32 mask) {
  __m512 a[4][2];
  for (int i = 0; i < 4; i++) { a[i][0] = _mm512_setzero_ps(); a[i][1] = _mm512_setzero_ps(); }
  const uint16_t* xr = x + (size_t)m0 * K;
  const uint16_t* w0 = w + (size_t)n * K;
  const uint16_t* w1 = w0 + K;
  for (int k = 0; k < full; k += 32) {
    __m512bh v0 = LOAD(w0 + k), v1 = NB > 1 ? LOAD(w1 + k) : v0;
    for (int i = 0; i < MB; i++) {
      __m512bh xv = LOAD(xr + (size_t)i * K + k);
      a[i][0] = _mm512_dpbf16_ps(a[i][0], xv, v0);
      if (NB > 1) a[i][1] = _mm512_dpbf16_ps(a[i][1], xv, v1);
    }
  }
  if (mask) {
    __m512bh v0 = LOADM(w0 + full), v1 = NB > 1 ? LOADM(w1 + full) : v0;
    for (int i = 0; i < MB; i++) {
      __m512bh xv = LOADM(xr + (size_t)i * K + full);
      a[i][0] = _mm512_dpbf16_ps(a[i][0], xv, v0);
      if (NB > 1) a[i][1] = _mm512_dpbf16_ps(a[i][1], xv, v1);
    }
  }
  for (int i = 0; i < MB; i++) {
    y[(size_t)(m0 + i) * N + n] = to_bf16(lanes_sum(a[i][0]));
    if (NB > 1) y[(size_t)(m0 + i) * N + n + 1] = to_bf16(lanes_sum(a[i][1]));
  }
}

#define ROWS(NB) do { \
    int m0 = 0; \
    for (; m0 + 4 <= M; m0 += 4) tile(x, w, y, m0, 4, n, NB, N, K, full, mask); \
    switch (M - m0) { \
      case 1: tile(x, w, y, m0, 1, n, NB, N, K, full, mask); break; \
      case 2: tile(x, w, y, m0, 2, n, NB, N, K, full, mask); break; \
      case 3: tile(x, w, y, m0, 3, n, NB, N, K, full, mask); break; \
      default: break; \
    } } while (0)

/* y[M, N] = x[M, K] @ w[N, K]^T, all bfloat16, row-major. One or two rows: each weight row is
   read once, in order (one stream); more: two weight rows share each load of x. */
void kvfence_gemv_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int M, int N, int K,
                       int threads) {
  const int full = K & ~31;
  const __mmask32 mask = (__mmask32)((1ull << (K - full)) - 1);
  if (M <= 2) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int n = 0; n < N; n++) ROWS(1);
  } else {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int n = 0; n < N; n += 2) {
      if (n + 1 < N) ROWS(2); else ROWS(1);
    }
  }
}
"""


def unavailable() -> str | None:
    """Why the kernel is not used on this host (None: it is)."""
    return _loaded()[1]


def gemv_kernel(weight: torch.Tensor) -> Kernel | None:
    """x @ weight.T for bfloat16 rows on this CPU, or None where the kernel is not used."""
    fn = _loaded()[0]
    if fn is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
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


@functools.cache
def _loaded() -> tuple[Callable[..., None] | None, str | None]:
    if os.environ.get(OFF_ENV) == "0":
        return None, f"{OFF_ENV}=0"
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None, f"not built for {platform.system()} on {platform.machine()}"
    missing = [f for f in _CPU_FLAGS if f not in _cpu_flags()]
    if missing or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None, "this CPU (or its cap) lacks " + (", ".join(missing) or "AVX-512 in torch")
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if compiler is None:
        return None, "no C compiler (gcc or cc) on PATH"
    try:
        fn = _build(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"build failed: {str(exc).splitlines()[0][:200]}"
    problem = _check(fn)
    return (None, problem) if problem else (fn, None)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _build(compiler: str) -> Callable[..., None]:
    """Compile once per source, compiler and flags into the cache folder (written under a
    temporary name, then renamed: processes starting together never load half a file)."""
    # The compiler is the one this process's own PATH (or CC) names: no input from a request.
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)  # noqa: S603
    key = hashlib.sha256("\0".join([SOURCE, version.stdout, *_FLAGS]).encode()).hexdigest()[:16]
    folder = _cache_folder()
    lib = folder / f"kvfence-gemv-{key}.so"
    if not lib.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so")
        os.close(fd)
        src = Path(tmp).with_suffix(".c")
        try:
            src.write_text(SOURCE)
            cmd = [compiler, *_FLAGS, str(src), "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # noqa: S603
            if done.returncode:
                raise OSError(done.stderr.strip() or f"{compiler} exited {done.returncode}")
            os.replace(tmp, lib)
        finally:
            src.unlink(missing_ok=True)
            Path(tmp).unlink(missing_ok=True)
    _own(lib)
    # torch is loaded first: the library's OpenMP is torch's own (one pool of threads).
    fn = ctypes.CDLL(str(lib)).kvfence_gemv_bf16
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    fn.restype = None
    return fn


def _cache_folder() -> Path:
    """The user's cache folder, else one of its own under the temporary folder: either only if
    this user owns it and no one else may write there (a library loaded from it runs as us)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "kvfence" / "native"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return _own(folder)
    except OSError:
        pass
    folder = Path(tempfile.gettempdir()) / f"kvfence-native-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return _own(folder)


def _own(path: Path) -> Path:
    """`path` if this user owns it and neither its group nor others may write to it."""
    st = path.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or path.is_symlink():
        raise OSError(f"{path} is not this user's alone: not used")
    return path


def _check(fn: Callable[..., None]) -> str | None:
    """The built kernel against float32 on odd shapes (a tail in K, an odd N, 1-9 rows)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 1000, generator=gen).to(torch.bfloat16)
    for m in (1, 2, 3, 5, 9):
        x = torch.randn(m, 1000, generator=gen).to(torch.bfloat16)
        y = torch.empty(m, 37, dtype=torch.bfloat16)
        fn(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, 37, 1000, 1)
        ref = x.float() @ w.float().T
        if not torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-1):
            return f"the built kernel disagrees with float32 at {m} rows"
    return None
