"""The C source of our own CPU kernels (built by backend.model.native_build): bfloat16 dot
products for generated rows and decode attention read in place from the paged KV pool, here;
prompt attention (native_c_prompt) and whole decoder layers (native_c_layers) after them.

Invariant: every output is computed by one thread in one fixed order, whatever the call's other
rows or queries: a row or a query gets the same bits alone and in any batch.
"""

from __future__ import annotations

from typing import Final

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

/* 16 bfloat16 values widened to float32 (exact). */
static inline __m512 widen(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256((const __m256i*)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#define MAX_CHUNKS 16  /* head_dim <= 256, a multiple of 16 */

/* Decode attention over the paged pool, read in place (no gathered copy): query b, head hq
   attends positions 0 .. ends[b]-1 of its sequence, position l at slot
   blocks[b][l / bs] * bs + l % bs of k and v ([slots, Hkv, D]); its KV head is hq / (Hq / Hkv).
   q: row b at q + b * q_stride, [Hq, D]; out: [B, Hq * D]. Scores, softmax and the weighted
   sum are float32 in position order, one (b, hq) per task: a query's bits never depend on the
   call's other queries, its padding or the thread that runs it. */
void kvfence_decode_attention(const uint16_t* q, long q_stride, const uint16_t* k,
                              const uint16_t* v, const int32_t* blocks, int nb,
                              const int32_t* ends, uint16_t* out, int B, int Hq, int Hkv, int D,
                              int bs, float scale, int threads) {
  const int G = Hq / Hkv, C = D / 16;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int task = 0; task < B * Hq; task++) {
    const int b = task / Hq, hq = task % Hq, h = hq / G, len = ends[b];
    const int32_t* table = blocks + (size_t)b * nb;
    const uint16_t* qr = q + (size_t)b * q_stride + (size_t)hq * D;
    uint16_t* o = out + ((size_t)b * Hq + hq) * D;
    float* s = (float*)malloc(sizeof(float) * (size_t)(len > 0 ? len : 1));
    __m512 qv[MAX_CHUNKS], acc[MAX_CHUNKS];
    for (int c = 0; c < C; c++) { qv[c] = widen(qr + 16 * c); acc[c] = _mm512_setzero_ps(); }
    float top = -INFINITY;
    for (int l = 0; l < len; l++) {
      const size_t slot = (size_t)table[l / bs] * bs + l % bs;
      const uint16_t* kr = k + (slot * Hkv + h) * D;
      __m512 dot = _mm512_setzero_ps();
      for (int c = 0; c < C; c++) dot = _mm512_fmadd_ps(qv[c], widen(kr + 16 * c), dot);
      s[l] = lanes_sum(dot) * scale;
      if (s[l] > top) top = s[l];
    }
    float total = 0.0f;
    for (int l = 0; l < len; l++) {
      s[l] = expf(s[l] - top);
      total += s[l];
    }
    for (int l = 0; l < len; l++) {
      const size_t slot = (size_t)table[l / bs] * bs + l % bs;
      const uint16_t* vr = v + (slot * Hkv + h) * D;
      const __m512 p = _mm512_set1_ps(s[l]);
      for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(p, widen(vr + 16 * c), acc[c]);
    }
    const __m512 t = _mm512_set1_ps(len > 0 ? total : 1.0f);
    for (int c = 0; c < C; c++) {
      float f[16];
      _mm512_storeu_ps(f, _mm512_div_ps(acc[c], t));
      for (int j = 0; j < 16; j++) o[16 * c + j] = to_bf16(f[j]);
    }
    free(s);
  }
}

"""

# One library: the products and decode attention, prompt attention, then the layers.
SOURCE: Final = COMMON + PROMPT + LAYERS
