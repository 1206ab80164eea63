// A whole decode step of a Llama-family model, float32 on the CPU, in one parallel region.
//
// What the course teaches here (book/architecture.md, "One parallel region per decode step"): at batch
// 1 a decode step reads every weight once, so it should cost what reading the weights costs. The
// products do run at the bus's speed, but a step is ~300 small calls -- per layer a norm, the q/k/v
// product, RoPE, the K/V write, the attention, three more products, an activation, two residual adds --
// and each call that uses both cores forks the thread team and joins it, while one that does not
// leaves the other core idle. Inductor's compiled graph fuses the elementwise calls but keeps the
// fork/join per call and its Python entry (2-vCPU Zen 5: the products ran on both threads ~70% of a
// 9.1 ms step). llama.cpp runs its graph on a persistent thread pool that meets at a barrier between
// ops; CUDA's answer to the same per-launch cost is a graph replay, or a "megakernel". This file is the
// CPU version: the team forks once per step and each thread walks all layers, meeting the others
// at a barrier where the next op reads what all of them wrote:
//
//   residual = embed[token]                      every thread its own copy (576 floats: no barrier)
//   per layer:
//     x = rmsnorm(residual)                      every thread, its own copy
//     qkv[:, my rows] = x @ Wqkv[my rows].T      the few-row product's inner loop (skinny_rows.h)
//     -- barrier --
//     attention units (kv head, key part)        each rotates its q heads; the unit holding the new
//                                                key rotates k and writes k, v to the pool slot
//     -- barrier --
//     attn = merge of the units' softmaxes       every thread, its own copy (attend_rows.h)
//     o[:, my rows] = attn @ Wo[my rows].T
//     -- barrier --
//     residual += o; x = rmsnorm(residual)       every thread, its own copy
//     act[:, my cols] = silu(x @ Wg[my].T) * (x @ Wu[my].T)   gate and up rows of the same columns
//     -- barrier --
//     down[:, my rows] = act @ Wd[my rows].T
//     -- barrier --
//     residual += down
//   hidden = rmsnorm(residual)
//
// Five barriers a layer (~0.3 us each with two threads spinning) instead of ~10 forks and joins, and
// no Python between the ops. Every value is computed by the same inner functions the separate ops use
// (skinny_rows.h, attend_rows.h, elementwise_rows.h), split the same way, so the hidden states equal
// the op-by-op step's bit for bit (tests/test_cpu_decode_step.py checks it). The LM head and sampling
// stay outside: they are one call each already (skinny_f32.cpp's linear and greedy).
//
// Rows: up to MAX_BATCH, each a query that sees the keys up to its own position -- one decode row per
// sequence, or a short chunk's rows over cached keys (a verify step's k + 1, a prompt's tail after a
// prefix hit), the rows the op-by-op step hands its paged-decode kernel as one call. When rows share a
// sequence every new K/V row is written before any row attends (one more barrier a layer). Where the
// engine packed the weights again in panels (engine/few_row_panels.py), 4 to 8 rows read them, as the
// op-by-op step does (panel_rows.h; one more barrier between the gate/up panels and the SiLU).
// Scope: float32 weights stored [out, in] contiguous, a float32 paged KV cache, RMSNorm + RoPE
// (rotate-half) + GQA + SwiGLU, optional q/k/v bias (Qwen2) and per-layer sliding windows. Anything
// else runs op by op (minillm/engine/cpu_decode_step.py says why not).
// Registered as torch.classes.minillm_step.DecodeStep; kernels/decode_step_cpu.py builds it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "attend_rows.h"       // key_rows, attend_rows, part_keys, merge_parts: the attention's pieces
#include "elementwise_rows.h"  // norm_row, rope_head, silu_mul_run
#include "panel_rows.h"        // panels_simd, panels_portable: one thread's panels of a product
#include "skinny_rows.h"       // rows_simd, rows_portable: one thread's rows of a product

