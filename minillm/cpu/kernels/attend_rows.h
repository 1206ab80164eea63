// One decode query group's attention over keys read through a block table: the inner loops of
// paged_attention.cpp (the op) and decode_step.cpp (a whole decode step in one parallel region).
// paged_attention.cpp's header says how and why they work.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "vec_exp.h"  // the softmax's e^x, 8 at a time
#endif

namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {  // bf16 is the high half of an fp32: a shift, which vectorizes
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename T>
inline float dot(const float* __restrict q, const T* __restrict k, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += q[i] * to_float(k[i]);
  return s;
}

template <typename T>
inline void axpy(float* __restrict acc, float w, const T* __restrict v, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) acc[i] += w * to_float(v[i]);
}


// s[i] = e^(s[i] - m) for i < n; returns their sum
inline float exp_shifted_sum(float* s, int64_t n, float m) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  const __m256 mv = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = minillm_vec::exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float part[8];
  _mm256_store_ps(part, acc);
  for (float v : part) sum += v;
#endif
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {  // 8 bf16 -> 8 fp32: widen to 32 bits, shift into the high half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The 8 lanes' sums of a[0..7], in order: one hadd tree instead of 8 horizontal sums.
inline __m256 sum8x8(const __m256* a) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
}

// Scores of one query head against 8 keys (d % 8 == 0): 8 independent accumulators, so the FMAs
// pipeline instead of waiting on one chain, and one reduction for all 8 (a per-key horizontal sum
// and a dependent FMA chain made the plain loop ~10x slower here).
template <typename T>
inline __m256 scores8(const float* q, const T* const* rows, int64_t d) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, load8(rows[j] + i), acc[j]);
  }
  return sum8x8(acc);
}

// acc[0..d) += sum_j w[j] * rows[j][0..d): the weighted V rows of one head. Strips of 64 columns keep
// their 8 accumulators in registers across all n keys, so each key costs one broadcast and 8 loads for
// 8 FMAs (accumulating in memory, one 8-lane chunk at a time, cost two loads per FMA: 1.5x slower);
// what is left of d (d % 64, a multiple of 8) goes 8 lanes at a time with two chains.
template <typename T>
inline void weighted_rows(float* acc, const float* w, const T* const* rows, int64_t n, int64_t d) {
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) {
    __m256 a[8];
    for (int c = 0; c < 8; ++c) a[c] = _mm256_loadu_ps(acc + c0 + 8 * c);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 wj = _mm256_set1_ps(w[j]);
      for (int c = 0; c < 8; ++c) a[c] = _mm256_fmadd_ps(wj, load8(rows[j] + c0 + 8 * c), a[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(acc + c0 + 8 * c, a[c]);
  }
  for (int64_t i = c0; i < d; i += 8) {
    __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {  // two chains: each FMA waits on the one two keys back
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load8(rows[j] + i), a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(w[j + 1]), load8(rows[j + 1] + i), a1);
    }
    if (j < n) a0 = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load8(rows[j] + i), a0);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(a0, a1));
  }
}
#endif

// Asks for the next tile's rows (count of them, row_bytes each; count <= 0: none) while this one
// computes: the key rows of one head are 256 B at a 768 B stride in blocks scattered over the pool,
// which the hardware prefetchers follow poorly (one layer of a 128-sequence step, 100-380 keys,
// 2 threads, 40 interleaved calls: 3.01 -> 2.71 ms median; 8 or 16 keys ahead the same).
// Locality 3 keeps the rows in L1 (the next few keys); 2 in L2 (V rows the second pass reads later).
template <int Locality = 3, typename T>
inline void prefetch_rows(const T* const* rows, int64_t count, int64_t row_bytes) {
  for (int64_t j = 0; j < count; ++j)
    for (int64_t c = 0; c < row_bytes; c += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(rows[j]) + c, 0, Locality);
}

constexpr int64_t KEYS_AHEAD = 32;

