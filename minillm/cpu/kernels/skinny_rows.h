// The few-row float32 product's inner loops: y[:, lo:hi] = x @ W[lo:hi].T (+ b) for one thread's rows.
//
// Shared by skinny_f32.cpp (the op, threads splitting the rows with at::parallel_for) and
// decode_step.cpp (a whole decode step in one parallel region, each thread calling these on its
// share of every layer's rows). skinny_f32.cpp's header says how and why they work.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t GROUP = 8;  // rows of x whose accumulators fit the registers at once
#ifndef MAX_ROWS_DEF
#define MAX_ROWS_DEF 32
#endif
constexpr int64_t MAX_ROWS = MAX_ROWS_DEF;
#ifndef PF_TILES
#define PF_TILES 2
#endif

// The reference the vector path must match (tests/test_skinny_linear.py compares them).
void rows_portable(const float* w, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                   int64_t lo, int64_t hi) {
  for (int64_t j = lo; j < hi; ++j) {
    const float* wr = w + j * k;
    for (int64_t i = 0; i < m; ++i) {
      const float* xr = x + i * k;
      float s = 0.f;
      for (int64_t t = 0; t < k; ++t) s += wr[t] * xr[t];
      y[i * n + j] = s + (b ? b[j] : 0.f);
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// NR weight rows j..j+NR-1 against the M activation rows; k % 8 == 0 (checked by the caller).
template <int M, int NR>
inline void tile(const float* w, const float* x, const float* b, float* y, int64_t k, int64_t n, int64_t j) {
  __m256 acc[NR][M];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < M; ++i) acc[r][i] = _mm256_setzero_ps();
  const float* wr = w + j * k;
  const float* ahead = wr + PF_TILES * NR * k;  // the tiles' rows are contiguous: prefetch them as one run
  for (int64_t t = 0; t < k; t += 8) {
    if ((t & 15) == 0)  // the tile PF_TILES ahead into L2, NR lines every two steps (T0 or 1 tile: 25-29 GB/s)
      for (int r = 0; r < NR; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + (t / 16 * NR + r) * 16), _MM_HINT_T1);
    __m256 wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = _mm256_loadu_ps(wr + r * k + t);
    for (int i = 0; i < M; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * k + t);
      for (int r = 0; r < NR; ++r) acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < M; ++i) y[i * n + j + r] = hsum(acc[r][i]) + (b ? b[j + r] : 0.f);
}

template <int M>
void rows_avx2(const float* w, const float* x, const float* b, float* y, int64_t k, int64_t n, int64_t lo,
               int64_t hi) {
  constexpr int NR = M <= 4 ? 4 : 2;
  int64_t j = lo;
  for (; j + NR <= hi; j += NR) tile<M, NR>(w, x, b, y, k, n, j);
  for (; j < hi; ++j) tile<M, 1>(w, x, b, y, k, n, j);
}

// NR weight rows against m <= 8 activation rows (m picks the template)
template <int NR>
void tile_rows(const float* w, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n, int64_t j) {
  switch (m) {
    case 1: return tile<1, NR>(w, x, b, y, k, n, j);
    case 2: return tile<2, NR>(w, x, b, y, k, n, j);
    case 3: return tile<3, NR>(w, x, b, y, k, n, j);
    case 4: return tile<4, NR>(w, x, b, y, k, n, j);
    case 5: return tile<5, NR>(w, x, b, y, k, n, j);
    case 6: return tile<6, NR>(w, x, b, y, k, n, j);
    case 7: return tile<7, NR>(w, x, b, y, k, n, j);
    default: return tile<8, NR>(w, x, b, y, k, n, j);
  }
}

// One to three rows of x (decode, short verify steps): each thread reads its weight rows as one
// sequential stream, row after row, each row meeting the M rows of x (from L1) with U independent
// accumulators per row of x, and the stream prefetched 8 KB ahead. The 4-row tiles below read 2 or 4
// weight rows side by side (as many streams, 2.3 KB apart at K = 576), which is slower: measured on a
// 2-vCPU Zen 5, two threads, the LM head [49152, 576] at one row read at 59-63 GB/s in tiles and
// 97-105 GB/s as one stream (a 512 MiB torch.sum read 75-80 GB/s in the same runs); the body's 120
// linears, 30 copies rotating beyond L3, 49 against 62-65 GB/s; at 2-4 rows, on a slower hour, the
// head 32-38 against 40-49 GB/s and the body 29-32 against 35-38. From 4 rows on the tiles won
// (ms, head / the 120 body linears, tiles -> stream, fast hour: 4 rows 1.38 -> 1.57 / 9.26 -> 9.90,
// 8 rows 2.28 -> 1.92 / 10.9 -> 11.8; 2 rows 1.66 -> 1.21 / 9.14 -> 7.45; 1 row 1.63 -> 1.14 / 8.33 -> 6.53).
constexpr int64_t STREAM_AHEAD = 2048;  // floats (8 KB): 0, 512 and 2,048 measured; 2,048 won on the head

// The stream's vector: 16 floats where the CPU has AVX-512, else 8; `tail` loads the last k % width
// floats (zeros beyond: the weight row and x end there).
#if defined(__AVX512F__)
struct StreamVec {
  using V = __m512;
  static constexpr int64_t width = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V tail(const float* p, int64_t count) { return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static float sum(V v) { return _mm512_reduce_add_ps(v); }
};
#else
struct StreamVec {
  using V = __m256;
  static constexpr int64_t width = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V tail(const float*, int64_t) { return zero(); }  // never called: k % 8 == 0 (the caller's check)
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static float sum(V v) { return hsum(v); }
};
#endif

template <int M, int U>
void rows_stream(const float* w, const float* x, const float* b, float* y, int64_t k, int64_t n, int64_t lo,
                 int64_t hi) {
  using S = StreamVec;
  constexpr int64_t step = S::width * U;
  for (int64_t j = lo; j < hi; ++j) {
    const float* wr = w + j * k;
    S::V acc[M][U];
    for (int i = 0; i < M; ++i)
      for (int u = 0; u < U; ++u) acc[i][u] = S::zero();
    int64_t t = 0;
    for (; t + step <= k; t += step)
      for (int u = 0; u < U; ++u) {
        const int64_t at = t + S::width * u;
        if (at % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(wr + at + STREAM_AHEAD), _MM_HINT_T0);  // a line
        const S::V wv = S::load(wr + at);
        for (int i = 0; i < M; ++i) acc[i][u] = S::fma(wv, S::load(x + i * k + at), acc[i][u]);
      }
    for (; t + S::width <= k; t += S::width) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + t + STREAM_AHEAD), _MM_HINT_T0);
      const S::V wv = S::load(wr + t);
      for (int i = 0; i < M; ++i) acc[i][0] = S::fma(wv, S::load(x + i * k + t), acc[i][0]);
    }
    if (t < k) {
      const S::V wv = S::tail(wr + t, k - t);
      for (int i = 0; i < M; ++i) acc[i][0] = S::fma(wv, S::tail(x + i * k + t, k - t), acc[i][0]);
    }
    for (int i = 0; i < M; ++i) {
      S::V total = acc[i][0];
      for (int u = 1; u < U; ++u) total = S::add(total, acc[i][u]);
      y[i * n + j] = S::sum(total) + (b ? b[j] : 0.f);
    }
  }
}

