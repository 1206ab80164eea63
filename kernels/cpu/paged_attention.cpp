// Paged decode attention on the CPU: each query reads its keys and values where they live in the pool.
//
// What the course teaches here (book/architecture.md, "Paged attention on the CPU"):
// a decode step's attention reads every cached K/V row of every sequence once. The plain
// PyTorch path (minillm/attention/torch_backend.py, paged_decode) first gathers those rows
// out of the block pool into a contiguous [B, kv_heads, L, D] copy and then runs two batched
// matmuls on it: the rows cross memory three times (read for the gather, written as the copy,
// read again by the matmuls). Following the block table inside the kernel, as vLLM's and
// llama.cpp's CPU paths do, reads each row once -- at batch 64+ the KV rows outweigh the
// model's weights, so this is most of a batched step's memory traffic.
//
// Layout: k_cache, v_cache [num_blocks, block_size, kv_heads, D] (one layer's slice of the pool,
// float32 or bfloat16); q [B, H, D], H = G * kv_heads (the G query heads of a group share one
// K/V head, read once for all G); block_tables [B, max_blocks] int32; seq_lens [B]; a sliding
// window w > 0 keeps only each query's last w keys (Gemma 3's local layers).
// Tree verification (spec_decode/tree.py): a draft tree's node sees the cached prefix and then only
// its own root-to-node path, whose K/V sit in scratch slots after the root, not at the positions the
// block table gives. tail_slots [B, T] (optional, int64, right-aligned, -1 = none) names, per query,
// the pool slots of its last keys: with c of them, keys len - c .. len - 1 are read from there. So a
// node at depth d is a decode query of length root + 1 + d whose last d + 1 keys are its path, and
// a window counts from its real position, not from its slot.
// Work: one (sequence, kv head) per task across threads; scores for the G heads over the
// sequence's positions, a float32 softmax, then the weighted sum of V rows. Accumulation is
// float32 whatever the cache dtype. Where the tasks do not share evenly among the threads (batch-1
// decode: 3 kv heads on 2 threads), each task's keys are split between the threads and the parts'
// softmaxes merged as flash-decoding does: each part's maximum, sum and weighted V rows, rescaled to
// the task's maximum.
// With AVX2 (head_dim % 8 == 0) the scores go 8 keys at a time with 8 independent accumulators and
// one hadd-tree reduction: 1.6x faster per key than the plain loops (one thread, 500 keys:
// 105 -> 62 us; head_dim 64, 3 kv heads x 3). The V sum keeps 64 columns of a head's output in
// registers across a tile of keys: one layer of a 128-sequence step (100-400 keys) 4.5 -> 3.3 ms.
// The rows come from memory (a step's K/V outweigh every cache), so the score pass prefetches K
// KEYS_AHEAD keys ahead and, at the same time, each key's V row into L2: the V pass then reads from
// L2 rather than waiting on memory again. 2-vCPU Zen 5, the same layer: 2.10 -> 1.77 ms (8 keys
// ahead and no V prefetch before; 64 / 128 keys ahead measured 1.84 / 1.90).
//
// Registered as torch.ops.minillm_attn.paged_decode so torch.compile sees one opaque call;
// kernels/paged_attention_cpu.py builds this file once per CPU (same build as the GGUF kernels).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "vec_exp.h"  // the softmax's e^x, 8 at a time
#endif
#include <c10/util/BFloat16.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

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

