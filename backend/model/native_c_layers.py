"""The C source of whole decoder layers for generated rows, and the row ops prompt rows share
with them (part of backend.model.native_c's library): RMSNorm, rotary embedding, SwiGLU and the
residual adds around the products and attention of native_c.

Invariant: every op keeps rows apart and runs in one fixed order: a row's bits never depend on
the call's other rows or the thread count.
"""

from __future__ import annotations

from typing import Final

LAYERS: Final = r"""
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
