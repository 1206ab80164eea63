// y = x @ W.T + b for up to 32 rows of x, float32: the product of CPU decode, verification and small batches.
//
// What the course teaches here (book/architecture.md, "Few-row float products"): a decode step
// with M <= 8 rows reads every weight once and does M multiply-adds with it, so it should cost
// what reading W costs, whatever M is. BLAS's general kernels do not get there for a handful of
// rows (measured on a 2-core EPYC, the default model's linears, float32: 1 row 19 ms, 4 rows
// 29 ms, 8 rows 42 ms; kernels/skinny_cpu.py has the table). This kernel streams each weight row
// once from memory and meets it with all M activation rows while it is in registers:
//
//   for a tile of NR weight rows:          (NR = 4 for M <= 4, else 2: NR x M accumulators fit the registers;
//                                           one row of x reads row after row instead: row1_stream)
//     for k in steps of 8:                 (one 8-float vector per weight row, one per activation row)
//       acc[r][m] += W[n + r, k:k+8] * x[m, k:k+8]
//     y[m, n + r] = sum of acc[r][m]'s 8 lanes (+ b[n + r])
//
// More than 8 rows of x (up to 32): each 2-row weight tile, read from memory once, meets them 8 at a
// time from L1. Threads split the weight rows (at::parallel_for); x stays in cache. AVX2 + FMA (every x86-64 laptop since 2013) with a portable C++ path beside it; the
// loads of the next rows are prefetched, as in gguf_matmul.cpp: a layer is a short run of rows.
// Registered as torch.ops.minillm_skinny.linear, so torch.compile sees one opaque call.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

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

// One row of x (batch-1 decode): each thread reads its weight rows as one sequential stream, row
// after row, with four independent accumulators per row and the stream prefetched 8 KB ahead. The
// 4-row tiles above read four rows side by side (four streams, 2.3 KB apart at K = 576), and for one
// row of x that is slower: measured on a 2-vCPU Zen 5, two threads, the LM head [49152, 576] read at
// 59-63 GB/s in tiles and 97-105 GB/s as one stream (a 512 MiB torch.sum read 75-80 GB/s in the
// same runs), the body's 120 linears per step, 30 copies rotating beyond L3, 49 against 62-65 GB/s.
constexpr int64_t STREAM_AHEAD = 2048;  // floats (8 KB): 0, 512 and 2,048 measured; 2,048 won on the head

#if defined(__AVX512F__)
void row1_stream(const float* w, const float* x, const float* b, float* y, int64_t k, int64_t lo, int64_t hi) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (k % 16)) - 1);
  for (int64_t j = lo; j < hi; ++j) {
    const float* wr = w + j * k;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + 64 <= k; t += 64) {
      for (int c = 0; c < 64; c += 16) _mm_prefetch(reinterpret_cast<const char*>(wr + t + STREAM_AHEAD + c), _MM_HINT_T0);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + t), _mm512_loadu_ps(x + t), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + t + 16), _mm512_loadu_ps(x + t + 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + t + 32), _mm512_loadu_ps(x + t + 32), a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + t + 48), _mm512_loadu_ps(x + t + 48), a3);
    }
    for (; t + 16 <= k; t += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(wr + t + STREAM_AHEAD), _MM_HINT_T0);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wr + t), _mm512_loadu_ps(x + t), a0);
    }
    if (t < k) a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wr + t), _mm512_maskz_loadu_ps(tail, x + t), a1);
    y[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + (b ? b[j] : 0.f);
  }
}
#else
void row1_stream(const float* w, const float* x, const float* b, float* y, int64_t k, int64_t lo, int64_t hi) {
  for (int64_t j = lo; j < hi; ++j) {  // k % 8 == 0 (the caller's check)
    const float* wr = w + j * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 32 <= k; t += 32) {
      for (int c = 0; c < 32; c += 16) _mm_prefetch(reinterpret_cast<const char*>(wr + t + STREAM_AHEAD + c), _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t), _mm256_loadu_ps(x + t), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t + 8), _mm256_loadu_ps(x + t + 8), a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t + 16), _mm256_loadu_ps(x + t + 16), a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t + 24), _mm256_loadu_ps(x + t + 24), a3);
    }
    for (; t < k; t += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + t), _mm256_loadu_ps(x + t), a0);
    y[j] = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + (b ? b[j] : 0.f);
  }
}
#endif

void rows_simd(const float* w, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
               int64_t lo, int64_t hi) {
  if (m == 1) return row1_stream(w, x, b, y, k, lo, hi);
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
  switch (m) {
    case 1: return rows_avx2<1>(w, x, b, y, k, n, lo, hi);
    case 2: return rows_avx2<2>(w, x, b, y, k, n, lo, hi);
    case 3: return rows_avx2<3>(w, x, b, y, k, n, lo, hi);
    case 4: return rows_avx2<4>(w, x, b, y, k, n, lo, hi);
    case 5: return rows_avx2<5>(w, x, b, y, k, n, lo, hi);
    case 6: return rows_avx2<6>(w, x, b, y, k, n, lo, hi);
    case 7: return rows_avx2<7>(w, x, b, y, k, n, lo, hi);
    default: return rows_avx2<8>(w, x, b, y, k, n, lo, hi);
  }
}
#endif

// x [M, K], weight [N, K], bias [N] or none -> [M, N]; M <= MAX_ROWS, float32, contiguous.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  bool portable) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [M, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= MAX_ROWS, "1 to ", MAX_ROWS, " rows of x");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  const at::Tensor xc = x.contiguous();
  std::optional<at::Tensor> bc;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n && bias->scalar_type() == at::kFloat, "bias [N], float32");
    bc = bias->contiguous();
  }
  at::Tensor y = at::empty({m, n}, x.options());
  const float* w = weight.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  const float* b = bc ? bc->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // a grain of 64 rows: at least 64 x K x 4 bytes (>= 147 KB at K = 576) per task, too little to split further
  at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
#if defined(__AVX2__) && defined(__FMA__)
    if (!portable && k % 8 == 0) return rows_simd(w, xp, b, yp, m, k, n, lo, hi);
#endif
    rows_portable(w, xp, b, yp, m, k, n, lo, hi);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(minillm_skinny, lib) {
  lib.def("linear(Tensor x, Tensor weight, Tensor? bias, bool portable=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_skinny, CPU, lib) { lib.impl("linear", &linear); }