template <typename T>
void paged_decode_impl(const T* q, const T* k_cache, const T* v_cache, const int32_t* tables,
                       const int64_t* lens, const int64_t* tails, int64_t tail_width, T* out, int64_t batch,
                       int64_t heads, int64_t kv_heads, int64_t d, int64_t block_size, int64_t max_blocks,
                       float scale, int64_t window) {
  const int64_t group = heads / kv_heads;
  const int64_t row_stride = kv_heads * d;  // from one token's K/V row to the next in a block
  const int64_t tasks = batch * kv_heads;
  // A task is one (sequence, kv head). When the tasks do not share evenly among the threads -- batch-1
  // decode of the default model: 3 kv heads on 2 threads, one thread doing two -- each task's keys are
  // split into `parts` ranges, one per thread, and the parts' partial softmaxes merged (below). 2-vCPU
  // Zen 5, 3 x 3 heads of 64, best of three: 190 keys 11.1 -> 10.0 us a call, 500 keys 19.9 -> 16.2,
  // 2,000 keys 68 -> 54 (and 16 keys 5.1 -> 3.2 on one thread, MIN_PARALLEL_KEYS).
  const int64_t threads = at::get_num_threads();
  int64_t keys = 0, longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = window > 0 ? std::min(lens[b], window) : lens[b];
    keys += n * kv_heads;
    longest = std::max(longest, n);
  }
  const bool uneven = tasks % threads != 0 && tasks < 4 * threads;
  const int64_t parts = uneven && longest >= threads * MIN_SPLIT_KEYS ? threads : 1;
  const int64_t grain = keys < MIN_PARALLEL_KEYS ? tasks * parts : 1;  // a small call: one thread
  // per unit (task, part): acc [G, d], then the G maxima and G sums
  const int64_t unit_floats = group * d + 2 * group;
  std::vector<float> partial(parts > 1 ? tasks * parts * unit_floats : 0);
  at::parallel_for(0, tasks * parts, grain, [&](int64_t u0, int64_t u1) {
    std::vector<float> qf(group * d), scores, own(unit_floats);
    std::vector<const T*> krows, vrows;
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t task = unit / parts, part = unit % parts;
      const int64_t b = task / kv_heads, h = task % kv_heads;
      const int64_t len = lens[b];
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - start;
      // this part's keys: all of them, or its share when there are enough to split
      const int64_t shares = n >= parts * MIN_SPLIT_KEYS ? parts : 1;
      const int64_t k0 = part < shares ? start + n * part / shares : len;
      const int64_t k1 = part < shares ? start + n * (part + 1) / shares : len;
      float* res = parts > 1 ? partial.data() + unit * unit_floats : own.data();
      float *acc = res, *mx = res + group * d, *sums = mx + group;
      if (k1 <= k0) {  // nothing to read (an empty sequence, or a part left out)
        std::fill(acc, acc + group * d, 0.f);
        std::fill(mx, mx + group, -INFINITY);
        std::fill(sums, sums + group, 0.f);
      } else {
        const T* qb = q + (b * heads + h * group) * d;
        for (int64_t i = 0; i < group * d; ++i) qf[i] = to_float(qb[i]) * scale;
        key_rows(k_cache, v_cache, tables + b * max_blocks, tails ? tails + b * tail_width : nullptr, tail_width,
                 len, k0, k1, block_size, row_stride, h * d, krows, vrows);
        attend_rows(qf.data(), krows, vrows, k1 - k0, group, d, scores, acc, mx, sums);
      }
      if (parts == 1) {  // the whole softmax is here: normalise and write
        T* o = out + (b * heads + h * group) * d;
        for (int64_t g = 0; g < group; ++g) {
          const float inv = k1 > k0 ? 1.f / sums[g] : 0.f;  // (a NaN score stays NaN, as before)
          for (int64_t i = 0; i < d; ++i) o[g * d + i] = T(acc[g * d + i] * inv);
        }
      }
    }
  });
  if (parts == 1) return;
  // merge each task's parts: rescale each part's sums to the task's maximum (the online softmax's step)
  std::vector<float> merged(d);
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / kv_heads, h = task % kv_heads;
    T* o = out + (b * heads + h * group) * d;
    const float* first = partial.data() + task * parts * unit_floats;
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
      for (int64_t i = 0; i < d; ++i) o[g * d + i] = T(merged[i] * inv);
    }
  }
}

