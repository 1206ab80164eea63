// GGUF block formats multiplied in place: y = x @ W.T where W is a GGUF tensor's own bytes.
//
// What the course teaches here (book/architecture.md, "GGUF on the CPU"):
// batch-1 decode reads every weight once per token, so its speed is bytes read per
// token divided by memory bandwidth. Keeping the file's 4/5/6/8-bit blocks and
// multiplying them directly reads 4-7x fewer bytes than float32. Like llama.cpp,
// the activation row is quantized to int8 in blocks of 32 (one float scale per
// block) so each weight block meets its activation block in an integer dot product
// (AVX2 maddubs, or AVX-512/AVX VNNI dpbusd), and the block scales are applied once
// per 32 weights in float.
//
// Formats (ggml type id; bytes per block; dequantized weight):
//   Q4_0 (2)  32 w, 18 B: fp16 d, 16 B nibbles          w = d (q - 8)
//   Q4_1 (3)  32 w, 20 B: fp16 d, fp16 m, 16 B nibbles  w = d q + m
//   Q5_0 (6)  32 w, 22 B: fp16 d, 4 B high bits, 16 B   w = d (q - 16), q = nibble | bit << 4
//   Q8_0 (8)  32 w, 34 B: fp16 d, 32 int8               w = d q
//   Q4_K (12) 256 w, 144 B: fp16 d, dmin, 12 B of 6-bit (sc, m) x 8, 128 B nibbles
//                                                      w = d sc_j q - dmin m_j  (sub-block j of 32)
//   Q6_K (14) 256 w, 210 B: 128 B low nibbles, 64 B high 2 bits, 16 int8 scales, fp16 d
//                                                      w = d sc_i (q - 32)      (sub-block i of 16)
// Our interleaved layouts (built at load by kernels/gguf_cpu.py, not file types): Q4_KX8 (1012) and
// Q4_1X8 (1003), Q5_0X8 (1006) and Q8_0X8 (1008) hold 8 rows' blocks side by side so one register's lanes carry 8 rows' dot products.
// Nibble order: Q4_0/1 and Q5_0 hold elements 0..15 in the low nibbles and 16..31 in
// the high ones; Q4_K's 32-byte chunk c holds sub-block 2c low and 2c+1 high.
//
// Activation blocks (quantize_act): codes xq int8 [M, K], one float scale per block xd
// [M, K / block], the integer sum of every 16 codes bs int16 [M, K / 16] (|sum| <= 2032)
// and, per 32, the scale times the codes' sum xs float [M, K / 32] (the
// offsets -8, -16, -32 and the Q4_1/Q4_K mins multiply sum(x) of a block). The block
// is 32 for the 32-weight types (each weight block has its own scale anyway) and 256
// for the K-quants: with one activation scale per super-block, a super-block's eight
// or sixteen sub-block products are summed in integers (scales applied by madd) and
// converted to float once, as llama.cpp's Q8_K does.
//
// One weight row meets up to four activation rows while its bytes are in L1, so a
// batched decode step unpacks each block once per four sequences (TILE below).
//
// With AVX-512 VNNI, Q4_KX8 takes two steps per 64-byte load (dot_q4k_x8) and its mins two sub-blocks
// per madd. On a 2-vCPU AMD Zen 5 (full-width 512-bit units), 1.5B-shaped Q4_K layers, 6 layers in
// turn: 4 rows 0.86 -> 0.76 ms a layer, 8 rows 1.60 -> 1.36 ms; the 1.5B's speculative step with the
// 0.5B draft at k = 3 cost 2.50 -> 2.39 plain steps. Integer sums either way: the same results.
// With AVX-512 BW, Q6_K (row by row) unpacks and multiplies 64 codes per instruction (dot_q6k_512):
// same machine, Qwen2.5-1.5B's Q6_K LM head at 4 rows 7.15 -> 4.78 ms, at 1 row 3.8 ms either way;
// the speculative step above 2.39 -> 2.25-2.31 plain steps.
//
// Registered as torch ops (torch.ops.minillm_gguf.*) so torch.compile sees them as
// opaque calls; the Python side (kernels/gguf_cpu.py) builds this file once per CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14;
// Q4_K with 8 rows interleaved (our layout, not a file's; kernels/gguf_cpu.py repack_q4k_x8): per 8 rows
// and super-block, 1184 bytes = fp16 d[8], dmin[8]; uint8 sc[8 sub-blocks][8 rows], m[8][8]; then the
// codes as [chunk 4][step 8][row 8][4 bytes], so one 32-byte load holds 4 bytes of each of 8 rows
constexpr int64_t Q4_KX8 = 1012;
// Q4_1 with 8 rows interleaved (kernels/gguf_cpu.py repack_q4_1_x8; Q4_0 goes there too, its offset -8 d
// written as the min): per 8 rows and block of 32, 160 bytes = fp16 d[8], m[8]; then the codes as
// [step 4][row 8][4 bytes] -- the same 20 bytes per row and block as Q4_1
constexpr int64_t Q4_1X8 = 1003;
// Q8_0 with 8 rows interleaved (repack_q8_0_x8): per 8 rows and block of 32, 272 bytes = fp16 d[8], then
// the codes as [step 8][row 8][4 bytes] -- Q8_0's 34 bytes per row and block
constexpr int64_t Q8_0X8 = 1008;
// Q5_0 with 8 rows interleaved (repack_q5_0_x8): per 8 rows and block of 32, 176 bytes = fp16 d[8]; the
// high bits as uint32 hb[8], reordered so byte s of row i's word holds the high bits of elements
// 4s..4s+3 (low nibble) and 16+4s..16+4s+3 (high nibble), the two halves step s reads; then the codes
// as [step 4][row 8][4 bytes] like Q4_1X8 -- Q5_0's 22 bytes per row and block
constexpr int64_t Q5_0X8 = 1006;

