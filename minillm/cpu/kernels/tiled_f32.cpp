// y = x @ W.T (+ b) for a batch of rows of x (a batched decode step: 24 to 192; a wide layer at any count), float32.
//
// What the course teaches here (book/architecture.md, "Batched float products"): with 24-192 rows
// a linear is bound by arithmetic, not by reading W, so the question is how close the FMA units
// get to their peak. MKL's sgemm on W @ x.T gets there when W is already in cache (~195 GFLOP/s
// on a 2-core EPYC Zen 4) but loses ~15% when W streams from memory, as it does in a decode step
// (each layer's weights are read once per step): it packs W into panels with no look-ahead.
// This kernel reads W in place (nn.Linear's [out, in] rows) and never packs it:
//
//   pack x into x^T blocks of RB rows:     xt[block][k][RB]            (rows x in, cheap next to W)
//   for each MR-row tile of W (threads split the tiles):
//     for each RB-row block of x:
//       acc[MR][RB] = 0                    (MR x 2 vectors: 24 of the 32 AVX-512 registers)
//       for k:  acc[i][:] += W[o + i, k] * xt[block][k][:]    (a broadcast and two FMAs per i)
//       store acc as C[o + i, rows]  (column-major y: the strides a SkinnyLinear with
//                                     column_major_out returns), or scattered into row-major y
//   while the first block runs, the next tile's W rows are prefetched: the look-ahead MKL lacks.
//
// The W tile (MR rows of `in` floats; 27 KB at in = 576) stays in L1 across the x blocks; each
// x^T block (RB x KC floats) in L2. `in` above KC is split so a W tile still fits in L1.
// Registered as torch.ops.minillm_tiled.linear; kernels/tiled_cpu.py builds it for this CPU
// (AVX-512, AVX2 + FMA, or portable C++ the compiler vectorizes).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace {

#if defined(__AVX512F__)
constexpr int VW = 16;  // floats per vector
constexpr int MR = 12;  // W rows per tile: 2 * MR accumulators + 2 x vectors + a broadcast <= 32 registers
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vset1(float v) { return _mm512_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline __mmask16 lanes(int n) { return n >= VW ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
inline vec vload_n(const float* p, int n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
inline void vstore_n(float* p, vec v, int n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int VW = 8;
constexpr int MR = 6;  // 2 * 6 accumulators + 2 x vectors + a broadcast <= 16 registers
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vset1(float v) { return _mm256_set1_ps(v); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline __m256i lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline vec vload_n(const float* p, int n) { return n <= 0 ? vzero() : _mm256_maskload_ps(p, lanes(n)); }
inline void vstore_n(float* p, vec v, int n) { if (n > 0) _mm256_maskstore_ps(p, lanes(n), v); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
#else  // portable: 8-float arrays the compiler vectorizes for whatever the target has
constexpr int VW = 8;
constexpr int MR = 6;
struct vec { float v[VW]; };
inline vec vzero() { vec r{}; return r; }
inline vec vload(const float* p) { vec r; for (int j = 0; j < VW; ++j) r.v[j] = p[j]; return r; }
inline vec vset1(float s) { vec r; for (int j = 0; j < VW; ++j) r.v[j] = s; return r; }
inline vec vfma(vec a, vec b, vec c) { for (int j = 0; j < VW; ++j) c.v[j] += a.v[j] * b.v[j]; return c; }
inline vec vload_n(const float* p, int n) { vec r{}; for (int j = 0; j < std::min(n, VW); ++j) r.v[j] = p[j]; return r; }
inline void vstore_n(float* p, vec v, int n) { for (int j = 0; j < std::min(n, VW); ++j) p[j] = v.v[j]; }
inline void vstore(float* p, vec v) { for (int j = 0; j < VW; ++j) p[j] = v.v[j]; }
inline void prefetch(const float*) {}
#endif

constexpr int RB = 2 * VW;     // rows of x per register tile
constexpr int64_t KC = 1024;   // `in` per pass: MR rows of W (48 KB at AVX-512's MR) stay in L1/L2 across the x blocks

// x rows [0, n) (n <= RB; x[r, t] at x[r * sr + t * st]) -> xt[k][RB], rows past n zero. Either
// layout reads x in order: nn.Linear's rows (st = 1), or the column-major activations a
// column_major_out layer's readers pass on (sr = 1).
void pack_block(const float* x, int64_t sr, int64_t st, float* xt, int64_t n, int64_t k) {
  if (st == 1) {
    for (int64_t r = 0; r < RB; ++r)
      for (int64_t t = 0; t < k; ++t) xt[t * RB + r] = r < n ? x[r * sr + t] : 0.f;
  } else {
    for (int64_t t = 0; t < k; ++t)
      for (int64_t r = 0; r < RB; ++r) xt[t * RB + r] = r < n ? x[r * sr + t * st] : 0.f;
  }
}

struct Out {
  float* y;
  int64_t rows, n;
  bool row_major;  // y[rows, n] (nn.Linear's layout) or y[n, rows] (its transpose, column-major y)
};

// acc for W rows [o, o + R) and x rows [r0, r0 + cols) over in [k0, k1), added to what an earlier pass stored.
template <int R, bool Half>  // Half: at most VW rows of x, one vector per accumulator row (a short last block)
void tile(const float* w, int64_t k, int64_t k0, int64_t k1, const float* xt, const float* bias, const Out& out,
          int64_t o, int64_t r0, int cols, const float* w_next, int64_t next_rows) {
  vec acc0[R], acc1[R];
  float buf[RB];
  for (int i = 0; i < R; ++i) {
    if (k0 > 0) {  // a later pass over `in`: continue from the stored partial sums
      if (out.row_major) {
        for (int j = 0; j < RB; ++j) buf[j] = j < cols ? out.y[(r0 + j) * out.n + o + i] : 0.f;
        acc0[i] = vload(buf);
        if (!Half) acc1[i] = vload(buf + VW);
      } else {
        const float* c = out.y + (o + i) * out.rows + r0;
        acc0[i] = vload_n(c, cols);
        if (!Half) acc1[i] = vload_n(c + VW, cols - VW);
      }
    } else {
      acc0[i] = acc1[i] = bias ? vset1(bias[o + i]) : vzero();
    }
  }
  const float* wt = w + o * k;
  // one prefetch round per 16 steps fetches lines_per_step lines of each next-tile row: the whole tile over this pass
  const int64_t lines_per_step = (k + (k1 - k0) - 1) / (k1 - k0);
  for (int64_t t = k0; t < k1; ++t) {
    if (w_next && (t & 15) == 0) {
      for (int64_t i = 0; i < next_rows; ++i)
        for (int64_t s = 0; s < lines_per_step; ++s) {
          const int64_t at = (t - k0) * lines_per_step + s * 16;
          if (at < k) prefetch(w_next + i * k + at);
        }
    }
    const vec x0 = vload(xt + t * RB);
    if (Half) {
      for (int i = 0; i < R; ++i) acc0[i] = vfma(vset1(wt[i * k + t]), x0, acc0[i]);
    } else {
      const vec x1 = vload(xt + t * RB + VW);
      for (int i = 0; i < R; ++i) {
        const vec wb = vset1(wt[i * k + t]);
        acc0[i] = vfma(wb, x0, acc0[i]);
        acc1[i] = vfma(wb, x1, acc1[i]);
      }
    }
  }
  if (out.row_major) {  // transpose through the stack: each row of y gets R neighbouring floats
    float t[R][RB];
    for (int i = 0; i < R; ++i) {
      vstore(t[i], acc0[i]);
      if (!Half) vstore(t[i] + VW, acc1[i]);
    }
    for (int j = 0; j < cols; ++j) {
      float* yr = out.y + (r0 + j) * out.n + o;
      for (int i = 0; i < R; ++i) yr[i] = t[i][j];
    }
    return;
  }
  for (int i = 0; i < R; ++i) {
    float* c = out.y + (o + i) * out.rows + r0;
    vstore_n(c, acc0[i], cols);
    if (!Half) vstore_n(c + VW, acc1[i], cols - VW);
  }
}

void tile_rows(int64_t r, const float* w, int64_t k, int64_t k0, int64_t k1, const float* xt, const float* bias,
               const Out& out, int64_t o, int64_t r0, int cols, const float* w_next, int64_t next_rows) {
  const bool half = cols <= VW;
  switch (r) {
#define TILE(R)                                                                   \
  case R:                                                                         \
    if (half) tile<R, true>(w, k, k0, k1, xt, bias, out, o, r0, cols, w_next, next_rows);  \
    else tile<R, false>(w, k, k0, k1, xt, bias, out, o, r0, cols, w_next, next_rows);      \
    break;
    TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
#if defined(__AVX512F__)  // MR = 12
    TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#endif
#undef TILE
    default: TORCH_CHECK(false, "tile of ", r, " rows");
  }
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  bool row_major_out) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [M, K] and weight [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "float32 only");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);  // x: any strides (packing reads them)
  const float* b = nullptr;
  at::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    bc = bias->contiguous();
    TORCH_CHECK(bc.scalar_type() == at::kFloat && bc.numel() == n, "bias [N] float32");
    b = bc.data_ptr<float>();
  }
  at::Tensor y = row_major_out ? at::empty({m, n}, x.options()) : at::empty({n, m}, x.options());
  if (m == 0 || n == 0) return y;
  const int64_t blocks = (m + RB - 1) / RB;
  at::Tensor xt = at::empty({blocks * k * RB}, x.options());
  const float* xp = x.data_ptr<float>();
  const int64_t sr = x.stride(0), st = x.stride(1);
  float* xtp = xt.data_ptr<float>();
  at::parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t bl = lo; bl < hi; ++bl)
      pack_block(xp + bl * RB * sr, sr, st, xtp + bl * k * RB, std::min<int64_t>(RB, m - bl * RB), k);
  });
  const Out out{y.data_ptr<float>(), m, n, row_major_out};
  const float* w = weight.data_ptr<float>();
  const int64_t tiles = (n + MR - 1) / MR;
  at::parallel_for(0, tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t ti = lo; ti < hi; ++ti) {
      const int64_t o = ti * MR, r = std::min<int64_t>(MR, n - o);
      const int64_t next_rows = std::min<int64_t>(MR, n - o - r);
      for (int64_t k0 = 0; k0 < k; k0 += KC) {
        const int64_t k1 = std::min(k, k0 + KC);
        for (int64_t bl = 0; bl < blocks; ++bl) {
          const float* w_next = (bl == 0 && k0 == 0 && next_rows > 0) ? w + (o + r) * k : nullptr;
          tile_rows(r, w, k, k0, k1, xtp + bl * k * RB, b, out, o, bl * RB,
                    static_cast<int>(std::min<int64_t>(RB, m - bl * RB)), w_next, next_rows);
        }
      }
    }
  });
  return y;
}

std::string isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY(minillm_tiled, lib) {
  lib.def("linear(Tensor x, Tensor weight, Tensor? bias, bool row_major_out) -> Tensor");
  lib.def("isa() -> str", &isa);  // the instruction set this build's tiles use (recorded in the bench JSON)
}

TORCH_LIBRARY_IMPL(minillm_tiled, CPU, lib) { lib.impl("linear", &linear); }