void rows_simd(const float* w, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
               int64_t lo, int64_t hi) {
  if (m > GROUP) {
    // more rows than registers: each tile of 2 weight rows (<= 12 KB at K = 1536) is read from memory
    // once and from L1 by every further group of 8 rows of x
    int64_t j = lo;
    for (; j + 2 <= hi; j += 2)
      for (int64_t g = 0; g < m; g += GROUP) tile_rows<2>(w, x + g * k, b, y + g * n, std::min(GROUP, m - g), k, n, j);
    for (; j < hi; ++j)
      for (int64_t g = 0; g < m; g += GROUP) tile_rows<1>(w, x + g * k, b, y + g * n, std::min(GROUP, m - g), k, n, j);
    return;
  }
  switch (m) {  // 1-3 rows: one stream (one row of x needs 4 accumulators to hide the FMA latency);
                // 4-8: the tiles, which measured faster there (the stream's M x-row loads per weight vector)
    case 1: return rows_stream<1, 4>(w, x, b, y, k, n, lo, hi);
    case 2: return rows_stream<2, 2>(w, x, b, y, k, n, lo, hi);
    case 3: return rows_stream<3, 2>(w, x, b, y, k, n, lo, hi);
    case 4: return rows_avx2<4>(w, x, b, y, k, n, lo, hi);
    case 5: return rows_avx2<5>(w, x, b, y, k, n, lo, hi);
    case 6: return rows_avx2<6>(w, x, b, y, k, n, lo, hi);
    case 7: return rows_avx2<7>(w, x, b, y, k, n, lo, hi);
    default: return rows_avx2<8>(w, x, b, y, k, n, lo, hi);
  }
}
#endif

}  // namespace