inline float fp16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#if defined(__F16C__)
  return _cvtsh_ss(bits);
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// Software prefetch distance for the streaming kernels: a layer is a short run of rows read once per
// token, too short for the hardware prefetcher to ramp up. 2560 bytes ahead measured best of 640 /
// 1280 / 2560 / 5120 (the default model's 120 Q4_1x8 layers at batch 1, 2 threads: 3.94 -> 3.45 ms).
constexpr int64_t PREFETCH_BYTES = 2560;
inline void prefetch_lines(const uint8_t* p, int lines) {
#if defined(__GNUC__)
  for (int i = 0; i < lines; ++i) __builtin_prefetch(p + 64 * i, 0, 3);  // read, keep in every cache level
#else
  (void)p, (void)lines;
#endif
}

inline bool interleaved(int64_t t) { return t == Q4_KX8 || t == Q4_1X8 || t == Q5_0X8 || t == Q8_0X8; }
inline bool k_quant(int64_t t) { return t == Q4_K || t == Q6_K || t == Q4_KX8; }
int64_t block_weights(int64_t t) { return k_quant(t) ? 256 : 32; }

int64_t block_bytes(int64_t t) {
  switch (t) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q6_K: return 210;
    case Q4_KX8: return 148;  // 1184 / 8: per row and super-block
    case Q4_1X8: return 20;   // 160 / 8: per row and block of 32
    case Q8_0X8: return 34;   // 272 / 8: per row and block of 32
    case Q5_0X8: return 22;   // 176 / 8: per row and block of 32
  }
  TORCH_CHECK(false, "minillm_gguf: unsupported GGUF type id ", t);
}

