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
//                                           up to 3 rows of x read row after row instead: rows_stream)
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
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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

// (value, index) of the first maximum of row[lo, hi), or of its first NaN (a NaN counts as the maximum).
std::pair<float, int64_t> first_max(const float* row, int64_t lo, int64_t hi) {
  int64_t j = lo;
#if defined(__AVX512F__)
  // one pass for the maximum and whether any NaN is there, 16 at a time; then the first index holding it
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (; j + 16 <= hi; j += 16) {
    const __m512 v = _mm512_loadu_ps(row + j);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    vmax = _mm512_max_ps(vmax, v);
  }
  float b = _mm512_reduce_max_ps(vmax);
  for (int64_t t = j; t < hi; ++t) {
    if (row[t] != row[t]) nan = 1;
    else if (row[t] > b) b = row[t];
  }
  if (!nan) {
    for (int64_t t = lo; t < hi; ++t)
      if (row[t] == b) return {b, t};
  }
  j = lo;  // a NaN somewhere: the plain scan below finds the first one
#endif
  float b0 = row[j];
  int64_t w = j;
  for (; j < hi; ++j) {
    const float v = row[j];
    if (v != v) return {v, j};  // NaN: the maximum, and the first one ends the scan
    if (v > b0) { b0 = v; w = j; }
  }
  return {b0, w};
}

// The greedy token of each row of logits [M, N] (float32): the first maximum, a NaN counting as the
// maximum (its first one), as torch's max(-1).indices. Threads split each row's columns the way `linear`
// split the LM head's rows (at::parallel_for over N, grain 64, so the same halves), and each thread
// scans what it wrote: on a 2-vCPU Zen 5 torch's max read the head's fresh logits (49,152) in ~90 us,
// fetching the other core's half line by line, against ~30 us for the same call on warm logits.
at::Tensor greedy(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "logits [M, N], float32");
  const at::Tensor lc = logits.contiguous();
  const int64_t m = lc.size(0), n = lc.size(1);
  TORCH_CHECK(n > 0, "an empty row has no greedy token");
  at::Tensor out = at::empty({m}, lc.options().dtype(at::kLong));
  const float* x = lc.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  const int threads = at::get_num_threads();
  // one parallel region for all rows: each thread takes the same columns of every row (the LM head's
  // rows it computed), keeping each row's first maximum in its part; the parts then merge row by row
  std::vector<float> best(m * threads, 0.f);
  std::vector<int64_t> where(m * threads, -1);
  at::parallel_for(0, n, 64, [&](int64_t lo, int64_t hi) {
    const int part = at::get_thread_num();
    for (int64_t i = 0; i < m; ++i) {
      const auto [b, w] = first_max(x + i * n, lo, hi);
      best[i * threads + part] = b;
      where[i * threads + part] = w;
    }
  });
  for (int64_t i = 0; i < m; ++i) {
    // the parts' winner by the same rule: a NaN beats any number, a larger value a smaller one, and
    // between equals (or two NaNs) the earlier column
    float b = 0.f;
    int64_t w = -1;
    for (int t = 0; t < threads; ++t) {
      const float v = best[i * threads + t];
      const int64_t at = where[i * threads + t];
      if (at < 0) continue;  // a part no thread ran
      const bool v_nan = v != v, b_nan = b != b;
      const bool wins = w < 0 || (v_nan ? !b_nan || at < w : !b_nan && (v > b || (v == b && at < w)));
      if (wins) { b = v; w = at; }
    }
    o[i] = w;
  }
  return out;
}

}  // namespace

// The same op as a C function that a compiled graph's C++ wrapper calls directly (engine/compile.py,
// direct_calls): the name the wrapper derives from the op's ("aoti_torch_<device>_" + its name) and its
// C-shim argument convention (an optional tensor by pointer, a bool as int32). Otherwise every call goes
// through aoti_torch_call_dispatcher: the op found by name, its arguments boxed and unboxed.
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_linear(
    AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, int32_t portable, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using namespace torch::aot_inductor;
    *ret0 = new_tensor_handle(linear(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(weight),
                                     pointer_to_optional<at::Tensor>(bias), portable != 0));
  });
}

TORCH_LIBRARY(minillm_skinny, lib) {
  lib.def("linear(Tensor x, Tensor weight, Tensor? bias, bool portable=False) -> Tensor");
  lib.def("greedy(Tensor logits) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_skinny, CPU, lib) {
  lib.impl("linear", &linear);
  lib.impl("greedy", &greedy);
}
