"""Runs one scheduled batch through the model: inputs, paged-cache metadata, forward, sampling."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.kv_quant import (
    SCALE_DTYPE, QuantKVLayer, is_quantized, kv_bytes_per_token, resolve_kv_cache_dtype,
)
from minillm.attention.metadata import AttentionMetadata
from minillm.config import CacheConfig
from minillm.engine.sampler import SampleResult, sample
from minillm.engine.scheduler import ScheduledChunk
from minillm.models.llama import LlamaForCausalLM
from minillm.quant.linear import QuantLinear

DEFAULT_CPU_KV_BYTES = 512 * 2**20


def make_attention_backend(name: str):
    if name == "torch":
        from minillm.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from minillm.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention_backend {name!r} (choose 'torch' or 'triton')")


def _frozen_compile(fn):
    """torch.compile with inductor freezing: weights become constants, so inductor can
    pre-pack them for oneDNN (the fast matrix-vector path on CPU), and max_autotune
    picks among the candidates. Freezing is read when a graph is compiled -- lazily,
    at a call -- so every call runs under the patched config (passing it through
    torch.compile's `options` did not take effect here)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    compiled = torch.compile(fn, dynamic=True)

    def call(*args, **kwargs):
        # specialize_float: module floats (RMSNorm eps) become constants checked by a C++ guard,
        # not ~120 Python lambda guards evaluated before every step
        with inductor_config.patch(freezing=True, max_autotune=True), dynamo_config.patch(specialize_float=True):
            return compiled(*args, **kwargs)

    return call


@dataclass
class KVCacheSpec:
    num_blocks: int
    block_size: int
    dtype: torch.dtype  # storage dtype: the model's (or cache_dtype), or int8 / float8_e4m3fn
    bytes_per_block: int  # K and V of all layers, per-token-per-head scales included when quantized

    @property
    def quantized(self) -> bool:
        return is_quantized(self.dtype)


def plan_kv_cache(model: LlamaForCausalLM, cache: CacheConfig, device: torch.device) -> KVCacheSpec:
    """Number of blocks that fit the budget: bytes given, or a fraction of free GPU memory."""
    cfg = model.config
    # kv_cache_dtype "int8"/"fp8": quantized values + fp32 scales, so the same bytes hold more tokens
    dtype = resolve_kv_cache_dtype(cache.kv_cache_dtype) or cache.cache_dtype or model.embed_tokens.weight.dtype
    per_token = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype)
    per_block = per_token * cache.block_size
    if cache.num_blocks is not None:
        n = cache.num_blocks
    elif cache.kv_cache_memory_bytes is not None:
        n = cache.kv_cache_memory_bytes // per_block
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        n = int(free * cache.gpu_memory_utilization) // per_block
    else:
        n = DEFAULT_CPU_KV_BYTES // per_block
    if n < 1:
        raise ValueError(f"KV cache budget holds no block of {per_block} bytes; raise kv_cache_memory_bytes")
    return KVCacheSpec(int(n), cache.block_size, dtype, per_block)