// Q4_K's 12 packed bytes -> 6-bit scale and min of sub-block j.
inline void q4k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ----- dequantize one row (the float reference path, and prefill: dequantize, then BLAS) -----
void dequant_row(int64_t t, const uint8_t* w, float* y, int64_t k) {
  const int64_t nb = k / block_weights(t), bb = block_bytes(t);
  for (int64_t b = 0; b < nb; ++b, w += bb) {
    if (t == Q4_0 || t == Q4_1 || t == Q5_0) {
      const float d = fp16(w);
      const float m = t == Q4_1 ? fp16(w + 2) : 0.f;
      const uint8_t* qs = w + (t == Q4_0 ? 2 : t == Q4_1 ? 4 : 6);
      uint32_t qh = 0;
      if (t == Q5_0) std::memcpy(&qh, w + 2, 4);
      const int off = t == Q4_0 ? 8 : t == Q5_0 ? 16 : 0;
      for (int i = 0; i < 16; ++i) {
        int lo = qs[i] & 0xF, hi = qs[i] >> 4;
        if (t == Q5_0) {
          lo |= ((qh >> i) & 1) << 4;
          hi |= ((qh >> (i + 16)) & 1) << 4;
        }
        y[b * 32 + i] = d * (lo - off) + m;
        y[b * 32 + i + 16] = d * (hi - off) + m;
      }
    } else if (t == Q8_0) {
      const float d = fp16(w);
      for (int i = 0; i < 32; ++i) y[b * 32 + i] = d * static_cast<int8_t>(w[2 + i]);
    } else if (t == Q4_K) {
      const float d = fp16(w), dmin = fp16(w + 2);
      const uint8_t* qs = w + 16;
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        q4k_scale_min(w + 4, j, sc, m);
        const float ds = d * sc, dm = dmin * m;
        const uint8_t* q = qs + 32 * (j / 2);
        for (int i = 0; i < 32; ++i) y[b * 256 + 32 * j + i] = ds * ((j & 1) ? q[i] >> 4 : q[i] & 0xF) - dm;
      }
    } else {  // Q6_K
      const uint8_t *ql = w, *qh = w + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
      const float d = fp16(w + 208);
      float* out = y + b * 256;
      for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, out += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          out[l] = d * sc[is] * (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
          out[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          out[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          out[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
    }
  }
}

// ----- the activation side: int8 codes, one scale per block of 32 or 256, sums of 16 -----
void quantize_row(const float* x, int64_t k, int64_t block, int8_t* q, float* xd, int16_t* bs, float* xs) {
  for (int64_t b = 0; b < k / block; ++b) {
    const float* xb = x + b * block;
    int64_t i = 0;
    float amax = 0.f;
#if defined(__AVX2__)
    // 8 lanes at a time (block is 32 or 256): |x| by clearing the sign bit, round-to-nearest-even
    // conversion as std::nearbyint does, and the int32 codes packed down to int8 (|q| <= 127: no saturation)
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 vmax = _mm256_setzero_ps();
    for (; i + 8 <= block; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    for (float v : lanes) amax = std::max(amax, v);
#endif
    for (; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    xd[b] = d;
    i = 0;
#if defined(__AVX2__)
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' lane interleave
    for (; i + 32 <= block; i += 32) {
      __m256i c[4];
      for (int j = 0; j < 4; ++j) c[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * j), vid));
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * block + i), _mm256_permutevar8x32_epi32(packed, order));
    }
#endif
    for (; i < block; ++i) q[b * block + i] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
  }
  for (int64_t i = 0; i < k / 16; ++i) {
    int32_t s = 0;
    for (int l = 0; l < 16; ++l) s += q[16 * i + l];
    bs[i] = static_cast<int16_t>(s);
  }
  for (int64_t i = 0; i < k / 32; ++i) xs[i] = xd[i * 32 / block] * (bs[2 * i] + bs[2 * i + 1]);
}

struct Act {  // one quantized activation row
  const int8_t* q;
  const float* d;    // per block of 32 (32-weight types) or 256 (K-quants)
  const int16_t* bs; // sum of each 16 codes
  const float* xs;   // per 32: scale times the sum of the codes (the 32-weight types' offset terms)
};

inline int32_t sum32(const Act& a, int64_t blk32) { return a.bs[2 * blk32] + a.bs[2 * blk32 + 1]; }

inline void q4k_unpack_scales(const uint8_t* s, int* sc, int* m) {
  for (int j = 0; j < 8; ++j) q4k_scale_min(s, j, sc[j], m[j]);
}

// ----- one row dot product, portable C++ (the reference the SIMD versions must match) -----
// Not auto-vectorized under GCC: GCC 12.2 with -march=native on an AVX-512 VNNI CPU turned
// Q8_0's signed-by-signed byte sum into vpdpbusd (unsigned by signed) and returned wrong
// sums (measured here: -765.8 for -84.7; tests/test_gguf_cpu_kernels.py compares the paths).
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
float dot_scalar(int64_t t, const uint8_t* w, const Act& a, int64_t k) {
  const int64_t nb = k / block_weights(t), bb = block_bytes(t);
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b, w += bb) {
    const int8_t* x = a.q + b * block_weights(t);
    if (t == Q4_0 || t == Q4_1 || t == Q5_0) {
      const uint8_t* qs = w + (t == Q4_0 ? 2 : t == Q4_1 ? 4 : 6);
      uint32_t qh = 0;
      if (t == Q5_0) std::memcpy(&qh, w + 2, 4);
      int sum = 0;
      for (int i = 0; i < 16; ++i) {
        int lo = qs[i] & 0xF, hi = qs[i] >> 4;
        if (t == Q5_0) {
          lo |= ((qh >> i) & 1) << 4;
          hi |= ((qh >> (i + 16)) & 1) << 4;
        }
        sum += lo * x[i] + hi * x[i + 16];
      }
      const float d = fp16(w), xsum = a.xs[b];
      acc += d * a.d[b] * sum;
      if (t == Q4_1) acc += fp16(w + 2) * xsum;
      else acc -= (t == Q4_0 ? 8.f : 16.f) * d * xsum;
    } else if (t == Q8_0) {
      int sum = 0;
      for (int i = 0; i < 32; ++i) sum += static_cast<int8_t>(w[2 + i]) * x[i];
      acc += fp16(w) * a.d[b] * sum;
    } else if (t == Q4_K) {
      int sc[8], m[8];
      q4k_unpack_scales(w + 4, sc, m);
      int sumi = 0, mins = 0;
      for (int j = 0; j < 8; ++j) {
        const uint8_t* q = w + 16 + 32 * (j / 2);
        int sum = 0;
        for (int i = 0; i < 32; ++i) sum += ((j & 1) ? q[i] >> 4 : q[i] & 0xF) * x[32 * j + i];
        sumi += sc[j] * sum;
        mins += m[j] * sum32(a, b * 8 + j);
      }
      acc += a.d[b] * (fp16(w) * sumi - fp16(w + 2) * mins);
    } else {  // Q6_K
      const uint8_t *ql = w, *qh = w + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
      int sumi = 0;
      for (int h = 0; h < 2; ++h, ql += 64, qh += 32) {
        int sums[8] = {0};  // this half's sub-blocks of 16, in weight order
        const int8_t* xh = x + 128 * h;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          sums[is] += (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32) * xh[l];
          sums[is + 2] += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * xh[l + 32];
          sums[is + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * xh[l + 64];
          sums[is + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * xh[l + 96];
        }
        for (int i = 0; i < 8; ++i) sumi += sc[8 * h + i] * sums[i];
      }
      acc += fp16(w + 208) * a.d[b] * sumi;
    }
  }
  return acc;
}

#if defined(__AVX2__)
// 32 unsigned bytes . 32 signed bytes -> 8 int32 partial sums (lane i: bytes 4i..4i+3).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  // maddubs cannot saturate here: u <= 128 (Q8_0 via sign) or 31, |s| <= 127, 2 * 128 * 127 < 32767
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// u . s with a 16-bit scale per int16 pair lane folded in (the K-quants' sub-block scales):
// maddubs pairs (<= 2 * 63 * 127 = 16002) times |scale| <= 127, summed in pairs, fit int32.
// (A VNNI variant -- dpbusd per sub-block, its scale applied in float -- measured no faster
// here: 13.9 vs 14.1 GB/s on Q4_K, one thread, so the K-quants use this path everywhere.)
inline __m256i dot_scaled(__m256i u, __m256i s, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 fma_i32(__m256i i, float scale, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(scale), acc);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles -> 32 bytes: low nibbles first (elements 0..15), then high (16..31)
inline __m256i nibbles_lo_hi(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Q5_0's 32 high bits -> 0x10 in byte i where bit i is set
inline __m256i high_bits_x10(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  // byte i takes byte i / 8 of the word (shuffle works within each 128-bit half; every 4 bytes hold the word)
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);  // byte i tests bit i % 8
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), pick), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(0x10));
}

