"""The C source of our own CPU kernels (built by backend.model.native_build): bfloat16 dot
products for generated rows and e^x by a polynomial of our own, here; decode attention
(native_c_decode), prompt attention (native_c_prompt) and whole decoder layers (native_c_layers)
after them.

Invariant: every output is computed by one thread in one fixed order, whatever the call's other
rows or queries: a row or a query gets the same bits alone and in any batch.
"""

from __future__ import annotations

from typing import Final

from backend.model.native_c_decode import DECODE
from backend.model.native_c_layers import LAYERS
from backend.model.native_c_prompt import PROMPT

COMMON: Final = r"""
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

/* lanes_sum of 16 vectors at once, lane j the sum of v[j]: the same additions of the same
   lanes in the same tree (halves of 256, of 128, then pairs apart by 2, then by 1), done for
   all 16 by shuffles, so every sum has lanes_sum's bits at a fraction of the instructions. */
static inline __m512 lanes_sums16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int m = 0; m < 8; m++)
    t[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0xEE));
  for (int m = 0; m < 4; m++)  /* block j of u[m]: v[4m + j] */
    u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], 0xDD));
  for (int m = 0; m < 2; m++)
    w[m] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  /* lane 4j + t of r holds v[j + 4t] */
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, r);
}

/* to_bf16 of 16 floats at once: the same integer steps, so the same bits. */
static inline __m256i to_bf16x16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(
      r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

#define LOAD(p) ((__m512bh)_mm512_loadu_si512((const void*)(p)))
/* How far ahead of its reads a thread asks for its weight rows (into L2): a thread reads its
   rows as one stream, and a weight is read once per call, so what the products wait for is
   memory; the core's own prefetcher alone leaves it idle for much of that wait. */
#define AHEAD 8192
#define FETCH(p) _mm_prefetch((const char*)(p) + AHEAD, _MM_HINT_T1)
#define LOADM(p) ((__m512bh)_mm512_maskz_loadu_epi16(mask, (p)))

/* Weight row n against x rows m0 .. m0+MB-1 (MB <= 4: a constant once inlined). Every output
   has its own accumulator, fed its row's 32 products at a time in order, then summed across
   lanes (lanes_sum) and rounded: the same instructions in the same order for any MB and M. */
static inline __attribute__((always_inline)) void tile(const uint16_t* x, const uint16_t* w,
    uint16_t* y, int m0, const int MB, int n, int N, int K, int full, __mmask32 mask) {
  __m512 a[4];
  for (int i = 0; i < 4; i++) a[i] = _mm512_setzero_ps();
  const uint16_t* xr = x + (size_t)m0 * K;
  const uint16_t* w0 = w + (size_t)n * K;
  for (int k = 0; k < full; k += 32) {
    FETCH(w0 + k);
    const __m512bh v0 = LOAD(w0 + k);
    for (int i = 0; i < MB; i++) a[i] = _mm512_dpbf16_ps(a[i], LOAD(xr + (size_t)i * K + k), v0);
  }
  if (mask) {
    const __m512bh v0 = LOADM(w0 + full);
    for (int i = 0; i < MB; i++)
      a[i] = _mm512_dpbf16_ps(a[i], LOADM(xr + (size_t)i * K + full), v0);
  }
  for (int i = 0; i < MB; i++) y[(size_t)(m0 + i) * N + n] = to_bf16(lanes_sum(a[i]));
}

/* Weight rows n and n+1 against x rows m0 .. m0+MB-1 (MB <= 8): tile's accumulators and
   their feeding for up to 16 outputs at once, then lanes_sums16 and one rounding for all: the
   same bits as tile, with each weight load shared by eight rows and one reduction for 16. */
static inline __attribute__((always_inline)) void tile_pair(const uint16_t* x, const uint16_t* w,
    uint16_t* y, int m0, const int MB, int n, int N, int K, int full, __mmask32 mask) {
  __m512 a[16];
  for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
  const uint16_t* xr = x + (size_t)m0 * K;
  const uint16_t* w0 = w + (size_t)n * K;
  const uint16_t* w1 = w0 + K;
  for (int k = 0; k < full; k += 32) {
    FETCH(w0 + 2 * k);  /* the two rows are one stream of 2K values, read two lines a step */
    FETCH(w0 + 2 * k + 32);
    const __m512bh v0 = LOAD(w0 + k), v1 = LOAD(w1 + k);
    for (int i = 0; i < MB; i++) {
      const __m512bh xv = LOAD(xr + (size_t)i * K + k);
      a[2 * i] = _mm512_dpbf16_ps(a[2 * i], xv, v0);
      a[2 * i + 1] = _mm512_dpbf16_ps(a[2 * i + 1], xv, v1);
    }
  }
  if (mask) {
    const __m512bh v0 = LOADM(w0 + full), v1 = LOADM(w1 + full);
    for (int i = 0; i < MB; i++) {
      const __m512bh xv = LOADM(xr + (size_t)i * K + full);
      a[2 * i] = _mm512_dpbf16_ps(a[2 * i], xv, v0);
      a[2 * i + 1] = _mm512_dpbf16_ps(a[2 * i + 1], xv, v1);
    }
  }
  uint32_t pairs[8];  /* output pair i: row m0 + i at n and n + 1 */
  _mm256_storeu_si256((__m256i*)pairs, to_bf16x16(lanes_sums16(a)));
  for (int i = 0; i < MB; i++) memcpy(y + (size_t)(m0 + i) * N + n, pairs + i, 4);
}

#define PAIRS() do { \
    int m0 = 0; \
    for (; m0 + 8 <= M; m0 += 8) tile_pair(x, w, y, m0, 8, n, N, K, full, mask); \
    switch (M - m0) { \
      case 1: tile_pair(x, w, y, m0, 1, n, N, K, full, mask); break; \
      case 2: tile_pair(x, w, y, m0, 2, n, N, K, full, mask); break; \
      case 3: tile_pair(x, w, y, m0, 3, n, N, K, full, mask); break; \
      case 4: tile_pair(x, w, y, m0, 4, n, N, K, full, mask); break; \
      case 5: tile_pair(x, w, y, m0, 5, n, N, K, full, mask); break; \
      case 6: tile_pair(x, w, y, m0, 6, n, N, K, full, mask); break; \
      case 7: tile_pair(x, w, y, m0, 7, n, N, K, full, mask); break; \
      default: break; \
    } } while (0)

#define ROWS() do { \
    int m0 = 0; \
    for (; m0 + 4 <= M; m0 += 4) tile(x, w, y, m0, 4, n, N, K, full, mask); \
    switch (M - m0) { \
      case 1: tile(x, w, y, m0, 1, n, N, K, full, mask); break; \
      case 2: tile(x, w, y, m0, 2, n, N, K, full, mask); break; \
      case 3: tile(x, w, y, m0, 3, n, N, K, full, mask); break; \
      default: break; \
    } } while (0)

/* y[M, N] = x[M, K] @ w[N, K]^T, all bfloat16, row-major. One or two rows: each weight row is
   read once, in order (one stream); more: weight rows in pairs, each load of a weight shared
   by up to eight rows and each load of x by two weights (tile_pair). */
void kvfence_gemv_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int M, int N, int K,
                       int threads) {
  const int full = K & ~31;
  const __mmask32 mask = (__mmask32)((1ull << (K - full)) - 1);
  if (M <= 2) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int n = 0; n < N; n++) ROWS();
  } else {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int n = 0; n < N; n += 2) {
      if (n + 1 < N) PAIRS(); else ROWS();
    }
  }
}

/* e^x for 16 floats by one fixed sequence of operations (range reduction to r = x - n ln 2,
   a degree-7 polynomial, then scaling by 2^n: Cephes' expf method, to about 1 ulp), never a
   library call whose implementation another host could change: the same bits from every build.
   Inputs below -87.3 (e^-inf included) give exactly 0; NaN gives NaN (min and max keep their
   second operand when either is NaN, so x goes second). */
static inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.33654f);
  const __mmask16 zero = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  x = _mm512_max_ps(low, _mm512_min_ps(_mm512_set1_ps(88.37626f), x));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                    _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps((__mmask16)~zero, p, n);
}

/* 16 bfloat16 values widened to float32 (exact). */
static inline __m512 widen(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

"""

# One library: the products, decode attention, prompt attention, then the layers.
SOURCE: Final = COMMON + DECODE + PROMPT + LAYERS
