"""Decode steps of a float32 Llama-family model on a CPU as one C++ call: one parallel region per step.

    step = CpuDecodeStep.build(model, pool)      # once, after the weights are where they will stay
    if step.fits(batch):
        hidden = step.run(batch)                 # [rows, hidden], K/V written to the pool

At batch 1 a decode step reads every weight once; the products run at the bus's speed, and what is
left is the cost of the ~300 calls between them: each fork and join of the thread team, each
return to Python or to a compiled graph's wrapper, and the cores left idle while one thread runs a
small op. minillm/cpu/kernels/decode_step.cpp walks all layers in one parallel region, its threads meeting
at a barrier between ops, as llama.cpp's thread pool does (CUDA graphs are the GPU's answer to the
same per-launch cost: engine/cuda_graphs.py). Its values are the op-by-op step's bit for bit (the
same inner functions, split the same way), so it replaces that step wherever it applies.

It applies to steps of 1 to 16 rows that each see the keys up to their own position -- decode rows,
a speculative verify step's k + 1 rows, a prompt's tail after a prefix hit (not a draft tree) -- of a
float32 Llama-family model (Llama, Mistral, Qwen2, SmolLM2: `LlamaForCausalLM` itself) with plain
[out, in] weights (and their panels, where the engine packed them) and a float32 paged KV cache, on one
process, with the torch attention backend. `why_not` names what rules it out otherwise;
EngineConfig.cpu_decode_step turns it off (False) or demands it (True: an error names the reason it
cannot run).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.utils.hooks import RemovableHandle

from minillm.engine.batch import StepBatch
from minillm.engine.config import EngineConfig
from minillm.engine.fast_path import StepRunner
from minillm.engine.kv_cache import KVCachePool
from minillm.cpu.layers import CpuSwiGLU
from minillm.models.layers import SwiGLU
from minillm.models.llama import LlamaForCausalLM


def panels_of(linear: nn.Module, empty: torch.Tensor) -> torch.Tensor:
    """The layer's panel-packed copy where it has a current one (minillm/cpu/panels.py), else `empty`:
    the step reads them for 4 to 8 rows, as SkinnyLinear does."""
    current = getattr(linear, "panels_current", None)
    return linear.panels if current is not None and current() else empty


def _plain_weight(linear: nn.Module) -> bool:
    """A float32 [out, in] row-major weight the step can stream (not quantized, not K-major)."""
    w = getattr(linear, "weight", None)
    return (isinstance(linear, nn.Linear) and isinstance(w, torch.Tensor) and w.dtype == torch.float32
            and w.is_contiguous())


def why_not(model: nn.Module, config: EngineConfig, quantized_kv: bool, device: torch.device) -> str | None:
    """Why this engine's decode steps cannot run as one C++ call, or None when they can."""
    if config.cpu_decode_step is False:
        return "turned off (cpu_decode_step=False)"
    if device.type != "cpu":
        return f"not a CPU ({device.type})"
    if config.backend_for(device) != "torch":
        return f"the {config.backend_for(device)} attention backend was asked for (the step has its own attention)"
    if config.world_size > 1:
        return "the model is split over processes (each layer ends in a collective the step does not make)"
    if type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} is not a plain Llama-family decoder"
    cfg = model.config
    if cfg.qk_norm:
        return "q/k norms (Qwen3) are not in the step"
    if model.embed_tokens.weight.dtype != torch.float32:
        return f"{model.embed_tokens.weight.dtype} weights (the step is float32)"
    if quantized_kv:
        return "a quantized KV cache (the step reads float32 K/V)"
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if type(mlp) not in (SwiGLU, CpuSwiGLU):
            return f"layer {i}'s MLP is {type(mlp).__name__}, not SwiGLU"
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not all(_plain_weight(m) for m in linears):
            return f"layer {i} has quantized or K-major weights"
        if any(m.bias is not None for m in linears[1:]):
            return f"layer {i} has a bias the step does not add"
        if layer.input_layernorm.unit_offset or layer.post_attention_layernorm.unit_offset:
            return f"layer {i}'s norms scale by 1 + w (Gemma)"
    rotary = model.rotary
    if not (hasattr(rotary, "cos") and rotary.cos.dim() == 2 and rotary.cos.dtype == torch.float32):
        return "its RoPE has no [positions, head_dim / 2] float32 table"
    from minillm.cpu.kernels import decode_step_cpu

    if not decode_step_cpu.available():
        return "the kernel did not build (minillm/cpu/kernels/decode_step.cpp; or MINILLM_DECODE_STEP=ops)"
    return None


