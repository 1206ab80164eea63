// The panel-packed few-row product's inner loops: y[:, panels p0..p1) = x @ W.T (+ b) for one thread's
// panels of 32 outputs. Shared by panel_f32.cpp (the op, threads splitting the panels with
// at::parallel_for) and decode_step.cpp (a whole decode step in one parallel region). panel_f32.cpp's
// header says how and why they work.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t PANEL = 32;       // outputs per panel: two 16-float registers
constexpr int64_t PANEL_MAX_ROWS = 16;    // rows of x per call
constexpr int64_t PANEL_GROUP = 8;        // rows of x whose accumulators fit the registers at once
constexpr int64_t PANEL_AHEAD = 2048;     // floats (8 KB) the stream is prefetched ahead, as skinny_f32.cpp's

// The reference the vector path must match (tests/test_panel_linear.py compares them).
void panels_portable(const float* wp, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                     int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* w = wp + p * k * PANEL;
    const int64_t c = p * PANEL, valid = std::min(PANEL, n - c);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < valid; ++j) {
        float s = 0.f;
        for (int64_t t = 0; t < k; ++t) s += w[t * PANEL + j] * x[i * k + t];
        y[i * n + c + j] = s + (b ? b[c + j] : 0.f);
      }
  }
}

#if defined(__AVX512F__)
template <int M>
void panels_avx512(const float* wp, const float* x, const float* b, float* y, int64_t k, int64_t n, int64_t p0,
                   int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* w = wp + p * k * PANEL;
    __m512 a0[M], a1[M];
    for (int i = 0; i < M; ++i) {
      a0[i] = _mm512_setzero_ps();
      a1[i] = _mm512_setzero_ps();
    }
    for (int64_t t = 0; t < k; ++t) {
      const float* row = w + t * PANEL;  // 128 bytes: two cache lines
      _mm_prefetch(reinterpret_cast<const char*>(row + PANEL_AHEAD), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + PANEL_AHEAD + 16), _MM_HINT_T0);
      const __m512 w0 = _mm512_loadu_ps(row), w1 = _mm512_loadu_ps(row + 16);
      for (int i = 0; i < M; ++i) {
        const __m512 xb = _mm512_set1_ps(x[i * k + t]);
        a0[i] = _mm512_fmadd_ps(w0, xb, a0[i]);
        a1[i] = _mm512_fmadd_ps(w1, xb, a1[i]);
      }
    }
    const int64_t c = p * PANEL, valid = std::min(PANEL, n - c);
    const __mmask16 lo = static_cast<__mmask16>(valid >= 16 ? 0xFFFF : (1u << valid) - 1);
    const __mmask16 hi = static_cast<__mmask16>(valid >= 32 ? 0xFFFF : valid <= 16 ? 0 : (1u << (valid - 16)) - 1);
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (b) {
      b0 = _mm512_maskz_loadu_ps(lo, b + c);
      b1 = _mm512_maskz_loadu_ps(hi, b + c + 16);
    }
    for (int i = 0; i < M; ++i) {  // the last panel's padding columns are not written
      _mm512_mask_storeu_ps(y + i * n + c, lo, _mm512_add_ps(a0[i], b0));
      _mm512_mask_storeu_ps(y + i * n + c + 16, hi, _mm512_add_ps(a1[i], b1));
    }
  }
}

void panels_simd(const float* wp, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                 int64_t p0, int64_t p1) {
  // more rows than one group: each panel (<= 196 KB at K = 1536) is re-read from L2 by the next group
  for (int64_t g = 0; g < m; g += PANEL_GROUP) {
    const float* xg = x + g * k;
    float* yg = y + g * n;
    switch (std::min(PANEL_GROUP, m - g)) {
      case 1: panels_avx512<1>(wp, xg, b, yg, k, n, p0, p1); break;
      case 2: panels_avx512<2>(wp, xg, b, yg, k, n, p0, p1); break;
      case 3: panels_avx512<3>(wp, xg, b, yg, k, n, p0, p1); break;
      case 4: panels_avx512<4>(wp, xg, b, yg, k, n, p0, p1); break;
      case 5: panels_avx512<5>(wp, xg, b, yg, k, n, p0, p1); break;
      case 6: panels_avx512<6>(wp, xg, b, yg, k, n, p0, p1); break;
      case 7: panels_avx512<7>(wp, xg, b, yg, k, n, p0, p1); break;
      default: panels_avx512<8>(wp, xg, b, yg, k, n, p0, p1); break;
    }
  }
}
#endif

}  // namespace
