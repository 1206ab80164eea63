// e^x for a vector of floats: Cephes' expf, shared by the CPU kernels that need an exponential per
// element (the paged decode's and the causal prefill's softmax, the fused SiLU).
//
// x = n ln2 + r with n an integer and |r| <= ln2 / 2 (ln2 taken in two parts, so r is exact), e^r by
// a degree-5 polynomial, and 2^n written into the exponent bits. Relative error ~2e-7, as std::exp's
// float result; a scalar libm call per element was a third of a decode step's attention time.
// x is clamped to [-87.3, 88.3]: below, e^x would be a denormal (flushed towards 0); above, infinity.
// kernels/gguf_cpu.py's build hashes this header with each source that includes it.
#pragma once

#include <immintrin.h>

namespace minillm_vec {

template <class V>
struct Ops;

#if defined(__AVX2__) && defined(__FMA__)
template <>
struct Ops<__m256> {
  static __m256 set1(float v) { return _mm256_set1_ps(v); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 clamp(__m256 x, float lo, float hi) { return _mm256_min_ps(_mm256_max_ps(x, set1(lo)), set1(hi)); }
  static __m256 round(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m256 pow2(__m256 n) {  // 2^n for integral n
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
};
#endif

#if defined(__AVX512F__)
template <>
struct Ops<__m512> {
  static __m512 set1(float v) { return _mm512_set1_ps(v); }
  static __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 clamp(__m512 x, float lo, float hi) { return _mm512_min_ps(_mm512_max_ps(x, set1(lo)), set1(hi)); }
  static __m512 round(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m512 pow2(__m512 n) { return _mm512_scalef_ps(set1(1.f), n); }
};
#endif

template <class V>
inline V exp_ps(V x) {
  using O = Ops<V>;
  x = O::clamp(x, -87.3f, 88.3f);
  const V n = O::round(O::mul(x, O::set1(1.44269504088896341f)));
  V r = O::fma(n, O::set1(-0.693359375f), x);
  r = O::fma(n, O::set1(2.12194440e-4f), r);
  V y = O::set1(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = O::fma(y, r, O::set1(c));
  y = O::fma(y, O::mul(r, r), O::fma(O::set1(1.f), O::set1(1.f), r));  // y r^2 + r + 1
  return O::mul(y, O::pow2(n));
}

}  // namespace minillm_vec
