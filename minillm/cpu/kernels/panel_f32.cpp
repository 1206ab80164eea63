// y = x @ W.T + b for a few rows of x (2 to 16), float32, W packed in panels of 32 outputs.
//
// What the course teaches here (book/architecture.md, "Few-row float products"): a verify step of a
// draft tree multiplies each weight by 4-6 rows, and reading W should be the whole cost, as it is at
// one row. With W row-major (nn.Linear's [out, in]) every weight row meets the M rows of x as M dot
// products: M loads of x per weight vector, from M rows K floats apart, and M horizontal sums per row
// (skinny_f32.cpp). Packed in panels, the 32 outputs p*32 .. p*32+31 of every input k sit together:
//
//   panels [ceil(N / 32)][K][32]          (zeros past N)
//   for each panel p (threads split the panels):
//     acc[m][0:32] = 0                    (2 x M 16-float registers)
//     for k:  acc[m][:] += panels[p][k][:] * x[m, k]     (x[m, k] broadcast: 2 FMAs per row of x)
//     y[m, p*32 : p*32+32] = acc[m] + b
//
// Each thread reads its panels as one sequential stream (prefetched 8 KB ahead), x comes as scalars
// from L1, and no sum crosses lanes. Measured on a 2-vCPU Zen 5 (AVX-512), two threads, 4 rows, the
// default model's 120 body linears (30 copies of each shape, in 2 MB pages), against skinny_f32.cpp's
// kernel on the row-major weights: 7.49 -> 6.28 ms with the read probe at 79 GB/s, 10.18 -> 9.45 ms at
// 50 GB/s; the [576, 1536] down projection 73.5 -> 52.8 us a call.
//
// The panels are a second copy of the weights, so the engine packs them only where few-row steps are
// the common case (models/skinny_linear.use_panels). AVX-512 only: with 16 AVX2 registers a 32-wide
// panel holds two rows of x at most; elsewhere a portable loop keeps the op correct (tests), and
// `simd()` tells Python not to pack. Registered as torch.ops.minillm_panel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "panel_rows.h"  // panels_simd, panels_portable: one thread's panels of the product

namespace {

// x [M, K], panels [ceil(N / 32), K, 32], bias [N] or none, n = N -> [M, N]; M <= PANEL_MAX_ROWS.
at::Tensor linear(const at::Tensor& x, const at::Tensor& panels, const std::optional<at::Tensor>& bias, int64_t n,
                  bool portable) {
  TORCH_CHECK(x.dim() == 2 && panels.dim() == 3 && panels.size(2) == PANEL && x.size(1) == panels.size(1),
              "x [M, K] and panels [ceil(N / 32), K, 32]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && panels.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(panels.is_contiguous(), "panels must be contiguous");
  TORCH_CHECK(n > 0 && (n + PANEL - 1) / PANEL == panels.size(0), "n must fill the panels' last panel partly or whole");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= PANEL_MAX_ROWS, "1 to ", PANEL_MAX_ROWS, " rows of x");
  const int64_t m = x.size(0), k = x.size(1);
  const at::Tensor xc = x.contiguous();
  std::optional<at::Tensor> bc;
  if (bias.has_value()) {
    TORCH_CHECK(bias->numel() == n && bias->scalar_type() == at::kFloat, "bias [N], float32");
    bc = bias->contiguous();
  }
  at::Tensor y = at::empty({m, n}, x.options());
  const float* wp = panels.data_ptr<float>();
  const float* xp = xc.data_ptr<float>();
  const float* b = bc ? bc->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // a grain of 2 panels: >= 147 KB of weights per task at K = 576
  at::parallel_for(0, panels.size(0), 2, [&](int64_t p0, int64_t p1) {
#if defined(__AVX512F__)
    if (!portable) return panels_simd(wp, xp, b, yp, m, k, n, p0, p1);
#endif
    panels_portable(wp, xp, b, yp, m, k, n, p0, p1);
  });
  return y;
}

bool simd() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY(minillm_panel, lib) {
  lib.def("linear(Tensor x, Tensor panels, Tensor? bias, int n, bool portable=False) -> Tensor");
  lib.def("simd() -> bool", &simd);  // whether this build has the AVX-512 path
}

TORCH_LIBRARY_IMPL(minillm_panel, CPU, lib) { lib.impl("linear", &linear); }
