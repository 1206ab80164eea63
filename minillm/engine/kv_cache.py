"""The paged KV cache in memory: how many blocks fit (the plan), and the tensors themselves (the pool).

    plan = plan_kv_cache(model, config, device)   # blocks that fit the budget, bytes per block
    pool = KVCachePool(model.config, plan, device)
    pool.bind(model, backend)                      # every attention layer reads and writes its own slice

The BlockManager (block_manager.py) decides which block holds which tokens; this
module only owns the memory. One K and one V tensor per layer, each
[num_blocks, block_size, kv_heads, head_dim]; an int8/fp8 cache adds one float32
scale per (slot, kv head) for K and for V (attention/kv_quant.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.kv_quant import SCALE_DTYPE, as_bits, is_quantized, kv_bytes_per_token, resolve_kv_cache_dtype
from minillm.config import ModelConfig
from minillm.engine.config import EngineConfig

DEFAULT_CPU_KV_BYTES = 512 * 2**20


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    dtype: torch.dtype  # storage dtype: the model's, or int8 / float8_e4m3fn
    bytes_per_block: int  # K and V of all layers, per-token-per-head scales included when quantized

    @property
    def quantized(self) -> bool:
        return is_quantized(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block // self.block_size


def plan_kv_cache(model, config: EngineConfig, device: torch.device) -> KVCachePlan:
    """Blocks that fit the budget: num_kv_blocks, else bytes given, else a fraction of free GPU memory."""
    cfg: ModelConfig = model.config
    dtype = resolve_kv_cache_dtype(config.kv_cache_dtype) or model.embed_tokens.weight.dtype
    per_block = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype) * config.block_size
    if config.num_kv_blocks is not None:
        n = config.num_kv_blocks
    elif config.kv_cache_memory_bytes is not None:
        n = config.kv_cache_memory_bytes // per_block
    elif device.type == "cuda":
        peak = measure_activation_peak(model, config, device)  # first: it frees what it allocated
        free, total = torch.cuda.mem_get_info(device)
        n = gpu_kv_budget_bytes(total, free, config.gpu_memory_utilization, peak) // per_block
    else:
        n = DEFAULT_CPU_KV_BYTES // per_block
    if n < 1:
        raise ValueError(f"KV cache budget holds no block of {per_block} bytes; raise kv_cache_memory_bytes")
    return KVCachePlan(int(n), config.block_size, dtype, per_block)


def gpu_kv_budget_bytes(total: int, free: int, utilization: float, activation_peak: int) -> int:
    """Bytes left for the KV pool: `utilization` of the device, less what is in use now (this
    process's weights and CUDA context, and any other process) and the largest step's activations."""
    budget = int(total * utilization) - (total - free) - activation_peak
    if budget <= 0:
        raise ValueError(
            f"no room for a KV cache: gpu_memory_utilization {utilization} of {total / 2**30:.1f} GiB leaves "
            f"{(int(total * utilization) - (total - free)) / 2**30:.2f} GiB after the {(total - free) / 2**30:.1f} GiB "
            f"in use, and the largest step needs {activation_peak / 2**30:.2f} GiB of activations; raise "
            f"gpu_memory_utilization, lower max_num_batched_tokens, or set kv_cache_memory_bytes")
    return budget


@torch.inference_mode()
def measure_activation_peak(model, config: EngineConfig, device: torch.device) -> int:
    """Peak bytes a step of max_num_batched_tokens prefill tokens allocates beyond the weights (CUDA).

    One profile forward, as vLLM does: the step's tokens as one prompt through a throwaway pool just
    big enough, and logits for max_num_seqs rows (the sampler's largest tensor)."""
    from minillm.attention.metadata import AttentionMetadata
    from minillm.attention.registry import make_attention_backend

    cfg = model.config
    tokens = max(1, min(config.max_num_batched_tokens, model.rotary.cos.shape[0]))
    blocks = -(-tokens // config.block_size)
    dtype = resolve_kv_cache_dtype(config.kv_cache_dtype) or model.embed_tokens.weight.dtype
    per_block = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype) * config.block_size
    plan = KVCachePlan(blocks, config.block_size, dtype, per_block)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    pool = KVCachePool(cfg, plan, device)
    backend = make_attention_backend(config.backend_for(device))
    pool.bind(model, backend)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    meta = AttentionMetadata.build([tokens], [tokens], [list(range(blocks))], config.block_size, device)
    backend.prepare(meta, config.block_size, cfg.num_key_value_heads, plan.quantized)
    ids = torch.randint(0, cfg.vocab_size, (tokens,), device=device)
    hidden = model(ids, torch.arange(tokens, device=device), meta)
    model.compute_logits(hidden[-min(tokens, config.max_num_seqs):])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del pool, hidden, meta
    torch.cuda.empty_cache()
    return int(peak)


class KVCachePool:
    """The K/V tensors of every layer (and their scales when quantized)."""

    def __init__(self, cfg: ModelConfig, plan: KVCachePlan, device: torch.device, scratch_blocks: int = 0) -> None:
        """scratch_blocks: blocks after the plan's that no sequence owns (CUDA graphs' padding rows write there)."""
        self.plan = plan
        shape = (plan.num_blocks + scratch_blocks, plan.block_size, cfg.num_key_value_heads, cfg.head_dim)
        layers = range(cfg.num_hidden_layers)
        # one K and one V tensor per layer (a single big tensor sliced per layer gets
        # copied whole by torch.compile at every layer)
        self.k_caches = [torch.zeros(shape, dtype=plan.dtype, device=device) for _ in layers]
        self.v_caches = [torch.zeros(shape, dtype=plan.dtype, device=device) for _ in layers]
        none: list[torch.Tensor | None] = [None] * cfg.num_hidden_layers
        self.k_scales, self.v_scales = list(none), list(none)
        self._bound_model: object | None = None  # bind's last model and its layers with their slices
        self._bound_layers: list[tuple] = []
        if plan.quantized:
            self.k_scales = [torch.ones(shape[:3], dtype=SCALE_DTYPE, device=device) for _ in layers]
            self.v_scales = [torch.ones(shape[:3], dtype=SCALE_DTYPE, device=device) for _ in layers]

    def release(self) -> None:
        """Drop every reference this pool holds to its tensors (so their memory can go before a new pool is
        allocated); the pool is empty afterwards and cannot serve a step."""
        for tensors in (self.k_caches, self.v_caches, self.k_scales, self.v_scales):
            tensors.clear()
        self._bound_model, self._bound_layers = None, []

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in self.k_caches + self.v_caches + self.k_scales + self.v_scales if t is not None]

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    @torch.inference_mode()
    def move_slots(self, moves: list[tuple[int, int]]) -> None:
        """Copy K/V (and scales) from slot src to slot dst in every layer, pair by pair in order.

        Ordered pairs with every source at or above its destination (spec_decode/tree.py)
        give the same result copied all at once, so each layer takes one indexed copy."""
        src = torch.tensor([m[0] for m in moves], device=self.k_caches[0].device)
        dst = torch.tensor([m[1] for m in moves], device=self.k_caches[0].device)
        for t in self.tensors():
            flat = as_bits(t).view(t.shape[0] * t.shape[1], -1)
            flat[dst] = flat[src]

    def bind(self, model, backend) -> None:
        """Point every attention layer of `model` at its slice of this pool and at `backend`.

        Already bound (the usual case): nothing is set, which saves ~100
        nn.Module.__setattr__ calls (0.6 ms) a step at batch 1. The check reads each layer's own
        attributes (another pool or a calibration walk may have re-pointed them), over the layer list
        kept from the last bind rather than one rebuilt from the model's modules every step.
        """
        if self._bound_model is not model:
            self._bound_model = model
            self._bound_layers = list(zip(model.attention_layers(), self.k_caches, self.v_caches,
                                          self.k_scales, self.v_scales))
        if all(a.k_cache is k and a.backend is backend for a, k, _, _, _ in self._bound_layers):
            return
        for attn, k, v, ks, vs in self._bound_layers:
            attn.k_cache, attn.v_cache, attn.k_scale, attn.v_scale, attn.backend = k, v, ks, vs, backend
