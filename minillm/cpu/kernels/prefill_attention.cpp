// Causal prefill attention on the CPU for a prompt chunk with nothing cached before it, float32:
// FlashAttention-2's loop (kernels/prefill.py is the same algorithm in Triton for a GPU).
//
// What the course teaches here (book/architecture.md, "Prefill attention on the CPU"): a prompt of L
// tokens attends with L^2/2 query-key pairs per head. torch's CPU flash kernel
// (scaled_dot_product_attention) splits its work for long sequences and runs a prompt of 16-256 tokens
// at 50-80 GFLOP/s on a 2-vCPU Zen 5, about a sixth of what the same cores reach in the model's
// linears. This kernel is FlashAttention's loop at the size of a short prompt:
//
//   one task = one K/V head and a block of QB query positions; its rows are the G query heads
//   of that group (GQA: the K/V block is read once for all G) times the QB positions
//   for each block of KB keys up to the task's last position (causal):
//     S = (Q * scale) K^T           register tiles: RS query rows x KB keys, K^T packed per block
//     mask the keys after each query (diagonal blocks only)
//     online softmax: m' = max(m, rowmax S); P = e^(S - m'); l = l e^(m - m') + rowsum P; O *= e^(m - m')
//     O += P V                      register tiles: RO query rows x D columns
//   out = O / l
//
// Tasks are handed out from both ends of the causal triangle (cheap, dear, cheap, ...) so the two
// halves a static split gives each thread cost about the same. The exponentials are
// kernels/cpu/vec_exp.h's (Cephes' expf, relative error ~2e-7, as the paged decode uses).
// Registered as torch.ops.minillm_prefill; kernels/prefill_attention_cpu.py builds it for this CPU
// (AVX-512 or AVX2 + FMA; elsewhere torch's kernel runs).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

#include "vec_exp.h"
#define MINILLM_PREFILL_SIMD 1
#endif