class ModelRunner:
    def __init__(
        self, model: LlamaForCausalLM, spec: KVCacheSpec, attention_backend: str = "torch", compile: bool = False
    ) -> None:
        self.model = model
        self.spec = spec
        self.device = model.embed_tokens.weight.device
        if self.device.type == "cpu" and model.embed_tokens.weight.dtype == torch.float32:
            # faster fp32 matrix-vector products for decode (see the method); measured here,
            # bf16 gains nothing at batch 1 and loses ~10% at batch 8, so it keeps nn.Linear's layout
            model.use_k_major_weights()
        self.backend = make_attention_backend(attention_backend)
        cfg = model.config
        shape = (spec.num_blocks, spec.block_size, cfg.num_key_value_heads, cfg.head_dim)
        # one K and one V buffer per layer (a single big tensor sliced per layer gets
        # copied whole by torch.compile at every layer)
        self.k_caches = [torch.zeros(shape, dtype=spec.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.v_caches = [torch.zeros(shape, dtype=spec.dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        # int8/fp8 caches: one fp32 scale per (slot, kv head) for K and for V, bound to each layer
        self.k_scales: list[torch.Tensor] = []
        self.v_scales: list[torch.Tensor] = []
        self.layer_backends: list = [self.backend] * cfg.num_hidden_layers
        if spec.quantized:
            sshape = shape[:3]
            self.k_scales = [torch.ones(sshape, dtype=SCALE_DTYPE, device=self.device) for _ in self.k_caches]
            self.v_scales = [torch.ones(sshape, dtype=SCALE_DTYPE, device=self.device) for _ in self.v_caches]
            self.layer_backends = [QuantKVLayer(self.backend, ks, vs) for ks, vs in zip(self.k_scales, self.v_scales)]
        self.attach()
        # Decode steps are many small ops (~1,500 per step at batch 1): torch.compile fuses them.
        # Prefill chunks stay eager; they are few, large and shape-diverse.
        self.compiled_decode = None
        self.compiled_logits = None
        if compile:
            if attention_backend != "torch":
                raise ValueError("compile=True is implemented for the torch attention backend")
            self.compiled_decode = _frozen_compile(model.forward)
            for t in self.k_caches + self.v_caches + self.k_scales + self.v_scales:
                # the pool never changes shape: static sizes, so no per-layer duck-sizing guards
                torch._dynamo.mark_static(t)
            if isinstance(model.lm_head, QuantLinear):
                # a quantized head is fastest as an inductor-fused dequantize-and-reduce at batch 1
                self.compiled_logits = torch.compile(model.compute_logits, dynamic=True)

    def attach(self) -> None:
        """Point every attention layer at this runner's pool (a model may serve several engines in turn)."""
        layers = list(zip(self.model.attention_layers(), self.k_caches, self.v_caches, self.layer_backends))
        # already ours (the usual case): skip ~100 nn.Module.__setattr__ calls, 0.6 ms a step
        if all(a.k_cache is k and a.v_cache is v and a.backend is b for a, k, v, b in layers):
            return
        for attn, k, v, b in layers:
            attn.k_cache, attn.v_cache, attn.backend = k, v, b

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k_caches + self.v_caches + self.k_scales + self.v_scales)

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> SampleResult | None:
        """Forward the packed chunks; sample for every chunk that catches its sequence up."""
        self.attach()
        ids: list[int] = []
        positions: list[int] = []
        query_lens, seq_lens, tables = [], [], []
        last_rows: list[int] = []
        for c in chunks:
            start, end = c.num_computed_before, c.num_computed_before + c.num_new_tokens
            ids.extend(c.seq.token_ids[start:end])
            positions.extend(range(start, end))
            query_lens.append(c.num_new_tokens)
            seq_lens.append(end)
            tables.append(c.seq.block_table)
            if c.completes:
                last_rows.append(len(ids) - 1)
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, self.spec.block_size, self.device)
        forward = self.model.forward
        if self.compiled_decode is not None and meta.num_decode_seqs == meta.num_seqs:
            forward = self.compiled_decode
        hidden = forward(torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device), meta)
        if not last_rows:
            return None
        compute_logits = self.model.compute_logits
        if self.compiled_logits is not None and len(last_rows) == 1:
            compute_logits = self.compiled_logits
        logits = compute_logits(hidden[torch.tensor(last_rows, device=self.device)])
        sampled = [c.seq for c in chunks if c.completes]
        return sample(logits, [s.params for s in sampled], [s.generator for s in sampled])

    @torch.inference_mode()
    def run_verify(self, chunks: list[ScheduledChunk], drafts: list[list[int]]) -> list[torch.Tensor | None]:
        """Speculative decoding: like `run`, but chunk i also feeds its draft tokens drafts[i].

        Returns, per chunk that completes its sequence, the target's logits at its last
        1 + len(drafts[i]) positions (row j scores the token after draft[:j]); None otherwise.
        Sampling is left to the verifier.
        """
        self.attach()
        # decodes (one query token, no draft) first, as the attention layout requires
        order = [i for i, c in enumerate(chunks) if c.num_new_tokens == 1 and not drafts[i]]
        first = set(order)
        order += [i for i in range(len(chunks)) if i not in first]
        ids: list[int] = []
        positions: list[int] = []
        query_lens, seq_lens, tables = [], [], []
        rows: dict[int, tuple[int, int]] = {}
        for i in order:
            c, d = chunks[i], drafts[i]
            start, end = c.num_computed_before, c.num_computed_before + c.num_new_tokens
            ids.extend(c.seq.token_ids[start:end])
            ids.extend(d)
            positions.extend(range(start, end + len(d)))
            query_lens.append(c.num_new_tokens + len(d))
            seq_lens.append(end + len(d))
            tables.append(c.seq.block_table)
            if c.completes:
                rows[i] = (len(ids) - 1 - len(d), len(ids))
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, self.spec.block_size, self.device)
        forward = self.model.forward
        if self.compiled_decode is not None and meta.num_decode_seqs == meta.num_seqs:
            forward = self.compiled_decode
        hidden = forward(torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device), meta)
        out: list[torch.Tensor | None] = [None] * len(chunks)
        if rows:
            sel = torch.tensor([r for a, b in rows.values() for r in range(a, b)], device=self.device)
            logits = self.model.compute_logits(hidden[sel])
            at = 0
            for i, (a, b) in rows.items():
                out[i] = logits[at : at + b - a]
                at += b - a
        return out