at::Tensor paged_decode_impl_any(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, int64_t window,
                                 const std::optional<at::Tensor>& tail_slots) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode: q [B, H, D], caches [blocks, block_size, kv_heads, D]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode: the caches must be contiguous");
  TORCH_CHECK(q_in.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode: q and the caches must share a dtype");
  const int64_t batch = q_in.size(0), heads = q_in.size(1), d = q_in.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && heads % kv_heads == 0, "paged_decode: head_dim or GQA group mismatch");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) >= batch && seq_lens.size(0) >= batch,
              "paged_decode: a block table and a length per query");
  const at::Tensor q = q_in.contiguous();
  // the table as given when it already fits (the usual case): a narrow/cast/copy is ~2 us of a ~7 us call
  const bool as_is = block_tables.size(0) == batch && block_tables.scalar_type() == at::kInt && block_tables.is_contiguous();
  const at::Tensor tables = as_is ? block_tables : block_tables.narrow(0, 0, batch).to(at::kInt).contiguous();
  // the lengths as int64 in a plain vector: at batch 1 the tensor ops (a cast, a max, an item) cost as
  // much as the attention itself
  TORCH_CHECK(seq_lens.device().is_cpu() && (seq_lens.scalar_type() == at::kInt || seq_lens.scalar_type() == at::kLong),
              "paged_decode: seq_lens must be a CPU int32 or int64 tensor");
  std::vector<int64_t> lens(batch);
  const at::Tensor lens_in = seq_lens.contiguous();
  for (int64_t b = 0; b < batch; ++b)
    lens[b] = lens_in.scalar_type() == at::kInt ? lens_in.data_ptr<int32_t>()[b] : lens_in.data_ptr<int64_t>()[b];
  at::Tensor tails;
  if (tail_slots.has_value() && tail_slots->defined()) {
    TORCH_CHECK(tail_slots->dim() == 2 && tail_slots->size(0) >= batch && tail_slots->device().is_cpu(),
                "paged_decode: tail_slots [B, T] on the CPU");
    tails = tail_slots->narrow(0, 0, batch).to(at::kLong).contiguous();
    // checked in plain loops (a tensor max is a few us, as much as a batch-1 call's attention)
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1), width = tails.size(1);
    const int64_t* t = tails.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      int64_t c = 0;
      for (int64_t j = width - 1; j >= 0 && t[b * width + j] >= 0; --j, ++c)
        TORCH_CHECK(t[b * width + j] < num_slots, "paged_decode: a tail slot past the pool");
      TORCH_CHECK(c <= lens[b], "paged_decode: more tail slots than keys");
    }
  }
  const int64_t* tails_ptr = tails.defined() ? tails.data_ptr<int64_t>() : nullptr;
  const int64_t tail_width = tails.defined() ? tails.size(1) : 0;
  at::Tensor out = at::empty_like(q);
  const int64_t max_blocks = tables.size(1);
  TORCH_CHECK(batch == 0 || *std::max_element(lens.begin(), lens.end()) <= max_blocks * block_size,
              "paged_decode: a length past its block table");
  if (q.scalar_type() == at::kFloat) {
    paged_decode_impl<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                             tables.data_ptr<int32_t>(), lens.data(), tails_ptr, tail_width, out.data_ptr<float>(), batch,
                             heads, kv_heads, d, block_size, max_blocks, static_cast<float>(scale), window);
  } else if (q.scalar_type() == at::kBFloat16) {
    using bf = c10::BFloat16;
    paged_decode_impl<bf>(q.data_ptr<bf>(), k_cache.data_ptr<bf>(), v_cache.data_ptr<bf>(),
                          tables.data_ptr<int32_t>(), lens.data(), tails_ptr, tail_width, out.data_ptr<bf>(), batch, heads,
                          kv_heads, d, block_size, max_blocks, static_cast<float>(scale), window);
  } else {
    TORCH_CHECK(false, "paged_decode: float32 or bfloat16 caches only, got ", q.scalar_type());
  }
  return out;
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, int64_t window) {
  return paged_decode_impl_any(q, k_cache, v_cache, block_tables, seq_lens, scale, window, std::nullopt);
}

at::Tensor paged_decode_paths(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale, int64_t window,
                              const at::Tensor& tail_slots) {
  return paged_decode_impl_any(q, k_cache, v_cache, block_tables, seq_lens, scale, window, tail_slots);
}

}  // namespace

// paged_decode as a C function that a compiled graph's C++ wrapper calls directly instead of through
// aoti_torch_call_dispatcher (the op found by name and its arguments boxed, every call): the name and
// argument convention inductor's wrapper derives for the op (engine/compile.py, direct_calls).
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_paged_decode(
    AtenTensorHandle q, AtenTensorHandle k_cache, AtenTensorHandle v_cache, AtenTensorHandle block_tables,
    AtenTensorHandle seq_lens, double scale, int64_t window, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using torch::aot_inductor::tensor_handle_to_tensor_pointer;
    *ret0 = torch::aot_inductor::new_tensor_handle(paged_decode(
        *tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k_cache),
        *tensor_handle_to_tensor_pointer(v_cache), *tensor_handle_to_tensor_pointer(block_tables),
        *tensor_handle_to_tensor_pointer(seq_lens), scale, window));
  });
}

// Two ops rather than one with an optional last argument: inductor's C++ wrapper passes a custom op
// only the arguments the graph gave it, and the dispatcher then read a missing tail_slots past the end
// of its argument array (a segfault in compiled decode). Tree rows run eagerly, so only the first is
// ever in a graph.
TORCH_LIBRARY(minillm_attn, lib) {
  lib.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
          "float scale, int window=0) -> Tensor");
  lib.def("paged_decode_paths(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
          "float scale, int window, Tensor tail_slots) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm_attn, CPU, lib) {
  lib.impl("paged_decode", &paged_decode);
  lib.impl("paged_decode_paths", &paged_decode_paths);
}