// The 32-weight types, R activation rows at once: each block is unpacked once.
template <int R>
void dot_blocks32(int64_t t, const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 32, bb = block_bytes(t);
  __m256 acc[R];
  float corr[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.f;
  for (int64_t b = 0; b < nb; ++b, w += bb) {
    prefetch_lines(w + PREFETCH_BYTES, 1);  // <= 34 bytes per block: a line every other block or so
    const float d = fp16(w);
    if (t == Q8_0) {
      const __m256i q = load32(w + 2), uq = _mm256_sign_epi8(q, q);
      // |q| . (x with q's sign) = q . x as an unsigned-by-signed product
      for (int r = 0; r < R; ++r)
        acc[r] = fma_i32(dot_u8s8(uq, _mm256_sign_epi8(load32(a[r].q + b * 32), q)), d * a[r].d[b], acc[r]);
      continue;
    }
    __m256i u = nibbles_lo_hi(w + (t == Q4_0 ? 2 : t == Q4_1 ? 4 : 6));
    if (t == Q5_0) u = _mm256_or_si256(u, high_bits_x10(w + 2));
    const float off = t == Q4_1 ? fp16(w + 2) : (t == Q4_0 ? -8.f : -16.f) * d;  // times sum(x)
    for (int r = 0; r < R; ++r) {
      acc[r] = fma_i32(dot_u8s8(u, load32(a[r].q + b * 32)), d * a[r].d[b], acc[r]);
      corr[r] += off * a[r].xs[b];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + corr[r];
}

template <int R>
void dot_q4k(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 256;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  float corr[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), corr[r] = 0.f;
  // shuffle controls that broadcast int16 word j (sub-block j's scale) to every lane
  __m256i pick[8];
  for (int j = 0; j < 8; ++j) pick[j] = _mm256_set1_epi16(static_cast<int16_t>(((2 * j + 1) << 8) | (2 * j)));
  const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  const __m128i shift_c = _mm_setr_epi32(0, 0, 0, 4);
  const __m128i mask_low = _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F);
  const __m128i mask_top = _mm_setr_epi32(0, 0x30303030, 0, 0x30303030);  // the top 2 bits of a (sc) and b (m)
  for (int64_t b = 0; b < nb; ++b, w += 144) {
    // the 12 scale bytes -> sc[0..7], m[0..7] four at a time, in one register: the block's first 16
    // bytes are 32-bit words [d|dmin, a, b, c]; sc[0..3] and m[0..3] are the low 6 bits of a and b,
    // sc[4..7] and m[4..7] the nibbles of c plus the top 2 bits of a and b
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m128i low = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)), shift_c),
                                      mask_low);                                        // [a, c, b, c >> 4] & masks
    const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)), 2), mask_top);
    const __m128i sm = _mm_or_si128(low, top);  // bytes: sc[0..7], m[0..7]
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // 8 int16 scales, both halves
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_mins));  // lane i: m[i / 2]
    const float d = fp16(w), dmin = fp16(w + 2);
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load32(w + 16 + 32 * c);
      const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m256i sc_lo = _mm256_shuffle_epi8(sc16, pick[2 * c]), sc_hi = _mm256_shuffle_epi8(sc16, pick[2 * c + 1]);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + b * 256 + 64 * c;
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(dot_scaled(lo, load32(x), sc_lo),
                                                            dot_scaled(hi, load32(x + 32), sc_hi)));
      }
    }
    // the mins: lane i of madd(sums of 16, m16) is m_i (sum of sub-block i's 32 codes)
    for (int r = 0; r < R; ++r) {
      const __m256i mins = _mm256_madd_epi16(load32(a[r].bs + b * 16), m16);
      acc[r] = fma_i32(sumi[r], d * a[r].d[b], acc[r]);
      acc[r] = fma_i32(mins, -dmin * a[r].d[b], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + corr[r];
}

#if defined(__AVX512BW__)
// Q6_K with 512-bit registers: one 64-byte load carries a half's low nibbles for two groups of 32
// (elements 0-63 of the half), so each unpack, maddubs and madd covers 64 codes instead of 32. The
// high bits are the half's 32 bytes in both 256-bit halves, shifted by a different count per half
// (sllv / srlv per 16-bit lane). Integer sums as in the 256-bit loop: the same results exactly.
template <int R>
void dot_q6k_512(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 256;
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);  // u0: << 4, u1: << 2
  const __m512i shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);  // u2: as is, u3: >> 2
  // maddubs leaves 32 int16 lanes, lane i holding elements 2i and 2i + 1: lanes 8p..8p + 7 are one
  // sub-block of 16, so lane i's scale is sc[8h + 4 * pair + i / 8]
  __m512i pick[2][2];
  for (int h = 0; h < 2; ++h)
    for (int p = 0; p < 2; ++p) {
      alignas(64) int16_t idx[32];
      for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(8 * h + 4 * p + i / 8);
      pick[h][p] = _mm512_load_si512(idx);
    }
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    prefetch_lines(w + PREFETCH_BYTES, 4);  // 210 bytes per block
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192)));
    const __m512i sc512 = _mm512_castsi256_si512(sc16);
    const float d = fp16(w + 208);
    __m512i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i lo = _mm512_loadu_si512(w + 64 * h);
      const __m512i hb = _mm512_broadcast_i64x4(load32(w + 128 + 32 * h));
      const __m512i u01 = _mm512_or_si512(_mm512_and_si512(lo, low4),
                                          _mm512_and_si512(_mm512_sllv_epi16(hb, shl01), bits45));
      const __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4), low4),
                                          _mm512_and_si512(_mm512_srlv_epi16(hb, shr23), bits45));
      const __m512i s01 = _mm512_permutexvar_epi16(pick[h][0], sc512), s23 = _mm512_permutexvar_epi16(pick[h][1], sc512);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + b * 256 + 128 * h;
        const __m512i p01 = _mm512_madd_epi16(_mm512_maddubs_epi16(u01, _mm512_loadu_si512(x)), s01);
        const __m512i p23 = _mm512_madd_epi16(_mm512_maddubs_epi16(u23, _mm512_loadu_si512(x + 64)), s23);
        sumi[r] = _mm512_add_epi32(sumi[r], _mm512_add_epi32(p01, p23));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r]), _mm512_extracti64x4_epi64(sumi[r], 1));
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(load32(a[r].bs + b * 16), sc16), 5);
      acc[r] = fma_i32(_mm256_sub_epi32(s, off), d * a[r].d[b], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}
#endif

