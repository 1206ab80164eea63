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
#include <c10/util/BFloat16.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "attend_rows.h"  // key_rows, attend_rows: one group's keys and their softmax-weighted V rows

namespace {


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
  const int64_t parts = split_parts(tasks, threads, longest);
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
      const auto [k0, k1] = part_keys(len, window, part, parts);
      float* res = parts > 1 ? partial.data() + unit * unit_floats : own.data();
      float *acc = res, *mx = res + group * d, *sums = mx + group;
      if (k1 <= k0) {
        empty_unit(acc, mx, sums, group, d);
      } else {
        const T* qb = q + (b * heads + h * group) * d;
        for (int64_t i = 0; i < group * d; ++i) qf[i] = to_float(qb[i]) * scale;
        key_rows(k_cache, v_cache, tables + b * max_blocks, tails ? tails + b * tail_width : nullptr, tail_width,
                 len, k0, k1, block_size, row_stride, h * d, krows, vrows);
        attend_rows(qf.data(), krows, vrows, k1 - k0, group, d, scores, acc, mx, sums);
      }
      if (parts == 1) normalise(acc, sums, k1 > k0, group, d, out + (b * heads + h * group) * d);
    }
  });
  if (parts == 1) return;
  // merge each task's parts: rescale each part's sums to the task's maximum (the online softmax's step)
  std::vector<float> merged(d);
  for (int64_t task = 0; task < tasks; ++task) {
    const int64_t b = task / kv_heads, h = task % kv_heads;
    merge_parts(partial.data() + task * parts * unit_floats, parts, unit_floats, group, d, merged,
                out + (b * heads + h * group) * d);
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