// Where each of keys [k0, k1) of sequence b lives, for kv head h: its K and V rows (block by block: a
// division per key was ~10% of the kernel's time), then a tree node's path from the slots it names.
template <typename T>
void key_rows(const T* k_cache, const T* v_cache, const int32_t* table, const int64_t* tail, int64_t tail_width,
              int64_t len, int64_t k0, int64_t k1, int64_t block_size, int64_t row_stride, int64_t hd,
              std::vector<const T*>& krows, std::vector<const T*>& vrows) {
  krows.resize(k1 - k0);
  vrows.resize(k1 - k0);
  for (int64_t blk = k0 / block_size, p = k0; p < k1; ++blk) {
    const int64_t base = static_cast<int64_t>(table[blk]) * block_size;
    for (int64_t off = p - blk * block_size; off < block_size && p < k1; ++off, ++p) {
      krows[p - k0] = k_cache + (base + off) * row_stride + hd;
      vrows[p - k0] = v_cache + (base + off) * row_stride + hd;
    }
  }
  if (tail != nullptr) {  // a tree node's path: its last keys come from the slots it names
    for (int64_t j = tail_width - 1, p = len - 1; j >= 0 && tail[j] >= 0 && p >= k0; --j, --p) {
      if (p >= k1) continue;
      krows[p - k0] = k_cache + tail[j] * row_stride + hd;
      vrows[p - k0] = v_cache + tail[j] * row_stride + hd;
    }
  }
}

// The group's G query heads (qf, scaled) against keys whose rows are krows/vrows[0, n): each head's
// maximum score mx[g], its sum of e^(score - mx) sums[g], and acc[g * d ..] = the e^(score - mx)-weighted
// sum of V rows (not yet divided by the sum).
template <typename T>
void attend_rows(const float* qf, const std::vector<const T*>& krows, const std::vector<const T*>& vrows, int64_t n,
                 int64_t group, int64_t d, std::vector<float>& scores, float* acc, float* mx, float* sums) {
  scores.resize(group * n);
  // 1. scores: each key row meets the group's G query heads (from L1 after the first)
  int64_t i0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (d % 8 == 0) {
    prefetch_rows(krows.data(), std::min<int64_t>(KEYS_AHEAD, n), d * sizeof(T));
    for (; i0 + 8 <= n; i0 += 8) {
      prefetch_rows(krows.data() + i0 + KEYS_AHEAD, std::min<int64_t>(8, n - i0 - KEYS_AHEAD), d * sizeof(T));
      prefetch_rows<2>(vrows.data() + i0, 8, d * sizeof(T));
      for (int64_t g = 0; g < group; ++g)
        _mm256_storeu_ps(scores.data() + g * n + i0, scores8(qf + g * d, krows.data() + i0, d));
    }
  }
#endif
  for (int64_t i = i0; i < n; ++i)
    for (int64_t g = 0; g < group; ++g) scores[g * n + i] = dot(qf + g * d, krows[i], d);
  // 2. softmax numerators per head, in float32
  for (int64_t g = 0; g < group; ++g) {
    float* sc = scores.data() + g * n;
    mx[g] = *std::max_element(sc, sc + n);
    sums[g] = exp_shifted_sum(sc, n, mx[g]);
  }
  // 3. weighted sum of V rows, per head, in tiles of 32 keys (8 KB at D 64) that stay in L1 while the
  // group's heads read them
  std::fill(acc, acc + group * d, 0.f);
#if defined(__AVX2__) && defined(__FMA__)
  if (d % 8 == 0) {
    constexpr int64_t tile = 32;
    for (int64_t j0 = 0; j0 < n; j0 += tile) {
      prefetch_rows(vrows.data() + j0 + tile, std::min<int64_t>(tile, n - j0 - tile), d * sizeof(T));
      for (int64_t g = 0; g < group; ++g)
        weighted_rows(acc + g * d, scores.data() + g * n + j0, vrows.data() + j0, std::min(tile, n - j0), d);
    }
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < group; ++g) axpy(acc + g * d, scores[g * n + i], vrows[i], d);
}