namespace {

constexpr int64_t MAX_BATCH = 16;  // rows a step takes (the few-row product's register tiles up to 8,
                                   // then groups of 8 from L1: skinny_rows.h)
constexpr int64_t ALIGN = 16;      // thread shares start at multiples of 16 rows: SiLU's vector loop then
                                   // meets each element in the same lane as the whole-row op does

struct Layer {
  const float* input_norm;  // [hidden]
  const float* qkv;         // [(heads + 2 kv_heads) D, hidden]
  const float* qkv_bias;    // [(heads + 2 kv_heads) D] or nullptr
  const float* o;           // [hidden, heads D]
  const float* post_norm;   // [hidden]
  const float* gate_up;     // [2 I, hidden]: gate rows, then up rows
  const float* down;        // [hidden, I]
  float* k_cache;           // [blocks, block_size, kv_heads, D]
  float* v_cache;
  int64_t window;           // > 0: a query sees only its last `window` keys
  // the four weights again in panels of 32 outputs ([ceil(N / 32), K, 32]) or nullptr: where the engine
  // packed them (engine/few_row_panels.py), 4 to 8 rows read them, as SkinnyLinear does (PANEL_ROWS)
  const float *qkv_panels, *o_panels, *gate_up_panels, *down_panels;
};

// Thread t's share [lo, hi) of n rows among `threads`, cut at multiples of ALIGN.
inline std::pair<int64_t, int64_t> share(int64_t n, int64_t t, int64_t threads) {
  auto cut = [&](int64_t i) { return i >= threads ? n : std::min(n, n * i / threads / ALIGN * ALIGN); };
  return {cut(t), cut(t + 1)};
}

// y[:, lo:hi] = x @ W[lo:hi].T (+ b): the path skinny_f32.cpp's linear takes for the same call.
inline void product(const float* w, const float* x, const float* b, float* y, int64_t m, int64_t k, int64_t n,
                    int64_t lo, int64_t hi) {
  if (hi <= lo) return;
#if defined(__AVX2__) && defined(__FMA__)
  if (k % 8 == 0) return rows_simd(w, x, b, y, m, k, n, lo, hi);
#endif
  rows_portable(w, x, b, y, m, k, n, lo, hi);
}

// Rows of x that read a layer's panels where it has them (models/skinny_linear.py, PANEL_ROWS).
inline bool reads_panels(const float* panels, int64_t m) { return panels != nullptr && m >= 4 && m <= 8; }

// Thread t's share of y = x @ W.T (+ b), all n outputs: its rows of W, or its panels where it reads them
// (the path panel_f32.cpp's linear takes for the same call).
inline void product_share(const float* w, const float* panels, const float* x, const float* b, float* y, int64_t m,
                          int64_t k, int64_t n, int64_t t, int64_t team) {
  if (reads_panels(panels, m)) {
    const int64_t count = (n + PANEL - 1) / PANEL, p0 = count * t / team, p1 = count * (t + 1) / team;
    if (p1 <= p0) return;
#if defined(__AVX512F__)
    return panels_simd(panels, x, b, y, m, k, n, p0, p1);
#else
    return panels_portable(panels, x, b, y, m, k, n, p0, p1);
#endif
  }
  const auto [lo, hi] = share(n, t, team);
  product(w, x, b, y, m, k, n, lo, hi);
}

// A float buffer on a 64-byte boundary, as torch allocates tensors: the products read their rows of x
// with 32- and 64-byte loads, and from a 16-byte boundary (std::vector's) half or all of those loads
// straddle two cache lines. Measured at 16 rows, one thread: the step's products took ~14% longer than
// the same kernel's on torch tensors until its buffers were aligned.
class Aligned {
 public:
  explicit Aligned(int64_t n)
      : p_(static_cast<float*>(std::aligned_alloc(64, std::max<int64_t>(64, (n * 4 + 63) / 64 * 64)))) {
    if (p_ == nullptr) throw std::bad_alloc();
  }
  ~Aligned() { std::free(p_); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  float* data() const { return p_; }
  float& operator[](int64_t i) const { return p_[i]; }

 private:
  float* p_;
};

float* data_or_null(const at::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

void check_f32(const at::Tensor& t, std::vector<int64_t> shape, const char* what);

// A weight's panels (an empty tensor: none), [ceil(n / 32), k, 32]; their data or nullptr.
const float* panels_of(const at::Tensor& t, int64_t n, int64_t k, const char* what) {
  if (!t.numel()) return nullptr;
  check_f32(t, {(n + PANEL - 1) / PANEL, k, PANEL}, what);
  return t.data_ptr<float>();
}

void check_f32(const at::Tensor& t, std::vector<int64_t> shape, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
              "DecodeStep: ", what, " must be a contiguous float32 CPU tensor");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), "DecodeStep: ", what, " has shape ", t.sizes(), ", expected ",
              at::IntArrayRef(shape));
}

