"""The C source of decode attention (part of backend.model.native_c's library): each generated
row's query heads attend their sequence's context read in place from the paged KV pool.

Invariant: a query's scores, softmax and weighted sum are the same operations, in the same order,
whatever the call's other rows, the heads it is grouped with or the thread that runs it: its
bits never depend on what else the call attends.
"""

from __future__ import annotations

from typing import Final

DECODE: Final = r"""
#define MAX_CHUNKS 16  /* head_dim <= 256, a multiple of 16 */
#define MAX_HEADS 4    /* query heads of one KV head attended together */
#define KV_AHEAD 16    /* positions ahead a key or value is asked for: the pool's blocks lie
                          anywhere, so the core's prefetcher loses the stream at each one */

/* The heads in a group: as many as keep their weighted sums' accumulators (heads x D / 16)
   within 16 vectors, 1 to MAX_HEADS. */
static inline int decode_heads(int D) {
  const int n = 16 / (D / 16);
  return n < 1 ? 1 : n > MAX_HEADS ? MAX_HEADS : n;
}

/* Query heads h * G + g0 .. + NH - 1 of row b attend positions 0 .. len-1 of KV head h, each
   key and value widened once for all NH. Per query, as one at a time: a score is the float32
   FMA of its 16-value chunks in order, summed across lanes by lanes_sum's tree (lanes_sums16,
   16 positions at once), times scale; e^(score - the largest) by exp16, totalled in position
   order; the weighted sum in position order over d; divided by the total; rounded to
   bfloat16. s: scratch of NH rows of at least len + 16 floats, `stride` apart. */
static inline __attribute__((always_inline)) void decode_group(
    const uint16_t* qr, const uint16_t* k, const uint16_t* v, const int32_t* table, int len,
    int h, int Hkv, int bs, float scale, float* s, int stride, size_t* at, uint16_t* o,
    const int NH, const int C) {
  const int D = 16 * C, lines = D / 32;  /* 64-byte lines per key or value */
  for (int l = 0, blk = 0; l < len; blk++)  /* where each position's key and value lie */
    for (int off = 0; off < bs && l < len; off++, l++)
      at[l] = (((size_t)table[blk] * bs + off) * Hkv + h) * D;
  __m512 qv[MAX_HEADS][MAX_CHUNKS], part[MAX_HEADS][16];
  for (int i = 0; i < NH; i++)
    for (int c = 0; c < C; c++) qv[i][c] = widen(qr + (size_t)i * D + 16 * c);
  __m512 top[MAX_HEADS];
  for (int i = 0; i < NH; i++) top[i] = _mm512_set1_ps(-INFINITY);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int l0 = 0; l0 < len; l0 += 16) {
    const int n = len - l0 < 16 ? len - l0 : 16;
    for (int j = 0; j < n; j++) {
      const int l = l0 + j;
      const uint16_t* kr = k + at[l];
      for (int c = 0; c < lines; c++) {  /* the value into L2 for the weighted sum, */
        _mm_prefetch((const char*)(v + at[l]) + 64 * c, _MM_HINT_T1);
        if (l + KV_AHEAD < len)  /* a later key into L1 */
          _mm_prefetch((const char*)(k + at[l + KV_AHEAD]) + 64 * c, _MM_HINT_T0);
      }
      __m512 dot[MAX_HEADS];
      for (int i = 0; i < NH; i++) dot[i] = _mm512_setzero_ps();
      for (int c = 0; c < C; c++) {
        const __m512 kw = widen(kr + 16 * c);
        for (int i = 0; i < NH; i++) dot[i] = _mm512_fmadd_ps(qv[i][c], kw, dot[i]);
      }
      for (int i = 0; i < NH; i++) part[i][j] = dot[i];
    }
    const __mmask16 live = (__mmask16)((1u << n) - 1);
    for (int i = 0; i < NH; i++) {
      for (int j = n; j < 16; j++) part[i][j] = _mm512_setzero_ps();
      const __m512 sum = _mm512_mul_ps(lanes_sums16(part[i]), sc);
      _mm512_storeu_ps(s + (size_t)i * stride + l0, sum);
      /* a NaN score never becomes the largest: max_ps keeps its second operand then */
      top[i] = _mm512_mask_max_ps(top[i], live, sum, top[i]);
    }
  }
  float total[MAX_HEADS];
  for (int i = 0; i < NH; i++) {
    const __m512 t = _mm512_set1_ps(_mm512_reduce_max_ps(top[i]));  /* a max: any order */
    float* si = s + (size_t)i * stride;
    for (int l0 = 0; l0 < len; l0 += 16)
      _mm512_storeu_ps(si + l0, exp16(_mm512_sub_ps(_mm512_loadu_ps(si + l0), t)));
    float sum = 0.0f;
    for (int l = 0; l < len; l++) sum += si[l];
    total[i] = len > 0 ? sum : 1.0f;
  }
  __m512 acc[MAX_HEADS][MAX_CHUNKS];
  for (int i = 0; i < NH; i++)
    for (int c = 0; c < C; c++) acc[i][c] = _mm512_setzero_ps();
  for (int l = 0; l < len; l++) {
    const uint16_t* vr = v + at[l];
    if (l + KV_AHEAD < len)
      for (int c = 0; c < lines; c++)
        _mm_prefetch((const char*)(v + at[l + KV_AHEAD]) + 64 * c, _MM_HINT_T0);
    __m512 p[MAX_HEADS];
    for (int i = 0; i < NH; i++) p[i] = _mm512_set1_ps(s[(size_t)i * stride + l]);
    for (int c = 0; c < C; c++) {
      const __m512 vv = widen(vr + 16 * c);
      for (int i = 0; i < NH; i++) acc[i][c] = _mm512_fmadd_ps(p[i], vv, acc[i][c]);
    }
  }
  for (int i = 0; i < NH; i++) {
    const __m512 t = _mm512_set1_ps(total[i]);
    for (int c = 0; c < C; c++)
      _mm256_storeu_si256((__m256i*)(o + (size_t)i * D + 16 * c),
                          to_bf16x16(_mm512_div_ps(acc[i][c], t)));
  }
}

/* Decode attention over the paged pool, read in place (no gathered copy): query b, head hq
   attends positions 0 .. ends[b]-1 of its sequence, position l at slot
   blocks[b][l / bs] * bs + l % bs of k and v ([slots, Hkv, D]); its KV head is hq / (Hq / Hkv).
   q: row b at q + b * q_stride, [Hq, D]; out: [B, Hq * D]. One task per row, KV head and
   group of its query heads, which share every key and value read; decode_group's operations
   per query, so a query's bits never depend on the call's other queries, its group, its
   padding or the thread that runs it. */
#define GROUP(NH, C) \
  decode_group(qr, k, v, table, len, h, Hkv, bs, scale, s, stride, at, o, NH, C)

void kvfence_decode_attention(const uint16_t* q, long q_stride, const uint16_t* k,
                              const uint16_t* v, const int32_t* blocks, int nb,
                              const int32_t* ends, uint16_t* out, int B, int Hq, int Hkv, int D,
                              int bs, float scale, int threads) {
  if (B <= 0 || D / 16 > MAX_CHUNKS) return;
  const int G = Hq / Hkv, C = D / 16, per = decode_heads(D), groups = (G + per - 1) / per;
  int longest = 1;
  for (int b = 0; b < B; b++)
    if (ends[b] > longest) longest = ends[b];
  const int stride = (longest + 31) & ~15;
  #pragma omp parallel num_threads(threads)
  {
    float* s = (float*)malloc(sizeof(float) * (size_t)MAX_HEADS * stride);
    size_t* at = (size_t*)malloc(sizeof(size_t) * (size_t)longest);
    #pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < B * Hkv * groups; task++) {
      const int b = task / (Hkv * groups), h = task / groups % Hkv, g0 = task % groups * per;
      const int nh = G - g0 < per ? G - g0 : per, hq = h * G + g0, len = ends[b];
      const int32_t* table = blocks + (size_t)b * nb;
      const uint16_t* qr = q + (size_t)b * q_stride + (size_t)hq * D;
      uint16_t* o = out + ((size_t)b * Hq + hq) * D;
      if (D == 64) {  /* SmolLM2's and many others': every chunk loop unrolled */
        switch (nh) {
          case 4: GROUP(4, 4); break;
          case 3: GROUP(3, 4); break;
          case 2: GROUP(2, 4); break;
          default: GROUP(1, 4);
        }
        continue;
      }
      switch (nh) {
        case 4: GROUP(4, C); break;
        case 3: GROUP(3, C); break;
        case 2: GROUP(2, C); break;
        default: GROUP(1, C);
      }
    }
    free(s);
    free(at);
  }
}
"""
