// A float32 decoder layer's elementwise steps on the CPU, one pass each: the residual add with the
// RMSNorm after it, and the rotary embedding of q and k.
//
// What the course teaches here (book/architecture.md, "Fused elementwise steps on the CPU"): in
// plain PyTorch, `residual + x` and then rms_norm (pow, mean, add, rsqrt, mul, mul) walk the hidden
// state seven times and dispatch seven ops; RoPE's rotate-half (two chunks, four muls, a sub, an
// add, a cat) walks q and k about nine times. At a batched step's hundreds of rows every walk is
// memory traffic; at batch 1 every op is ~2-5 us of dispatch. These kernels read each input once and
// write each output once, as vLLM's fused_add_rms_norm and rotary_embedding kernels do on a GPU (and
// kernels/rmsnorm.py, kernels/rope.py here, in Triton). The PyTorch layers (models/layers.py) stay
// the reference the tests compare against; the sums run in another order, so results agree to float32
// rounding, not bit for bit.
//
//   add_rms_norm(x, residual, w, eps) -> (s / sqrt(mean(s^2) + eps) * w, s)   with s = residual + x
//   rms_norm(x, w, eps)               -> x / sqrt(mean(x^2) + eps) * w
//   rope(x [T, heads, D], cos [T, D/2], sin [T, D/2]) -> [T, heads, D] contiguous:
//        out[:D/2] = x1 cos - x2 sin, out[D/2:] = x2 cos + x1 sin   (x1, x2 the halves of each head)
//   silu_mul(gate_up [T, 2I]) -> silu(gate) * up [T, I]   (SwiGLU's activation; 16 or 8 at a time with
//        AVX-512 or AVX2, e^x from kernels/cpu/vec_exp.h; elsewhere std::exp per element)
//
// Rows are split across threads once there are enough of them to pay for it (GRAIN_ROWS).
// Registered as torch.ops.minillm_fused; kernels/fused_cpu.py builds it for this CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "elementwise_rows.h"  // norm_row, rope_head, silu_mul_run: one row each

namespace {

constexpr int64_t GRAIN_ROWS = 64;  // below this a step's rows stay on one thread (a fork costs ~5 us)

at::Tensor rows_of(const at::Tensor& x, int64_t h) {
  at::Tensor x2 = x.reshape({-1, h});
  return x2.stride(1) == 1 ? x2 : x2.contiguous();  // a column-major product: transpose it once
}

void check_norm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "minillm_fused: float32 CPU tensors only");
  TORCH_CHECK(w.dim() == 1 && w.scalar_type() == at::kFloat && w.is_contiguous() && x.size(-1) == w.size(0),
              "minillm_fused: the weight must be a contiguous float32 vector of x's last size");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_norm(x, w);
  const int64_t h = x.size(-1);
  const at::Tensor x2 = rows_of(x, h);
  const int64_t rows = x2.size(0), sx = x2.stride(0);
  at::Tensor y = at::empty({rows, h}, x.options());
  const float *px = x2.data_ptr<float>(), *pw = w.data_ptr<float>();
  float* py = y.data_ptr<float>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(px + r * sx, pw, py + r * h, h, static_cast<float>(eps));
  });
  return y.view(x.sizes());
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& w,
                                                double eps) {
  check_norm(x, w);
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat,
              "minillm_fused: the residual must be float32 of x's shape");
  const int64_t h = x.size(-1);
  const at::Tensor x2 = rows_of(x, h), r2 = rows_of(residual, h);
  const int64_t rows = x2.size(0), sx = x2.stride(0), sr = r2.stride(0);
  at::Tensor y = at::empty({rows, h}, x.options()), s = at::empty({rows, h}, x.options());
  const float *px = x2.data_ptr<float>(), *pr = r2.data_ptr<float>(), *pw = w.data_ptr<float>();
  float *py = y.data_ptr<float>(), *ps = s.data_ptr<float>();
  at::parallel_for(0, rows, GRAIN_ROWS, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = px + r * sx, *rr = pr + r * sr;
      float* sum = ps + r * h;
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) sum[i] = rr[i] + xr[i];  // residual first, as the PyTorch layer adds
      norm_row(sum, pw, py + r * h, h, static_cast<float>(eps));
    }
  });
  return {y.view(x.sizes()), s.view(x.sizes())};
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  TORCH_CHECK(x.dim() == 3 && x.device().is_cpu() && x.scalar_type() == at::kFloat && x.stride(2) == 1,
              "minillm_fused: rope wants float32 x [T, heads, D] with unit stride along D");
  const int64_t t = x.size(0), heads = x.size(1), d = x.size(2), half = d / 2;
  TORCH_CHECK(d % 2 == 0, "minillm_fused: rope needs an even head_dim");
  const at::Tensor cs = cos_in.reshape({t, half}).contiguous(), sn = sin_in.reshape({t, half}).contiguous();
  TORCH_CHECK(cs.scalar_type() == at::kFloat && sn.scalar_type() == at::kFloat, "minillm_fused: float32 cos/sin");
  at::Tensor out = at::empty({t, heads, d}, x.options());
  const float *px = x.data_ptr<float>(), *pc = cs.data_ptr<float>(), *psn = sn.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const int64_t st = x.stride(0), sh = x.stride(1);
  at::parallel_for(0, t, GRAIN_ROWS, [&](int64_t t0, int64_t t1) {
    for (int64_t i = t0; i < t1; ++i) {
      const float *c = pc + i * half, *s = psn + i * half;
      for (int64_t h = 0; h < heads; ++h) {
        rope_head(px + i * st + h * sh, c, s, po + (i * heads + h) * d, half);
      }
    }
  });
  return out;
}

// gate_up [T, 2I] -> silu(gate) * up [T, I] in gate_up's layout: row-major rows, or the column-major
// product a SkinnyLinear hands on (strides (1, T)), whose gate and up halves are each one contiguous run
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.device().is_cpu() && gate_up.scalar_type() == at::kFloat &&
                  gate_up.size(1) % 2 == 0,
              "minillm_fused: silu_mul wants float32 gate_up [T, 2I]");
  const int64_t t = gate_up.size(0), inter = gate_up.size(1) / 2;
  const bool column = t > 1 && gate_up.stride(0) == 1 && gate_up.stride(1) == t;
  const at::Tensor x = column || gate_up.stride(1) == 1 ? gate_up : gate_up.contiguous();
  const float* px = x.data_ptr<float>();
  if (column) {  // gate = the first I x T floats, up = the next
    at::Tensor y = at::empty({inter, t}, x.options());
    float* py = y.data_ptr<float>();
    const int64_t n = inter * t, chunk = 4096;
    at::parallel_for(0, (n + chunk - 1) / chunk, 16, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = c * chunk, m = std::min(chunk, n - i);
        silu_mul_run(px + i, px + n + i, py + i, m);
      }
    });
    return y.t();
  }
  at::Tensor y = at::empty({t, inter}, x.options());
  float* py = y.data_ptr<float>();
  const int64_t sx = x.stride(0);
  at::parallel_for(0, t, GRAIN_ROWS, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) silu_mul_run(px + r * sx, px + r * sx + inter, py + r * inter, inter);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(minillm_fused, lib) {
  lib.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  lib.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  lib.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  lib.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_fused, CPU, lib) {
  lib.impl("rms_norm", &rms_norm);
  lib.impl("add_rms_norm", &add_rms_norm);
  lib.impl("rope", &rope);
  lib.impl("silu_mul", &silu_mul);
}