def first_hooked(modules: list[tuple[str, nn.Module]]) -> str | None:
    """The first module whose Python the step would skip: a forward hook or pre-hook (its own or a global
    one), or a `forward` assigned to the instance; None when there is none."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "a global module forward hook"
    for name, m in modules:
        if m._forward_hooks or m._forward_pre_hooks:
            return f"a forward hook on {name or 'the model'}"
        if "forward" in m.__dict__:
            return f"a forward assigned to {name or 'the model'}"
    return None


@dataclass
class CpuDecodeStep(StepRunner):
    name = "one-region CPU step"  # what the trace records (StepTrace.path)
    step: torch.ScriptObject  # torch.classes.minillm_step.DecodeStep, holding the weights and the pool
    max_rows: int
    # The step runs C++, not the modules' Python: where a module carries a forward hook (an activation
    # recorder, a runtime scale) or a replaced forward, the step stands aside and the layers run op by op.
    # Registering any hook anywhere advances RemovableHandle.next_id, so the modules are walked again only
    # when that counter moved, or while a hook holds the step back (removing one moves nothing); a
    # `forward` assigned later, with no hook, is seen at the next walk.
    modules: list[tuple[str, nn.Module]] = field(default_factory=list, repr=False)
    hooked: str | None = None  # why the step stands aside now, or None
    _hook_id: int = -1

    @classmethod
    def build(cls, model: LlamaForCausalLM, pool: KVCachePool) -> "CpuDecodeStep":
        """Hand the step every weight and the pool's K/V tensors (it keeps references: a weight replaced
        by another tensor afterwards is not seen; one written in place is)."""
        from minillm.cpu.kernels import decode_step_cpu

        cfg = model.config
        empty = torch.empty(0)
        layers: list[torch.Tensor] = []
        windows: list[int] = []
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            bias = attn.qkv_proj.bias
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            layers += [layer.input_layernorm.weight.detach(), attn.qkv_proj.weight.detach(),
                       bias.detach().contiguous() if bias is not None else empty, attn.o_proj.weight.detach(),
                       layer.post_attention_layernorm.weight.detach(), mlp.gate_up_proj.weight.detach(),
                       mlp.down_proj.weight.detach(), pool.k_caches[i], pool.v_caches[i],
                       *(panels_of(m, empty) for m in linears)]
            windows.append(attn.sliding_window or 0)
        attn0 = model.layers[0].self_attn
        step = decode_step_cpu.load()(
            [model.embed_tokens.weight.detach(), model.norm.weight.detach(), model.rotary.cos, model.rotary.sin],
            layers, [attn0.num_heads, attn0.num_kv_heads, attn0.head_dim, cfg.intermediate_size, *windows],
            [float(cfg.rms_norm_eps), float(attn0.scale)])
        return cls(step, decode_step_cpu.MAX_ROWS, list(model.named_modules()))

    def fits(self, batch: StepBatch) -> bool:
        """At most max_rows rows, each a query that sees the keys up to its own position: decode rows, and
        chunks over cached keys (a verify step's k + 1 rows, the tail of a prompt after a prefix hit) --
        the rows the op-by-op step hands its paged-decode kernel as one call (cpu/attention.py,
        kernel_rows). Not a prompt's first chunk, nor a draft tree (its nodes read other slots)."""
        if self.hooked is not None or RemovableHandle.next_id != self._hook_id:  # (a removed hook: no new id)
            self._hook_id = RemovableHandle.next_id
            self.hooked = first_hooked(self.modules)
        return (self.hooked is None and 0 < len(batch.token_ids) <= self.max_rows
                and all(q == 1 or q < s for q, s in zip(batch.query_lens, batch.seq_lens))
                and not any(t is not None for t in batch.tree_parents))

    def run(self, batch: StepBatch) -> torch.Tensor:
        """The step's final hidden states [rows, hidden]; each row's K/V written to its pool slot."""
        starts, flat = [0], []
        for table, rows in zip(batch.block_tables, batch.query_lens):
            for _ in range(rows):  # each row of a chunk reads its sequence's table
                flat += table
                starts.append(len(flat))
        return self.step.run(batch.token_ids, batch.positions, flat, starts, not batch.is_decode_only)