// Keys per part below which a (sequence, kv head) is not split between threads, and the keys of a whole
// call (summed over its tasks) below which one thread does it all: forking costs more than it saves there
// (2-vCPU Zen 5, 3 x 3 heads: 16 keys 4.1 us on two threads, 3.1 on one; 100 keys 6.8 and 6.7).
#ifndef MIN_SPLIT_KEYS_DEF
#define MIN_SPLIT_KEYS_DEF 64
#endif
#ifndef MIN_PARALLEL_KEYS_DEF
#define MIN_PARALLEL_KEYS_DEF 384
#endif
constexpr int64_t MIN_SPLIT_KEYS = MIN_SPLIT_KEYS_DEF;
constexpr int64_t MIN_PARALLEL_KEYS = MIN_PARALLEL_KEYS_DEF;

// How many parts each task's keys split into (a task: one sequence and kv head). When the tasks do not
// share evenly among the threads -- batch-1 decode of the default model: 3 kv heads on 2 threads, one
// thread doing two -- each task's keys are split into one part per thread and the parts' partial
// softmaxes merged (merge_parts). `longest`: the most keys any task reads.
inline int64_t split_parts(int64_t tasks, int64_t threads, int64_t longest) {
  const bool uneven = tasks % threads != 0 && tasks < 4 * threads;
  return uneven && longest >= threads * MIN_SPLIT_KEYS ? threads : 1;
}

// Keys [k0, k1) of part `part` of `parts` for a query that sees len keys (window > 0: only the last
// window of them): all of them, or its share when there are enough to split; empty for a part left out.
inline std::pair<int64_t, int64_t> part_keys(int64_t len, int64_t window, int64_t part, int64_t parts) {
  const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
  const int64_t n = len - start;
  const int64_t shares = n >= parts * MIN_SPLIT_KEYS ? parts : 1;
  if (part >= shares) return {len, len};
  return {start + n * part / shares, start + n * (part + 1) / shares};
}

// A unit that read no keys (an empty sequence, or a part left out): nothing to add in the merge.
inline void empty_unit(float* acc, float* mx, float* sums, int64_t group, int64_t d) {
  std::fill(acc, acc + group * d, 0.f);
  std::fill(mx, mx + group, -INFINITY);
  std::fill(sums, sums + group, 0.f);
}

// One unit's whole softmax (its keys not split): out[g] = acc[g] / sums[g] for the group's G heads;
// zeros where the unit read no keys (`any` false). A NaN score stays NaN.
template <typename T>
inline void normalise(const float* acc, const float* sums, bool any, int64_t group, int64_t d, T* out) {
  for (int64_t g = 0; g < group; ++g) {
    const float inv = any ? 1.f / sums[g] : 0.f;
    for (int64_t i = 0; i < d; ++i) out[g * d + i] = T(acc[g * d + i] * inv);
  }
}

// One task's parts (consecutive units of unit_floats each: acc [G, d], the G maxima, the G sums) merged
// as the online softmax does: each part's sums and weighted V rows rescaled to the task's maximum.
template <typename T>
inline void merge_parts(const float* first, int64_t parts, int64_t unit_floats, int64_t group, int64_t d,
                        std::vector<float>& merged, T* out) {
  merged.resize(d);
  for (int64_t g = 0; g < group; ++g) {
    float m = -INFINITY;
    for (int64_t p = 0; p < parts; ++p) m = std::max(m, first[p * unit_floats + group * d + g]);
    float total = 0.f;
    std::fill(merged.begin(), merged.end(), 0.f);
    for (int64_t p = 0; p < parts; ++p) {
      const float* res = first + p * unit_floats;
      const float pm = res[group * d + g], ps = res[group * d + group + g];
      if (ps == 0.f) continue;
      const float w = std::exp(pm - m);
      total += ps * w;
      for (int64_t i = 0; i < d; ++i) merged[i] += res[g * d + i] * w;
    }
    const float inv = total != 0.f ? 1.f / total : 0.f;
    for (int64_t i = 0; i < d; ++i) out[g * d + i] = T(merged[i] * inv);
  }
}

}  // namespace
