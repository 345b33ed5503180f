"""The C source of prompt attention (part of backend.model.native_c's library): attention of a
step's prompt rows read in place from the paged KV pool, in tiles of rows that share each key
and value.

Invariant: a query's scores, softmax and weighted sum are the same operations whatever tile,
chunk or thread it lands in: its bits never depend on what else the call attends.
"""

from __future__ import annotations

from typing import Final

PROMPT: Final = r"""
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

"""