namespace {

#if defined(__AVX512F__)
constexpr int VW = 16;
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vset1(float s) { return _mm512_set1_ps(s); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
inline float hmax(vec v) { return _mm512_reduce_max_ps(v); }
inline float hsum(vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(MINILLM_PREFILL_SIMD)
constexpr int VW = 8;
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vset1(float s) { return _mm256_set1_ps(s); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
inline float hmax(vec v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  return *std::max_element(t, t + 8);
}
inline float hsum(vec v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#endif

#if defined(MINILLM_PREFILL_SIMD)
inline vec vexp(vec x) { return minillm_vec::exp_ps(x); }  // kernels/cpu/vec_exp.h

constexpr int QB = 16;        // query positions per task
constexpr int KB = 2 * VW;    // keys per block: two vectors of scores per query row
constexpr int RS = 4;         // query rows per register tile of S (RS x 2 accumulators)
constexpr int MAX_DV = 16;    // head_dim / VW supported (256 with AVX-512, 128 with AVX2)

struct Views {
  const float *q, *k, *v;
  float* out;
  int64_t sq0, sq1, sk0, sk1, sv0, sv1, so0, so1;
  int64_t len, heads, kv_heads, d;
  float scale;
};

// S[rows][KB] = Qs[rows][d] . KT[d][KB] for rows in [0, rows)
void scores(const float* qs, int64_t rows, int64_t d, const float* kt, float* s) {
  int64_t r = 0;
  for (; r + RS <= rows; r += RS) {
    vec a0[RS], a1[RS];
    for (int i = 0; i < RS; ++i) a0[i] = a1[i] = vzero();
    for (int64_t c = 0; c < d; ++c) {
      const vec k0 = vload(kt + c * KB), k1 = vload(kt + c * KB + VW);
      for (int i = 0; i < RS; ++i) {
        const vec b = vset1(qs[(r + i) * d + c]);
        a0[i] = vfma(b, k0, a0[i]);
        a1[i] = vfma(b, k1, a1[i]);
      }
    }
    for (int i = 0; i < RS; ++i) vstore(s + (r + i) * KB, a0[i]), vstore(s + (r + i) * KB + VW, a1[i]);
  }
  for (; r < rows; ++r) {
    vec a0 = vzero(), a1 = vzero();
    for (int64_t c = 0; c < d; ++c) {
      const vec b = vset1(qs[r * d + c]);
      a0 = vfma(b, vload(kt + c * KB), a0);
      a1 = vfma(b, vload(kt + c * KB + VW), a1);
    }
    vstore(s + r * KB, a0), vstore(s + r * KB + VW, a1);
  }
}

// O[rows][DV * VW] += P[rows][kn] . V[kn][d], RO rows per register tile
template <int DV>
void weighted_values(const float* p, int64_t rows, int64_t kn, const float* vb, float* o) {
  constexpr int RO = std::max(1, (VW == 16 ? 16 : 8) / DV);  // accumulators: half or a third of the registers
  int64_t r = 0;
  for (; r + RO <= rows; r += RO) {
    vec acc[RO][DV];
    for (int i = 0; i < RO; ++i)
      for (int c = 0; c < DV; ++c) acc[i][c] = vload(o + (r + i) * DV * VW + c * VW);
    for (int64_t j = 0; j < kn; ++j) {
      vec vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = vload(vb + j * DV * VW + c * VW);
      for (int i = 0; i < RO; ++i) {
        const vec w = vset1(p[(r + i) * KB + j]);
        for (int c = 0; c < DV; ++c) acc[i][c] = vfma(w, vv[c], acc[i][c]);
      }
    }
    for (int i = 0; i < RO; ++i)
      for (int c = 0; c < DV; ++c) vstore(o + (r + i) * DV * VW + c * VW, acc[i][c]);
  }
  for (; r < rows; ++r)
    for (int64_t j = 0; j < kn; ++j) {
      const vec w = vset1(p[r * KB + j]);
      for (int c = 0; c < DV; ++c)
        vstore(o + r * DV * VW + c * VW, vfma(w, vload(vb + j * DV * VW + c * VW), vload(o + r * DV * VW + c * VW)));
    }
}

// one task: K/V head h, query positions [q0, q1)
template <int DV>
void attend_block(const Views& x, int64_t h, int64_t q0, int64_t q1, std::vector<float>& buf) {
  constexpr int64_t d = DV * VW;
  const int64_t group = x.heads / x.kv_heads, nq = q1 - q0, rows = group * nq;
  buf.resize(rows * d * 2 + d * KB + KB * d + rows * KB);
  float *qs = buf.data(), *o = qs + rows * d, *kt = o + rows * d, *vb = kt + d * KB, *s = vb + KB * d;
  std::vector<float> m(rows, -std::numeric_limits<float>::infinity()), l(rows, 0.f);
  for (int64_t g = 0; g < group; ++g)  // row g * nq + i: query head h * group + g at position q0 + i, pre-scaled
    for (int64_t i = 0; i < nq; ++i) {
      const float* src = x.q + (q0 + i) * x.sq0 + (h * group + g) * x.sq1;
      for (int64_t c = 0; c < d; ++c) qs[(g * nq + i) * d + c] = src[c] * x.scale;
    }
  std::fill(o, o + rows * d, 0.f);
  for (int64_t k0 = 0; k0 < q1; k0 += KB) {
    const int64_t kn = std::min<int64_t>(KB, q1 - k0);
    for (int64_t j = 0; j < KB; ++j) {  // K^T and V of this block; keys past kn are zero (and masked)
      const float* kr = x.k + (k0 + j) * x.sk0 + h * x.sk1;
      const float* vr = x.v + (k0 + j) * x.sv0 + h * x.sv1;
      for (int64_t c = 0; c < d; ++c) {
        kt[c * KB + j] = j < kn ? kr[c] : 0.f;
        vb[j * d + c] = j < kn ? vr[c] : 0.f;
      }
    }
    scores(qs, rows, d, kt, s);
    const bool diagonal = k0 + KB > q0;  // some key of this block may lie after some query
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s + r * KB;
      const int64_t pos = q0 + r % nq;
      if (diagonal)
        for (int64_t j = 0; j < KB; ++j)
          if (k0 + j > pos || j >= kn) sr[j] = -std::numeric_limits<float>::infinity();
      const float mnew = std::max(m[r], std::max(hmax(vload(sr)), hmax(vload(sr + VW))));
      if (mnew == -std::numeric_limits<float>::infinity()) continue;  // no key yet (never for a causal row)
      const vec mv = vset1(mnew);
      const vec p0 = vexp(vsub(vload(sr), mv)), p1 = vexp(vsub(vload(sr + VW), mv));
      vstore(sr, p0), vstore(sr + VW, p1);
      const float corr = std::exp(m[r] - mnew);  // 0 on the first block (m = -inf)
      l[r] = l[r] * corr + hsum(p0) + hsum(p1);
      m[r] = mnew;
      if (corr != 1.f)
        for (int64_t c = 0; c < d; ++c) o[r * d + c] *= corr;
    }
    weighted_values<DV>(s, rows, kn, vb, o);
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t r = g * nq + i;
      const float inv = 1.f / l[r];
      float* dst = x.out + (q0 + i) * x.so0 + (h * group + g) * x.so1;
      for (int64_t c = 0; c < d; ++c) dst[c] = o[r * d + c] * inv;
    }
}

template <int DV>
void run(const Views& x) {
  const int64_t nblocks = (x.len + QB - 1) / QB, tasks = nblocks * x.kv_heads;
  at::parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t % x.kv_heads, i = t / x.kv_heads;
      const int64_t b = i % 2 == 0 ? i / 2 : nblocks - 1 - i / 2;  // 0, last, 1, last - 1, ...: even halves
      attend_block<DV>(x, h, b * QB, std::min<int64_t>(x.len, (b + 1) * QB), buf);
    }
  });
}
#endif

at::Tensor causal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && q.size(0) == k.size(0) && q.size(2) == k.size(2),
              "minillm_prefill: q [L, heads, D], k and v [L, kv_heads, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                  q.device().is_cpu() && q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "minillm_prefill: float32 CPU tensors with unit stride along D");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "minillm_prefill: heads must be a multiple of kv_heads");
  at::Tensor out = at::empty(q.sizes(), q.options());
#if defined(MINILLM_PREFILL_SIMD)
  const int64_t d = q.size(2);
  TORCH_CHECK(d % VW == 0 && d / VW <= MAX_DV, "minillm_prefill: head_dim ", d, " is not a multiple of ", VW,
              " up to ", MAX_DV * VW);
  const Views x{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), out.data_ptr<float>(),
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                out.stride(0), out.stride(1), q.size(0), q.size(1), k.size(1), d, static_cast<float>(scale)};
  switch (d / VW) {
    case 1: run<1>(x); break;
    case 2: run<2>(x); break;
    case 4: run<4>(x); break;
    case 8: run<8>(x); break;
    case 16: run<16>(x); break;
    default: TORCH_CHECK(false, "minillm_prefill: head_dim ", d, " is not ", VW, " times a power of two");
  }
  return out;
#else
  TORCH_CHECK(false, "minillm_prefill: built without AVX2 or AVX-512");
#endif
}

std::string isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(MINILLM_PREFILL_SIMD)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY(minillm_prefill, lib) {
  lib.def("causal(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
  lib.def("isa() -> str", &isa);
}

TORCH_LIBRARY_IMPL(minillm_prefill, CPU, lib) { lib.impl("causal", &causal); }
