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

#include "skinny_rows.h"  // rows_simd, rows_portable: one thread's rows of the product

namespace {


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
