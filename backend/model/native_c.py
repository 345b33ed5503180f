"""The C source of our own CPU kernels (built by backend.model.native): bfloat16 dot products for
generated rows, whole decoder layers for them, and decode and prompt attention read in place
from the paged KV pool.

Invariant: every output is computed by one thread in one fixed order, whatever the call's other
rows or queries: a row or a query gets the same bits alone and in any batch.
"""

from __future__ import annotations

from typing import Final

SOURCE: Final = r"""
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

/* e^x for 16 floats by one fixed sequence of operations (range reduction to r = x - n ln 2,
   a degree-7 polynomial, then scaling by 2^n: Cephes' expf method, to about 1 ulp), never a
   library call whose implementation another host could change: the same bits from every build.
   Inputs below -87.3 (e^-inf included) give exactly 0. */
static inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(-87.33654f);
  const __mmask16 zero = _mm512_cmp_ps_mask(x, low, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.37626f)), low);
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

#define TILE_ROWS 48  /* query rows (tokens x the heads of one KV head) a task attends */

/* Scores of NV vectors of 16 query rows (QT: [NV][D/2][16] bfloat16 pairs) against keys
   [0, L) of one KV head: S[l][v] = scale * q.k (float32, the pairs of d summed in order),
   -inf where l >= the row's end; top[v]: each row's largest. Four keys share each load of QT. */
static inline __attribute__((always_inline)) void prompt_scores(
    const uint32_t* QT, const uint16_t* k, const int32_t* table, int bs, int Hkv, int h, int D,
    int L, const __m512i* endv, float scale, float* S, int stride, __m512* top, const int NV) {
  const int P = D / 2;
  const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
  for (int l0 = 0; l0 < L; l0 += 4) {
    const int nk = L - l0 < 4 ? L - l0 : 4;
    const uint32_t* kr[4];
    for (int j = 0; j < 4; j++) {
      const int l = l0 + (j < nk ? j : 0);
      kr[j] = (const uint32_t*)(k + (((size_t)table[l / bs] * bs + l % bs) * Hkv + h) * D);
    }
    __m512 a[4][3];
    for (int j = 0; j < 4; j++)
      for (int v = 0; v < NV; v++) a[j][v] = _mm512_setzero_ps();
    for (int p = 0; p < P; p++) {
      __m512bh qv[3];
      for (int v = 0; v < NV; v++)
        qv[v] = (__m512bh)_mm512_loadu_si512((const void*)(QT + ((size_t)v * P + p) * 16));
      for (int j = 0; j < 4; j++) {
        const __m512bh kb = (__m512bh)_mm512_set1_epi32((int)kr[j][p]);
        for (int v = 0; v < NV; v++) a[j][v] = _mm512_dpbf16_ps(a[j][v], qv[v], kb);
      }
    }
    for (int j = 0; j < nk; j++) {
      const __m512i at = _mm512_set1_epi32(l0 + j);
      for (int v = 0; v < NV; v++) {
        __m512 s = _mm512_mul_ps(a[j][v], sc);
        s = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(at, endv[v]), ninf, s);
        _mm512_storeu_ps(S + (size_t)(l0 + j) * stride + 16 * v, s);
        top[v] = _mm512_max_ps(top[v], s);
      }
    }
  }
}

/* out[r] += p[l][r] * V[l] over l < e for NR rows of one token (their weights at column r0 of
   each row of S), 16 values of d at a time, in position order. */
static inline __attribute__((always_inline)) void prompt_weighted(
    const float* S, int stride, int r0, const float* vf, int D, int e, const float* total,
    uint16_t* const* o, const int NR) {
  for (int c = 0; c < D; c += 16) {
    __m512 acc[4];
    for (int i = 0; i < NR; i++) acc[i] = _mm512_setzero_ps();
    for (int l = 0; l < e; l++) {
      const __m512 vv = _mm512_loadu_ps(vf + (size_t)l * D + c);
      for (int i = 0; i < NR; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(S[(size_t)l * stride + r0 + i]), vv, acc[i]);
    }
    for (int i = 0; i < NR; i++) {
      float f[16];
      _mm512_storeu_ps(f, _mm512_div_ps(acc[i], _mm512_set1_ps(total[r0 + i])));
      for (int j = 0; j < 16; j++) o[i][c + j] = to_bf16(f[j]);
    }
  }
}

/* prompt_weighted for D = 16 * C with NR * C <= 16: every accumulator held at once, so each
   weight is loaded once per position and each value once per row group; the same sums. */
static inline __attribute__((always_inline)) void prompt_weighted_held(
    const float* S, int stride, int r0, const float* vf, int e, const float* total,
    uint16_t* const* o, const int NR, const int C) {
  __m512 acc[4][4];
  for (int i = 0; i < NR; i++)
    for (int c = 0; c < C; c++) acc[i][c] = _mm512_setzero_ps();
  for (int l = 0; l < e; l++) {
    __m512 p[4];
    for (int i = 0; i < NR; i++) p[i] = _mm512_set1_ps(S[(size_t)l * stride + r0 + i]);
    for (int c = 0; c < C; c++) {
      const __m512 vv = _mm512_loadu_ps(vf + (size_t)l * C * 16 + 16 * c);
      for (int i = 0; i < NR; i++) acc[i][c] = _mm512_fmadd_ps(p[i], vv, acc[i][c]);
    }
  }
  for (int i = 0; i < NR; i++) {
    const __m512 t = _mm512_set1_ps(total[r0 + i]);
    for (int c = 0; c < C; c++) {
      float f[16];
      _mm512_storeu_ps(f, _mm512_div_ps(acc[i][c], t));
      for (int j = 0; j < 16; j++) o[i][16 * c + j] = to_bf16(f[j]);
    }
  }
}

/* One tile: tokens b0 .. b0+n-1 (one table, consecutive ends) with the G query heads of KV
   head h, scratch from the caller. Query row r is token r / G, head h * G + r % G. */
static void prompt_tile(const uint16_t* q, long q_stride, const uint16_t* k, const uint16_t* v,
                        const int32_t* table, const int32_t* ends, uint16_t* out, int b0, int n,
                        int h, int Hq, int Hkv, int D, int bs, float scale, uint32_t* QT,
                        float* vf, float* S) {
  const int G = Hq / Hkv, R = n * G, NV = (R + 15) / 16, P = D / 2, stride = NV * 16;
  const int L = ends[b0 + n - 1];
  memset(QT, 0, sizeof(uint32_t) * (size_t)NV * P * 16);
  int32_t lane_end[TILE_ROWS + 16];
  for (int r = 0; r < NV * 16; r++) {
    if (r >= R) { lane_end[r] = 1; continue; }  /* padding: a zero query over position 0 */
    const int t = r / G, g = r % G;
    lane_end[r] = ends[b0 + t];
    const uint16_t* row = q + (size_t)(b0 + t) * q_stride + (size_t)(h * G + g) * D;
    const uint32_t* qr = (const uint32_t*)row;
    for (int p = 0; p < P; p++) QT[((size_t)(r / 16) * P + p) * 16 + r % 16] = qr[p];
  }
  for (int l = 0; l < L; l++) {
    const uint16_t* vr = v + (((size_t)table[l / bs] * bs + l % bs) * Hkv + h) * D;
    for (int c = 0; c < D; c += 16) _mm512_storeu_ps(vf + (size_t)l * D + c, widen(vr + c));
  }
  __m512i endv[TILE_ROWS / 16 + 1];
  __m512 top[TILE_ROWS / 16 + 1], tot[TILE_ROWS / 16 + 1];
  for (int w = 0; w < NV; w++) {
    endv[w] = _mm512_loadu_si512((const void*)(lane_end + 16 * w));
    top[w] = _mm512_set1_ps(-INFINITY);
    tot[w] = _mm512_setzero_ps();
  }
  for (int w = 0; w < NV; w += 3) {  /* each vector's scores are the same sums whatever NV */
    const int nv = NV - w < 3 ? NV - w : 3;
    const uint32_t* qt = QT + (size_t)w * P * 16;
    float* s = S + 16 * w;
    const __m512i* e = endv + w;
    __m512* m = top + w;
    if (nv == 3) prompt_scores(qt, k, table, bs, Hkv, h, D, L, e, scale, s, stride, m, 3);
    else if (nv == 2) prompt_scores(qt, k, table, bs, Hkv, h, D, L, e, scale, s, stride, m, 2);
    else prompt_scores(qt, k, table, bs, Hkv, h, D, L, e, scale, s, stride, m, 1);
  }
  for (int l = 0; l < L; l++)
    for (int w = 0; w < NV; w++) {
      float* s = S + (size_t)l * stride + 16 * w;
      const __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(s), top[w]));
      _mm512_storeu_ps(s, p);
      tot[w] = _mm512_add_ps(tot[w], p);  /* each row's total in position order */
    }
  float total[TILE_ROWS + 16];
  for (int w = 0; w < NV; w++) _mm512_storeu_ps(total + 16 * w, tot[w]);
  for (int t = 0; t < n; t++) {
    const int e = ends[b0 + t];
    for (int g = 0; g < G; g += 4) {
      const int nr = G - g < 4 ? G - g : 4;
      uint16_t* o[4];
      for (int i = 0; i < nr; i++)
        o[i] = out + (size_t)(b0 + t) * Hq * D + (size_t)(h * G + g + i) * D;
      const int r0 = t * G + g;
      if (D == 64) {  /* four rows of 64: 16 accumulators */
        switch (nr) {
          case 4: prompt_weighted_held(S, stride, r0, vf, e, total, o, 4, 4); break;
          case 3: prompt_weighted_held(S, stride, r0, vf, e, total, o, 3, 4); break;
          case 2: prompt_weighted_held(S, stride, r0, vf, e, total, o, 2, 4); break;
          default: prompt_weighted_held(S, stride, r0, vf, e, total, o, 1, 4); break;
        }
        continue;
      }
      switch (nr) {
        case 4: prompt_weighted(S, stride, r0, vf, D, e, total, o, 4); break;
        case 3: prompt_weighted(S, stride, r0, vf, D, e, total, o, 3); break;
        case 2: prompt_weighted(S, stride, r0, vf, D, e, total, o, 2); break;
        default: prompt_weighted(S, stride, r0, vf, D, e, total, o, 1); break;
      }
    }
  }
}

/* Prompt attention over the paged pool, read in place, with kvfence_decode_attention's
   arguments: query b attends positions 0 .. ends[b]-1 of its table, blocks[b]. Consecutive rows
   of one table at consecutive positions are attended in tiles of up to TILE_ROWS query rows per
   KV head, which share every key and value they read. A query's scores (bfloat16 pairs summed
   in order), softmax (the largest score, e^x by exp16, the total in position order) and weighted
   sum (in position order, up to its own end) are the same operations whatever tile it lands in,
   so its bits never depend on the call's other rows, its chunk or the thread that runs it. */
void kvfence_prompt_attention(const uint16_t* q, long q_stride, const uint16_t* k,
                              const uint16_t* v, const int32_t* blocks, int nb,
                              const int32_t* ends, uint16_t* out, int B, int Hq, int Hkv, int D,
                              int bs, float scale, int threads) {
  const int G = Hq / Hkv, per = TILE_ROWS / G > 0 ? TILE_ROWS / G : 1;
  if (B <= 0 || G * per > TILE_ROWS) return;  /* more than TILE_ROWS heads per KV head */
  int* starts = (int*)malloc(sizeof(int) * (size_t)(B + 1));
  int tiles = 0, longest = 0;
  for (int b = 0; b < B; b++) {
    if (ends[b] > longest) longest = ends[b];
    const int joins = b > 0 && b - starts[tiles - 1] < per && ends[b] == ends[b - 1] + 1 &&
        memcmp(blocks + (size_t)b * nb, blocks + (size_t)(b - 1) * nb, sizeof(int32_t) * nb) == 0;
    if (!joins) starts[tiles++] = b;
  }
  starts[tiles] = B;
  const int NV = (TILE_ROWS + 15) / 16;
  #pragma omp parallel num_threads(threads)
  {
    uint32_t* QT = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)NV * (D / 2) * 16);
    float* vf = (float*)malloc(sizeof(float) * (size_t)longest * D);
    float* S = (float*)malloc(sizeof(float) * (size_t)longest * NV * 16);
    #pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tiles * Hkv; task++) {
      const int tile = task / Hkv, h = task % Hkv, b0 = starts[tile];
      prompt_tile(q, q_stride, k, v, blocks + (size_t)b0 * nb, ends, out, b0,
                  starts[tile + 1] - b0, h, Hq, Hkv, D, bs, scale, QT, vf, S);
    }
    free(QT); free(vf); free(S);
  }
  free(starts);
}

/* One model's decoder, for our decode layers: pointers into weights the caller keeps alive. */
struct kvfence_layer {
  const float* attn_norm;  /* [H] */
  const float* ffn_norm;   /* [H] */
  const uint16_t* qkv;     /* [(Hq + 2 Hkv) D, H] */
  const uint16_t* o;       /* [H, Hq D] */
  const uint16_t* gate_up; /* [2 F, H] */
  const uint16_t* down;    /* [H, F] */
};

struct kvfence_model {
  int H, F, Hq, Hkv, D, positions;
  float eps, scale;
  const float* cos;  /* [positions, D], halves duplicated */
  const float* sin;  /* [positions, D], first half negated: rotate-half's sign */
  const struct kvfence_layer* layers;
};

static inline float widen1(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
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

/* h = bf16(x * (1 / sqrt(mean(x^2) + eps)) * w), row by row; squares summed 16 lanes at a
   time, then the tail in order. */
static void rms_norm_rows(const float* x, const float* w, uint16_t* h, int M, int H, float eps) {
  const int full = H & ~15;
  for (int m = 0; m < M; m++) {
    const float* r = x + (size_t)m * H;
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < full; j += 16) {
      const __m512 v = _mm512_loadu_ps(r + j);
      acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    }
    float ss = lanes_sum(acc);
    for (int j = full; j < H; j++) ss += r[j] * r[j];
    const float inv = 1.0f / sqrtf(ss / (float)H + eps);
    const __m512 vi = _mm512_set1_ps(inv);
    uint16_t* o = h + (size_t)m * H;
    for (int j = 0; j < full; j += 16) {
      const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(r + j), vi),
                                     _mm512_loadu_ps(w + j));
      _mm256_storeu_si256((__m256i*)(o + j), to_bf16x16(y));
    }
    for (int j = full; j < H; j++) o[j] = to_bf16(r[j] * inv * w[j]);
  }
}

/* Rotate-half on the q and k heads of each qkv row, in place: every value once, rounded once,
   as bf16(t[d] * cos[d] + t[d +- D/2] * sin[d]). Row m is at position ends[m] - 1. */
static void rope_rows(uint16_t* qkv, int M, int stride, int heads, int D, const float* cos,
                      const float* sin, const int32_t* ends) {
  const int half = D / 2;
  float t[512];
  for (int m = 0; m < M; m++) {
    const float* c = cos + (size_t)(ends[m] - 1) * D;
    const float* s = sin + (size_t)(ends[m] - 1) * D;
    for (int hd = 0; hd < heads; hd++) {
      uint16_t* r = qkv + (size_t)m * stride + (size_t)hd * D;
      if (half % 16 == 0) {  /* 16 at a time: the same products and sum per value */
        for (int d = 0; d < half; d += 16) {
          const __m512 lo = widen(r + d), hi = widen(r + half + d);
          const __m512 a = _mm512_add_ps(_mm512_mul_ps(lo, _mm512_loadu_ps(c + d)),
                                         _mm512_mul_ps(hi, _mm512_loadu_ps(s + d)));
          const __m512 b = _mm512_add_ps(_mm512_mul_ps(hi, _mm512_loadu_ps(c + half + d)),
                                         _mm512_mul_ps(lo, _mm512_loadu_ps(s + half + d)));
          _mm256_storeu_si256((__m256i*)(r + d), to_bf16x16(a));
          _mm256_storeu_si256((__m256i*)(r + half + d), to_bf16x16(b));
        }
        continue;
      }
      for (int d = 0; d < D; d++) t[d] = widen1(r[d]);
      for (int d = 0; d < D; d++) r[d] = to_bf16(t[d] * c[d] + t[(d + half) % D] * s[d]);
    }
  }
}

/* a = bf16(silu(gate) * up) over [M, F] (gate, then up, in each row of gu), rounded once:
   g / (1 + e^-g) * u, 16 values at a time (a row's tail through a zero-padded copy), e^x by
   exp16. Any split over threads gives each value the same operations. */
static void swiglu_rows(const uint16_t* gu, uint16_t* a, int M, int F, int threads) {
  const int per = (F + 15) / 16;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int task = 0; task < M * per; task++) {
    const int m = task / per, j = (task % per) * 16, n = F - j < 16 ? F - j : 16;
    const uint16_t* g = gu + (size_t)m * 2 * F + j;
    uint16_t* o = a + (size_t)m * F + j;
    uint16_t gp[16] = {0}, up[16] = {0}, out[16];
    if (n < 16) {
      memcpy(gp, g, sizeof(uint16_t) * (size_t)n);
      memcpy(up, g + F, sizeof(uint16_t) * (size_t)n);
    }
    const __m512 gv = widen(n < 16 ? gp : g), uv = widen(n < 16 ? up : g + F);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    const __m512 y = _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), uv);
    _mm256_storeu_si256((__m256i*)(n < 16 ? out : o), to_bf16x16(y));
    if (n < 16) memcpy(o, out, sizeof(uint16_t) * (size_t)n);
  }
}

static void add_rows(float* x, const uint16_t* y, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] += widen1(y[i]);
}

/* The same ops for a step's prompt rows, which torch's products feed: rows split over threads,
   each row computed as above, so its bits are its own. */
void kvfence_rms_norm(const float* x, const float* w, uint16_t* h, int M, int H, float eps,
                      int threads) {
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int m = 0; m < M; m++) rms_norm_rows(x + (size_t)m * H, w, h + (size_t)m * H, 1, H, eps);
}

void kvfence_rope(uint16_t* qkv, int M, int stride, int heads, int D, const float* cos,
                  const float* sin, const int32_t* ends, int threads) {
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (int m = 0; m < M; m++)
    rope_rows(qkv + (size_t)m * stride, 1, stride, heads, D, cos, sin, ends + m);
}

void kvfence_swiglu(const uint16_t* gu, uint16_t* a, int M, int F, int threads) {
  swiglu_rows(gu, a, M, F, threads);
}

/* Layers [first, last) of the generated rows x ([M, H] float32, updated in place), row m a
   decode at position ends[m] - 1, its K/V written to slots[m]: norm, qkv,
   rotary, K/V written to their slots, attention read in place, o, norm, SwiGLU, down. K/V of
   layer l lie at k + l * layer_stride ([slots, Hkv, D]). Every op keeps rows apart and runs in
   one fixed order, so a row's bits never depend on M or the thread count. */
void kvfence_decode_layers(const struct kvfence_model* mdl, int first, int last, float* x,
                           int M, const int64_t* slots, uint16_t* k, uint16_t* v,
                           long layer_stride, const int32_t* blocks,
                           int nb, const int32_t* ends, int bs, int threads) {
  const int H = mdl->H, F = mdl->F, Hq = mdl->Hq, Hkv = mdl->Hkv, D = mdl->D;
  const int nq = Hq * D, nkv = Hkv * D, nqkv = nq + 2 * nkv;
  uint16_t* h = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)M * (H > F ? H : F));
  uint16_t* qkv = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)M * nqkv);
  uint16_t* att = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)M * nq);
  uint16_t* y = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)M * H);
  uint16_t* gu = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)M * 2 * F);
  for (int l = first; l < last; l++) {
    const struct kvfence_layer* w = mdl->layers + l;
    uint16_t* kl = k + (size_t)l * layer_stride;
    uint16_t* vl = v + (size_t)l * layer_stride;
    rms_norm_rows(x, w->attn_norm, h, M, H, mdl->eps);
    kvfence_gemv_bf16(h, w->qkv, qkv, M, nqkv, H, threads);
    rope_rows(qkv, M, nqkv, Hq + Hkv, D, mdl->cos, mdl->sin, ends);
    for (int m = 0; m < M; m++) {
      memcpy(kl + (size_t)slots[m] * nkv, qkv + (size_t)m * nqkv + nq, sizeof(uint16_t) * nkv);
      memcpy(vl + (size_t)slots[m] * nkv, qkv + (size_t)m * nqkv + nq + nkv,
             sizeof(uint16_t) * nkv);
    }
    kvfence_decode_attention(qkv, nqkv, kl, vl, blocks, nb, ends, att, M, Hq, Hkv, D, bs,
                             mdl->scale, threads);
    kvfence_gemv_bf16(att, w->o, y, M, H, nq, threads);
    add_rows(x, y, (size_t)M * H);
    rms_norm_rows(x, w->ffn_norm, h, M, H, mdl->eps);
    kvfence_gemv_bf16(h, w->gate_up, gu, M, 2 * F, H, threads);
    swiglu_rows(gu, h, M, F, threads);
    kvfence_gemv_bf16(h, w->down, y, M, H, F, threads);
    add_rows(x, y, (size_t)M * H);
  }
  free(h); free(qkv); free(att); free(y); free(gu);
}
"""