template <int R>
void dot_q6k(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 256;
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  // shuffle controls: the low 128 bits broadcast int16 word 2g, the high 128 bits word 2g + 1
  __m256i pick[4];
  for (int g = 0; g < 4; ++g)
    pick[g] = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((4 * g + 3) << 8) | (4 * g + 2))),
                               _mm_set1_epi16(static_cast<int16_t>(((4 * g + 1) << 8) | (4 * g))));
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    prefetch_lines(w + PREFETCH_BYTES, 4);  // 210 bytes per block
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = fp16(w + 208);
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i lo = load32(w + 64 * h), lo2 = load32(w + 64 * h + 32), hb = load32(w + 128 + 32 * h);
      // unsigned codes 0..63 of this half's groups of 32 (its elements 0-31, 32-63, 64-95, 96-127)
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(lo, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(lo2, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), low4), _mm256_and_si256(hb, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45)),
      };
      // this half's 8 scales as int16 in both 128-bit halves, for the in-lane shuffles below
      const __m256i sc8 = _mm256_broadcastsi128_si256(
          _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * h))));
      for (int g = 0; g < 4; ++g) {
        // int16 lanes 0-7 hold elements 0-15 (scale sc[2g]), lanes 8-15 elements 16-31 (sc[2g + 1])
        const __m256i s = _mm256_shuffle_epi8(sc8, pick[g]);
        for (int r = 0; r < R; ++r)
          sumi[r] = _mm256_add_epi32(sumi[r], dot_scaled(u[g], load32(a[r].q + b * 256 + 128 * h + 32 * g), s));
      }
    }
    // the codes are stored + 32: subtract 32 * sum_i sc_i * (sum of sub-block i's 16 codes)
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    for (int r = 0; r < R; ++r) {
      const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(load32(a[r].bs + b * 16), sc16), 5);
      acc[r] = fma_i32(_mm256_sub_epi32(sumi[r], off), d * a[r].d[b], acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// 8 rows of Q4_KX8 against one activation row: out[0..7]. One 32-byte load carries 4 bytes of each
// row; the activation's matching 4 bytes are broadcast, so each product lane is one row's dot product
// and the sub-block scales, mins and d of the 8 rows are applied with one vector op each.
inline __m256i dot_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, dot_u8s8(u, s));
#endif
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// R activation rows at once (out[r * 8 + i]): each 32-byte weight load is unpacked once for all R.
template <int R>
void dot_q4k_x8(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 256;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const __m512i low4w = _mm512_set1_epi8(0x0F);
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);  // two steps' x bytes
#endif
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 1184) {
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    const uint8_t* qs = w + 160;
    for (int c = 0; c < 4; ++c) {
      prefetch_lines(w + PREFETCH_BYTES + 296 * c, 5);  // 1184 bytes per super-block, a quarter per chunk
      __m256i lo_acc[R], hi_acc[R];
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
      // Two steps per 64-byte load: lanes 0-7 hold step t's 8 rows, lanes 8-15 step t + 1's, so each
      // dpbusd does two steps' work; the halves are added at the end. The sums are integers, so the
      // result is the 256-bit loop's exactly.
      {
        __m512i lo_w[R], hi_w[R];
        for (int r = 0; r < R; ++r) lo_w[r] = hi_w[r] = _mm512_setzero_si512();
        for (int t = 0; t < 8; t += 2) {
          const __m512i q = _mm512_loadu_si512(qs + (8 * c + t) * 32);
          const __m512i lo = _mm512_and_si512(q, low4w), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4w);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = a[r].q + b * 256 + 64 * c + 4 * t;  // steps t and t + 1: 8 bytes
            const __m512i xl = _mm512_permutexvar_epi32(pair, _mm512_castsi128_si512(_mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(x))));
            const __m512i xh = _mm512_permutexvar_epi32(pair, _mm512_castsi128_si512(_mm_loadl_epi64(
                reinterpret_cast<const __m128i*>(x + 32))));
            lo_w[r] = _mm512_dpbusd_epi32(lo_w[r], lo, xl);
            hi_w[r] = _mm512_dpbusd_epi32(hi_w[r], hi, xh);
          }
        }
        for (int r = 0; r < R; ++r) {
          lo_acc[r] = _mm256_add_epi32(_mm512_castsi512_si256(lo_w[r]), _mm512_extracti64x4_epi64(lo_w[r], 1));
          hi_acc[r] = _mm256_add_epi32(_mm512_castsi512_si256(hi_w[r]), _mm512_extracti64x4_epi64(hi_w[r], 1));
        }
      }
#else
      for (int r = 0; r < R; ++r) lo_acc[r] = hi_acc[r] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        const __m256i q = load32(qs + (8 * c + t) * 32);
        const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = a[r].q + b * 256 + 64 * c + 4 * t;
          lo_acc[r] = dot_acc(lo_acc[r], lo, _mm256_set1_epi32(load4(x)));
          hi_acc[r] = dot_acc(hi_acc[r], hi, _mm256_set1_epi32(load4(x + 32)));
        }
      }
