// One row of a float32 decoder layer's elementwise steps: RMSNorm, the rotary embedding of one head,
// SwiGLU's activation. Shared by fused_elementwise.cpp (the ops, rows split across threads) and
// decode_step.cpp (a whole decode step in one parallel region), so both compute the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "vec_exp.h"  // SiLU's e^x
#endif

namespace {

// one row: y = x / sqrt(mean(x^2) + eps) * w
inline void norm_row(const float* x, const float* w, float* y, int64_t h, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < h; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
#pragma omp simd
  for (int64_t i = 0; i < h; ++i) y[i] = x[i] * inv * w[i];
}

// one head of x1 (its first half) and x2 = x1 + half: rotate each (x1[j], x2[j]) pair by the angle
// whose cos and sin are c[j], s[j]
inline void rope_head(const float* x1, const float* c, const float* s, float* o1, int64_t half) {
  const float* x2 = x1 + half;
  float* o2 = o1 + half;
#pragma omp simd
  for (int64_t j = 0; j < half; ++j) {
    o1[j] = x1[j] * c[j] - x2[j] * s[j];
    o2[j] = x2[j] * c[j] + x1[j] * s[j];
  }
}

#if defined(__AVX512F__)
inline __m512 silu_mul_vec(__m512 g, __m512 u) {  // g / (1 + e^-g) u
  const __m512 e = minillm_vec::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), u);
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 silu_mul_vec(__m256 g, __m256 u) {
  const __m256 e = minillm_vec::exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), u);
}
#endif

inline void silu_mul_run(const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, silu_mul_vec(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu_mul_vec(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
#endif
  for (; i < n; ++i) y[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
}

}  // namespace