class DecodeStep : public torch::CustomClassHolder {
 public:
  // model: embedding [V, hidden], final norm [hidden], RoPE cos and sin [positions, D / 2].
  // layers: 13 tensors per layer -- input norm, qkv weight, qkv bias (an empty tensor: none), o weight,
  // post-attention norm, gate_up weight, down weight, k cache, v cache, then the panels of qkv, o,
  // gate_up and down (an empty tensor: none).
  // dims: heads, kv_heads, head_dim, intermediate, then each layer's window (0: none).
  // reals: the norms' eps, the attention's scale.
  DecodeStep(std::vector<at::Tensor> model, std::vector<at::Tensor> layers, std::vector<int64_t> dims,
             std::vector<double> reals)
      : keep_(std::move(model)) {
    TORCH_CHECK(keep_.size() == 4 && dims.size() >= 4 && reals.size() == 2,
                "DecodeStep(model [embed, norm, cos, sin], layers, dims, reals [eps, scale])");
    heads_ = dims[0], kv_heads_ = dims[1], d_ = dims[2], inter_ = dims[3];
    TORCH_CHECK(heads_ > 0 && kv_heads_ > 0 && heads_ % kv_heads_ == 0 && d_ > 0 && d_ % 2 == 0 && inter_ > 0,
                "DecodeStep: heads a multiple of kv_heads, an even head_dim");
    TORCH_CHECK(keep_[0].dim() == 2, "DecodeStep: the embedding must be [vocab, hidden]");
    vocab_ = keep_[0].size(0), hidden_ = keep_[0].size(1);
    check_f32(keep_[0], {vocab_, hidden_}, "the embedding");
    check_f32(keep_[1], {hidden_}, "the final norm");
    TORCH_CHECK(keep_[2].dim() == 2, "DecodeStep: RoPE tables [positions, head_dim / 2]");
    positions_ = keep_[2].size(0);
    check_f32(keep_[2], {positions_, d_ / 2}, "the RoPE cos table");
    check_f32(keep_[3], {positions_, d_ / 2}, "the RoPE sin table");
    embed_ = keep_[0].data_ptr<float>(), final_norm_ = keep_[1].data_ptr<float>();
    cos_ = keep_[2].data_ptr<float>(), sin_ = keep_[3].data_ptr<float>();
    eps_ = static_cast<float>(reals[0]), scale_ = static_cast<float>(reals[1]);
    TORCH_CHECK(layers.size() % PER_LAYER == 0 && dims.size() == 4 + layers.size() / PER_LAYER,
                "DecodeStep: 13 tensors and one window per layer");
    const int64_t qkv_n = (heads_ + 2 * kv_heads_) * d_;
    for (size_t i = 0; i < layers.size(); i += PER_LAYER) {
      const at::Tensor* t = layers.data() + i;
      check_f32(t[0], {hidden_}, "an input norm");
      check_f32(t[1], {qkv_n, hidden_}, "a qkv weight");
      if (t[2].numel()) check_f32(t[2], {qkv_n}, "a qkv bias");
      check_f32(t[3], {hidden_, heads_ * d_}, "an o weight");
      check_f32(t[4], {hidden_}, "a post-attention norm");
      check_f32(t[5], {2 * inter_, hidden_}, "a gate_up weight");
      check_f32(t[6], {hidden_, inter_}, "a down weight");
      TORCH_CHECK(t[7].dim() == 4, "DecodeStep: a KV cache must be [blocks, block_size, kv_heads, head_dim]");
      const int64_t blocks = t[7].size(0), block_size = t[7].size(1);
      check_f32(t[7], {blocks, block_size, kv_heads_, d_}, "a k cache");
      check_f32(t[8], {blocks, block_size, kv_heads_, d_}, "a v cache");
      if (i == 0) blocks_ = blocks, block_size_ = block_size;
      TORCH_CHECK(blocks == blocks_ && block_size == block_size_, "DecodeStep: every layer's pool has one shape");
      layers_.push_back({t[0].data_ptr<float>(), t[1].data_ptr<float>(), data_or_null(t[2]), t[3].data_ptr<float>(),
                         t[4].data_ptr<float>(), t[5].data_ptr<float>(), t[6].data_ptr<float>(),
                         t[7].data_ptr<float>(), t[8].data_ptr<float>(), dims[4 + i / PER_LAYER],
                         panels_of(t[9], qkv_n, hidden_, "qkv panels"), panels_of(t[10], hidden_, heads_ * d_, "o panels"),
                         panels_of(t[11], 2 * inter_, hidden_, "gate_up panels"),
                         panels_of(t[12], hidden_, inter_, "down panels")});
    }
    keep_.insert(keep_.end(), layers.begin(), layers.end());  // the pointers above stay valid while we live
  }