#endif
      const __m256i sc_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 32 + 16 * c)));
      const __m256i sc_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 40 + 16 * c)));
      for (int r = 0; r < R; ++r)
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_mullo_epi32(lo_acc[r], sc_lo),
                                                            _mm256_mullo_epi32(hi_acc[r], sc_hi)));
    }
    // the mins: sub-blocks j and j + 1 at once, as int16 pairs (m <= 63, |sum of 32 codes| <= 4064) in
    // one madd, where a 32-bit multiply per sub-block cost as much as a quarter of the code products
    __m256i mins[R];
    for (int r = 0; r < R; ++r) mins[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
      const __m128i mm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 96 + 8 * j));  // m_j[8], m_j+1[8]
      const __m256i mp = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mm, _mm_srli_si128(mm, 8)));  // lane i: (m_j, m_j+1)
      for (int r = 0; r < R; ++r) {
        const uint32_t pair = static_cast<uint16_t>(sum32(a[r], b * 8 + j)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(sum32(a[r], b * 8 + j + 1))) << 16);
        mins[r] = _mm256_add_epi32(mins[r], _mm256_madd_epi16(mp, _mm256_set1_epi32(static_cast<int>(pair))));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    for (int r = 0; r < R; ++r) {
      const __m256 xd = _mm256_set1_ps(a[r].d[b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d, xd), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[r]), _mm256_mul_ps(dmin, xd), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

// 8 rows of Q4_1X8 against R activation rows (out[r * 8 + i]): per block, 4 loads of 32 bytes carry
// the 16 code bytes of each of the 8 rows; the lanes of one register hold the 8 rows' integer sums,
// and the 8 scales and mins are applied with one vector op each (the row-by-row kernel spends two
// scalar fp16 conversions and a scalar multiply-add per row and block).
template <int R>
void dot_q4_1_x8(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 160) {
    // the next groups' bytes, a few blocks ahead: each call streams a short run of rows from memory
    prefetch_lines(w + PREFETCH_BYTES, 3);  // 160 bytes per block
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {
      const __m256i q = load32(w + 32 + 32 * t);
      const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + b * 32 + 4 * t;  // low nibbles: elements 4t..4t+3, high: 16 + 4t..
        sumi[r] = dot_acc(sumi[r], lo, _mm256_set1_epi32(load4(x)));
        sumi[r] = dot_acc(sumi[r], hi, _mm256_set1_epi32(load4(x + 16)));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d, _mm256_set1_ps(a[r].d[b])), acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(a[r].xs[b]), acc[r]);  // m times the block's sum of x
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

// 8 rows of Q5_0X8 against R activation rows: Q4_1X8's loop, each code byte or-ed with its element's
// high bit (0x10) first. Step s's 4 bytes per row need the high bits of elements 4s..4s+3 and
// 16+4s..16+4s+3, which the repack put in byte s of the row's word: one shuffle spreads that byte over
// the row's 4 lanes, and a test against 1, 2, 4, 8 (16, 32, 64, 128) picks element 4s+j's bit in byte j.
template <int R>
void dot_q5_0_x8(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F), x10 = _mm256_set1_epi8(0x10);
  const __m256i bit_lo = _mm256_set1_epi32(0x08040201), bit_hi = _mm256_set1_epi32(static_cast<int>(0x80402010u));
  __m256i spread[4];  // byte s of each 32-bit lane, copied to the lane's 4 bytes
  for (int s = 0; s < 4; ++s)
    spread[s] = _mm256_setr_epi8(s, s, s, s, 4 + s, 4 + s, 4 + s, 4 + s, 8 + s, 8 + s, 8 + s, 8 + s, 12 + s, 12 + s,
                                 12 + s, 12 + s, s, s, s, s, 4 + s, 4 + s, 4 + s, 4 + s, 8 + s, 8 + s, 8 + s, 8 + s,
                                 12 + s, 12 + s, 12 + s, 12 + s);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 176) {
    prefetch_lines(w + PREFETCH_BYTES, 3);  // 176 bytes per block
    const __m256i hb = load32(w + 16);
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int s = 0; s < 4; ++s) {
      const __m256i q = load32(w + 48 + 32 * s), h = _mm256_shuffle_epi8(hb, spread[s]);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low4),
                                         _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit_lo), bit_lo), x10));
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
                                         _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit_hi), bit_hi), x10));
      for (int r = 0; r < R; ++r) {
        const int8_t* x = a[r].q + b * 32 + 4 * s;  // low nibbles: elements 4s..4s+3, high: 16 + 4s..
        sumi[r] = dot_acc(sumi[r], lo, _mm256_set1_epi32(load4(x)));
        sumi[r] = dot_acc(sumi[r], hi, _mm256_set1_epi32(load4(x + 16)));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    const __m256 off = _mm256_mul_ps(d, _mm256_set1_ps(-16.f));  // w = d q - 16 d: the offset times sum(x)
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d, _mm256_set1_ps(a[r].d[b])), acc[r]);
      acc[r] = _mm256_fmadd_ps(off, _mm256_set1_ps(a[r].xs[b]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

template <int R>
void dot_rows_simd(int64_t t, const uint8_t* w, const Act* a, int64_t k, float* out) {
  if (t == Q4_K) dot_q4k<R>(w, a, k, out);
#if defined(__AVX512BW__)
  else if (t == Q6_K) dot_q6k_512<R>(w, a, k, out);
#else
  else if (t == Q6_K) dot_q6k<R>(w, a, k, out);
#endif
  else dot_blocks32<R>(t, w, a, k, out);
}
#endif

constexpr int TILE = 4;  // activation rows per pass over a weight row

// out[r] = row . a[r] for r < rows (rows <= TILE)
void dot_rows(int64_t t, const uint8_t* w, const Act* a, int rows, int64_t k, float* out, bool portable) {
#if defined(__AVX2__)
  if (!portable) {
    switch (rows) {
      case 1: return dot_rows_simd<1>(t, w, a, k, out);
      case 2: return dot_rows_simd<2>(t, w, a, k, out);
      case 3: return dot_rows_simd<3>(t, w, a, k, out);
      default: return dot_rows_simd<4>(t, w, a, k, out);
    }
  }
#endif
  for (int r = 0; r < rows; ++r) out[r] = dot_scalar(t, w, a[r], k);
}

void check_weight(const at::Tensor& w, int64_t t, int64_t n, int64_t k) {
  TORCH_CHECK(w.device().is_cpu() && w.scalar_type() == at::kByte && w.is_contiguous(),
              "minillm_gguf: the weight must be a contiguous CPU uint8 tensor");
  TORCH_CHECK(k % block_weights(t) == 0, "minillm_gguf: in_features ", k, " is not a multiple of the block size ",
              block_weights(t), " of type id ", t);
  TORCH_CHECK(w.numel() == n * (k / block_weights(t)) * block_bytes(t), "minillm_gguf: weight holds ", w.numel(),
              " bytes, expected ", n * (k / block_weights(t)) * block_bytes(t), " for ", n, " x ", k);
}

// m rows of x [m, k] into the four activation arrays (quantize_act's tensors or linear()'s scratch)
void quantize_rows(const float* px, int64_t m, int64_t k, int64_t block, int8_t* q, float* xd, int16_t* bs, float* xs) {
  at::parallel_for(0, m, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row(px + r * k, k, block, q + r * k, xd + r * (k / block), bs + r * (k / 16), xs + r * (k / 32));
  });
}

// ----- the ops -----
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_act(const at::Tensor& x_in, int64_t block) {
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  TORCH_CHECK(block == 32 || block == 256, "minillm_gguf: activation block must be 32 or 256, got ", block);
  TORCH_CHECK(x.dim() == 2 && x.size(1) % block == 0, "minillm_gguf: x must be [M, K] with K % ", block, " == 0");
  const int64_t m = x.size(0), k = x.size(1);
  at::Tensor q = at::empty({m, k}, x.options().dtype(at::kChar));
  at::Tensor xd = at::empty({m, k / block}, x.options());
  at::Tensor bs = at::empty({m, k / 16}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({m, k / 32}, x.options());
  quantize_rows(x.data_ptr<float>(), m, k, block, q.data_ptr<int8_t>(), xd.data_ptr<float>(), bs.data_ptr<int16_t>(),
                xs.data_ptr<float>());
  return {q, xd, bs, xs};
}

// One weight row against the quantized activation rows, TILE at a time while the row is in L1.
struct QuantizedActs {
  const int8_t* q;
  const float *d, *xs;
  const int16_t* bs;
  int64_t m, k, nblk;
  Act row(int64_t r) const { return {q + r * k, d + r * nblk, bs + r * (k / 16), xs + r * (k / 32)}; }
};

inline void row_times_acts(int64_t t, const uint8_t* row, const QuantizedActs& x, float* out, int64_t ldo,
                           bool portable) {
  Act a[TILE];
  float res[TILE];
  for (int64_t r0 = 0; r0 < x.m; r0 += TILE) {
    const int rows = static_cast<int>(std::min<int64_t>(TILE, x.m - r0));
    for (int r = 0; r < rows; ++r) a[r] = x.row(r0 + r);
    dot_rows(t, row, a, rows, x.k, res, portable);
    for (int r = 0; r < rows; ++r) out[(r0 + r) * ldo] = res[r];
  }
}

#if defined(__AVX2__)
// 8 rows of Q8_0X8 against R activation rows: 8 loads of 32 bytes per block carry the 32 signed codes of
// each row; |q| . (x with q's sign) is the unsigned-by-signed product the dot instructions take.
template <int R>
void dot_q8_0_x8(const uint8_t* w, const Act* a, int64_t k, float* out) {
  const int64_t nb = k / 32;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 272) {
    prefetch_lines(w + PREFETCH_BYTES, 5);  // 272 bytes per block
    __m256i sumi[R];
    for (int r = 0; r < R; ++r) sumi[r] = _mm256_setzero_si256();
    for (int t = 0; t < 8; ++t) {
      const __m256i q = load32(w + 16 + 32 * t), uq = _mm256_sign_epi8(q, q);
      for (int r = 0; r < R; ++r)
        sumi[r] = dot_acc(sumi[r], uq, _mm256_sign_epi8(_mm256_set1_epi32(load4(a[r].q + b * 32 + 4 * t)), q));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), _mm256_mul_ps(d, _mm256_set1_ps(a[r].d[b])), acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + 8 * r, acc[r]);
}

template <int R>
void dot_x8(int64_t t, const uint8_t* w, const Act* a, int64_t k, float* out) {
  if (t == Q4_KX8) dot_q4k_x8<R>(w, a, k, out);
  else if (t == Q8_0X8) dot_q8_0_x8<R>(w, a, k, out);
  else if (t == Q5_0X8) dot_q5_0_x8<R>(w, a, k, out);
  else dot_q4_1_x8<R>(w, a, k, out);
}

// 8 interleaved rows against every activation row, X8_TILE activation rows per pass
constexpr int X8_TILE = 4;
void x8_times_acts(int64_t t, const uint8_t* w, const QuantizedActs& x, float* out, int64_t ldo) {
  Act a[X8_TILE];
  float res[8 * X8_TILE];
  for (int64_t r0 = 0; r0 < x.m; r0 += X8_TILE) {
    const int rows = static_cast<int>(std::min<int64_t>(X8_TILE, x.m - r0));
    for (int r = 0; r < rows; ++r) a[r] = x.row(r0 + r);
    switch (rows) {
      case 1: dot_x8<1>(t, w, a, x.k, res); break;
      case 2: dot_x8<2>(t, w, a, x.k, res); break;
      case 3: dot_x8<3>(t, w, a, x.k, res); break;
      default: dot_x8<4>(t, w, a, x.k, res); break;
    }
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < 8; ++i) out[(r0 + r) * ldo + i] = res[8 * r + i];
  }
}

#endif

// A quantized activation held in plain buffers (linear()'s per-thread scratch), grown as needed.
struct ActScratch {
  std::vector<int8_t> q;
  std::vector<float> d, xs;
  std::vector<int16_t> bs;
};

QuantizedActs quantize_into(const at::Tensor& x, int64_t block, ActScratch& s) {
  const int64_t m = x.size(0), k = x.size(1);
  TORCH_CHECK(k % block == 0, "minillm_gguf: x must be [M, K] with K % ", block, " == 0");
  s.q.resize(m * k);
  s.d.resize(m * (k / block));
  s.bs.resize(m * (k / 16));
  s.xs.resize(m * (k / 32));
  quantize_rows(x.data_ptr<float>(), m, k, block, s.q.data(), s.d.data(), s.bs.data(), s.xs.data());
  return {s.q.data(), s.d.data(), s.xs.data(), s.bs.data(), m, k, k / block};
}

QuantizedActs view(const at::Tensor& q, const at::Tensor& xd, const at::Tensor& bs, const at::Tensor& xs) {
  return {q.data_ptr<int8_t>(), xd.data_ptr<float>(), xs.data_ptr<float>(), bs.data_ptr<int16_t>(),
          q.size(0), q.size(1), xd.size(1)};
}

at::Tensor qmatmul(const at::Tensor& q, const at::Tensor& xd, const at::Tensor& bs, const at::Tensor& xs,
                   const at::Tensor& w, int64_t t, int64_t n, bool portable) {
  TORCH_CHECK(!interleaved(t), "minillm_gguf: the interleaved layouts run through linear() only");
  const int64_t m = q.size(0), k = q.size(1);
  check_weight(w, t, n, k);
  TORCH_CHECK(xd.size(1) * block_weights(t) == k, "minillm_gguf: type id ", t, " needs activations quantized in blocks of ",
              block_weights(t));
  at::Tensor out = at::empty({m, n}, xd.options());
  const QuantizedActs x = view(q, xd, bs, xs);
  const uint8_t* pw = w.data_ptr<uint8_t>();
  float* po = out.data_ptr<float>();
  const int64_t row_bytes = (k / block_weights(t)) * block_bytes(t);
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {  // rows of W split across threads
    for (int64_t j = n0; j < n1; ++j) row_times_acts(t, pw + j * row_bytes, x, po + j, n, portable);
  });
  return out;
}