  // Rows that each see the keys up to their own position: one decode row per sequence, or a short
  // chunk's rows (a verify step's k + 1: row i of a chunk is a decode query at its own position). Per
  // row its token, its position (the new key's) and its sequence's block table (tables[starts[b] :
  // starts[b + 1]]). `shared`: some rows belong to one sequence, so every new K/V row is written before
  // any row attends (one more barrier a layer). Writes each row's K/V into the pool and returns the
  // final hidden states [rows, hidden] (the LM head's input).
  at::Tensor run(std::vector<int64_t> tokens, std::vector<int64_t> positions, std::vector<int64_t> tables,
                 std::vector<int64_t> starts, bool shared) {
    const int64_t rows = static_cast<int64_t>(tokens.size());
    TORCH_CHECK(rows >= 1 && rows <= MAX_BATCH, "DecodeStep: 1 to ", MAX_BATCH, " decode rows, got ", rows);
    TORCH_CHECK(positions.size() == tokens.size() && starts.size() == tokens.size() + 1 && starts[0] == 0 &&
                    starts.back() == static_cast<int64_t>(tables.size()),
                "DecodeStep: a position and a block table per row");
    std::vector<int32_t> table32(tables.size());  // the attention's table type (attend_rows.h, key_rows)
    for (size_t i = 0; i < tables.size(); ++i) {
      TORCH_CHECK(tables[i] >= 0 && tables[i] < blocks_, "DecodeStep: block ", tables[i], " is not in the pool");
      table32[i] = static_cast<int32_t>(tables[i]);
    }
    for (int64_t b = 0; b < rows; ++b) {
      TORCH_CHECK(tokens[b] >= 0 && tokens[b] < vocab_, "DecodeStep: token ", tokens[b], " is not in the vocabulary");
      TORCH_CHECK(positions[b] >= 0 && positions[b] < positions_, "DecodeStep: position ", positions[b],
                  " is past the RoPE table");
      TORCH_CHECK(starts[b + 1] >= starts[b] && positions[b] / block_size_ < starts[b + 1] - starts[b],
                  "DecodeStep: row ", b, "'s block table does not reach position ", positions[b]);
    }
    at::Tensor out = at::empty({rows, hidden_}, at::TensorOptions().dtype(at::kFloat));
    const int64_t threads = std::max(1, at::get_num_threads());
    const int64_t group = heads_ / kv_heads_, q_size = heads_ * d_, qkv_n = q_size + 2 * kv_heads_ * d_;
    const int64_t tasks = rows * kv_heads_;
    const int64_t unit_floats = group * d_ + 2 * group;
    // shared between the threads: each writes its rows (or units), all read after the next barrier
    Aligned qkv(rows * qkv_n), o(rows * hidden_), gate_up(rows * 2 * inter_), act(rows * inter_),
        down(rows * hidden_), partial(tasks * threads * unit_floats);
    float* hidden_out = out.data_ptr<float>();
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      Aligned residual(rows * hidden_), x(rows * hidden_), attn(rows * q_size), qf(group * d_), kr(d_);
      std::vector<float> scores, merged;
      std::vector<const float*> krows, vrows;
      for (int64_t b = 0; b < rows; ++b)
        std::copy_n(embed_ + tokens[b] * hidden_, hidden_, residual.data() + b * hidden_);
      const auto [int_lo, int_hi] = share(inter_, t, team);
      for (size_t l = 0; l < layers_.size(); ++l) {
        const Layer& L = layers_[l];
        for (int64_t b = 0; b < rows; ++b) {  // the first layer norms the embedding; later ones add `down` first
          float* r = residual.data() + b * hidden_;
          if (l > 0)
            for (int64_t i = 0; i < hidden_; ++i) r[i] = r[i] + down[b * hidden_ + i];
          norm_row(r, L.input_norm, x.data() + b * hidden_, hidden_, eps_);
        }
        product_share(L.qkv, L.qkv_panels, x.data(), L.qkv_bias, qkv.data(), rows, hidden_, qkv_n, t, team);
#pragma omp barrier
        if (shared) {  // every new K/V row first: a chunk's later rows read its earlier rows' keys
          for (int64_t unit = t; unit < tasks; unit += team) {
            const int64_t b = unit / kv_heads_, h = unit % kv_heads_, pos = positions[b];
            write_kv(L, qkv.data() + b * qkv_n, tables.data() + starts[b], pos, h);
          }
#pragma omp barrier
        }
        // the attention's split, as paged_attention.cpp decides it for the same call (windowed layers
        // read fewer keys: their own split)
        int64_t layer_longest = 0;
        for (int64_t b = 0; b < rows; ++b)
          layer_longest = std::max(layer_longest, L.window > 0 ? std::min(positions[b] + 1, L.window) : positions[b] + 1);
        const int64_t parts = split_parts(tasks, threads, layer_longest);
        for (int64_t unit = t; unit < tasks * parts; unit += team) {
          const int64_t task = unit / parts, part = unit % parts, b = task / kv_heads_, h = task % kv_heads_;
          const int64_t pos = positions[b], len = pos + 1;
          const float *c = cos_ + pos * (d_ / 2), *s = sin_ + pos * (d_ / 2);
          const float* row = qkv.data() + b * qkv_n;
          const auto [k0, k1] = part_keys(len, L.window, part, parts);
          float* res = partial.data() + (task * parts + part) * unit_floats;
          float *acc = res, *mx = res + group * d_, *sums = mx + group;
          if (k1 <= k0) {
            empty_unit(acc, mx, sums, group, d_);
            continue;
          }
          if (!shared && k0 <= pos && pos < k1)  // this unit reads the new key: it writes it first
            write_kv(L, row, tables.data() + starts[b], pos, h);
          for (int64_t g = 0; g < group; ++g) {  // the group's q heads, rotated, then scaled as the op scales
            rope_head(row + (h * group + g) * d_, c, s, kr.data(), d_ / 2);
            for (int64_t i = 0; i < d_; ++i) qf[g * d_ + i] = kr[i] * scale_;
          }
          key_rows<float>(L.k_cache, L.v_cache, table32.data() + starts[b], nullptr, 0, len, k0, k1, block_size_,
                          kv_heads_ * d_, h * d_, krows, vrows);
          attend_rows(qf.data(), krows, vrows, k1 - k0, group, d_, scores, acc, mx, sums);
        }
#pragma omp barrier
        for (int64_t task = 0; task < tasks; ++task) {  // every thread its own copy of the attention's output
          const int64_t b = task / kv_heads_, h = task % kv_heads_;
          float* dst = attn.data() + b * q_size + h * group * d_;
          const float* first = partial.data() + task * parts * unit_floats;
          if (parts == 1) {
            const auto [k0, k1] = part_keys(positions[b] + 1, L.window, 0, 1);
            normalise(first, first + group * d_ + group, k1 > k0, group, d_, dst);
          } else {
            merge_parts(first, parts, unit_floats, group, d_, merged, dst);
          }
        }
        product_share(L.o, L.o_panels, attn.data(), nullptr, o.data(), rows, q_size, hidden_, t, team);
#pragma omp barrier
        for (int64_t b = 0; b < rows; ++b) {
          float* r = residual.data() + b * hidden_;
          for (int64_t i = 0; i < hidden_; ++i) r[i] = r[i] + o[b * hidden_ + i];  // residual first, as the op adds
          norm_row(r, L.post_norm, x.data() + b * hidden_, hidden_, eps_);
        }
        if (reads_panels(L.gate_up_panels, rows)) {  // a thread's panels hold other columns than its SiLU's
          product_share(L.gate_up, L.gate_up_panels, x.data(), nullptr, gate_up.data(), rows, hidden_, 2 * inter_, t,
                        team);
#pragma omp barrier
        } else {  // the rows of the gate and up halves that this thread's SiLU reads
          product(L.gate_up, x.data(), nullptr, gate_up.data(), rows, hidden_, 2 * inter_, int_lo, int_hi);
          product(L.gate_up, x.data(), nullptr, gate_up.data(), rows, hidden_, 2 * inter_, inter_ + int_lo,
                  inter_ + int_hi);
        }
        for (int64_t b = 0; b < rows; ++b) {
          const float* gu = gate_up.data() + b * 2 * inter_;
          if (int_hi > int_lo) silu_mul_run(gu + int_lo, gu + inter_ + int_lo, act.data() + b * inter_ + int_lo,
                                            int_hi - int_lo);
        }
#pragma omp barrier
        product_share(L.down, L.down_panels, act.data(), nullptr, down.data(), rows, inter_, hidden_, t, team);
#pragma omp barrier
      }
      if (t == 0) {
        for (int64_t b = 0; b < rows; ++b) {
          float* r = residual.data() + b * hidden_;
          if (!layers_.empty())
            for (int64_t i = 0; i < hidden_; ++i) r[i] = r[i] + down[b * hidden_ + i];
          norm_row(r, final_norm_, hidden_out + b * hidden_, hidden_, eps_);
        }
      }
    }
    return out;
  }

 private:
  static constexpr size_t PER_LAYER = 13;

  // Row b's new K/V for kv head h: k rotated to its position, both written to the position's pool slot.
  void write_kv(const Layer& L, const float* row, const int64_t* table, int64_t pos, int64_t h) const {
    const int64_t q_size = heads_ * d_;
    const int64_t slot = table[pos / block_size_] * block_size_ + pos % block_size_;
    const int64_t at = (slot * kv_heads_ + h) * d_;
    rope_head(row + q_size + h * d_, cos_ + pos * (d_ / 2), sin_ + pos * (d_ / 2), L.k_cache + at, d_ / 2);
    std::copy_n(row + q_size + kv_heads_ * d_ + h * d_, d_, L.v_cache + at);
  }

  std::vector<at::Tensor> keep_;
  std::vector<Layer> layers_;
  const float *embed_ = nullptr, *final_norm_ = nullptr, *cos_ = nullptr, *sin_ = nullptr;
  int64_t heads_ = 0, kv_heads_ = 0, d_ = 0, inter_ = 0, vocab_ = 0, hidden_ = 0, positions_ = 0;
  int64_t blocks_ = 0, block_size_ = 0;
  float eps_ = 0.f, scale_ = 0.f;
};

}  // namespace

TORCH_LIBRARY(minillm_step, lib) {
  lib.class_<DecodeStep>("DecodeStep")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<int64_t>, std::vector<double>>())
      .def("run", &DecodeStep::run);
}