// The whole layer in one call (what GGUFLinear runs): x [M, K] float -> x @ W.T + bias, W the
// parts stacked along the output rows, each part's type its own; the activation is quantized once
// per block size, and one parallel region covers the rows of every part.
at::Tensor linear(const at::Tensor& x_in, at::TensorList blocks, at::IntArrayRef types,
                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(blocks.size() == types.size() && !blocks.empty(), "minillm_gguf: one type per block tensor");
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t m = x.size(0), k = x.size(1);
  std::vector<int64_t> first_row{0}, row_bytes;
  for (size_t p = 0; p < blocks.size(); ++p) {
    const int64_t rb = (k / block_weights(types[p])) * block_bytes(types[p]);
    TORCH_CHECK(k % block_weights(types[p]) == 0 && blocks[p].numel() % rb == 0, "minillm_gguf: part ", p,
                " holds ", blocks[p].numel(), " bytes, not whole rows of ", k, " weights of type id ", types[p]);
    check_weight(blocks[p], types[p], blocks[p].numel() / rb, k);
#if !defined(__AVX2__)
    TORCH_CHECK(!interleaved(types[p]), "minillm_gguf: the interleaved layouts need the AVX2 build");
#endif
    TORCH_CHECK(!interleaved(types[p]) || (blocks[p].numel() / rb) % 8 == 0,
                "minillm_gguf: an interleaved layout needs rows % 8 == 0");
    row_bytes.push_back(rb);
    first_row.push_back(first_row.back() + blocks[p].numel() / rb);
  }
  const int64_t n = first_row.back();
  // the quantized activation lives in this thread's scratch, not in four fresh tensors per call:
  // at batch 1 a layer call is ~20 us, and the allocations were ~4 us of it
  thread_local ActScratch scratch32, scratch256;
  QuantizedActs xq32{}, xq256{};
  bool have32 = false, have256 = false;
  for (size_t p = 0; p < blocks.size(); ++p) {
    if (k_quant(types[p]) && !have256) {
      xq256 = quantize_into(x, 256, scratch256);
      have256 = true;
    } else if (!k_quant(types[p]) && !have32) {
      xq32 = quantize_into(x, 32, scratch32);
      have32 = true;
    }
  }
  at::Tensor out = at::empty({m, n}, x.options());
  float* po = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t j = n0; j < n1; ++j) {
      size_t p = 0;
      while (j >= first_row[p + 1]) ++p;
      const uint8_t* row = blocks[p].data_ptr<uint8_t>() + (j - first_row[p]) * row_bytes[p];
      if (interleaved(types[p])) {  // 8 rows at once, by whichever chunk holds the group's first row
#if defined(__AVX2__)
        if ((j - first_row[p]) % 8 != 0) continue;
        x8_times_acts(types[p], row, k_quant(types[p]) ? xq256 : xq32, po + j, n);
        continue;
#endif
      }
      row_times_acts(types[p], row, k_quant(types[p]) ? xq256 : xq32, po + j, n, false);
    }
  });
  if (bias.has_value() && bias->defined()) out.add_(bias->to(at::kFloat));
  return out;
}

at::Tensor dequantize(const at::Tensor& w, int64_t t, int64_t n, int64_t k) {
  TORCH_CHECK(!interleaved(t), "minillm_gguf: dequantize the file's layout (gguf_cpu.unpack_q4k_x8 / unpack_q4_1_x8 first)");
  check_weight(w, t, n, k);
  at::Tensor out = at::empty({n, k}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* pw = w.data_ptr<uint8_t>();
  float* po = out.data_ptr<float>();
  const int64_t row_bytes = (k / block_weights(t)) * block_bytes(t);
  at::parallel_for(0, n, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t j = n0; j < n1; ++j) dequant_row(t, pw + j * row_bytes, po + j * k, k);
  });
  return out;
}

std::string isa() {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx2+avx512vnni";
#elif defined(__AVXVNNI__)
  return "avx2+avxvnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

TORCH_LIBRARY(minillm_gguf, lib) {
  lib.def("quantize_act(Tensor x, int block) -> (Tensor, Tensor, Tensor, Tensor)");
  lib.def("qmatmul(Tensor q, Tensor xd, Tensor bs, Tensor xs, Tensor w, int qtype, int n, bool portable=False) -> Tensor");
  lib.def("linear(Tensor x, Tensor[] blocks, int[] qtypes, Tensor? bias=None) -> Tensor");
  lib.def("dequantize(Tensor w, int qtype, int n, int k) -> Tensor");
  lib.def("isa() -> str", &isa);  // which SIMD path this build compiled in
}

TORCH_LIBRARY_IMPL(minillm_gguf, CPU, lib) {
  lib.impl("quantize_act", &quantize_act);
  lib.impl("qmatmul", &qmatmul);
  lib.impl("linear", &linear);
  lib.impl("dequantize", &dequantize);
}
