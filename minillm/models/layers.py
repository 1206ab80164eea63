"""Building blocks of a Llama-family decoder, in plain PyTorch (gpt-fast style)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from minillm.config import ModelConfig
from minillm.models import fused


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32; optionally adds the residual first.

    Fusing the residual add into the norm (as vLLM does) saves one pass over the
    hidden state per norm and keeps the layer loop short. ``unit_offset``
    (Gemma) stores w and scales by 1 + w, as Hugging Face's checkpoints do; the
    product is taken in float32 before rounding to x's dtype, as in transformers.
    """

    def __init__(self, size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size) if unit_offset else torch.ones(size))
        self.eps = eps
        self.unit_offset = unit_offset

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() + 1.0 if self.unit_offset else self.weight
        if x.dtype == torch.float32:  # one fused op; the eager path counts every op at batch 1
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), w.float(), self.eps).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not self.unit_offset and fused.use_fused(x):  # CUDA: the Triton kernel (models/fused.py)
            return fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        residual = residual + x  # residual first: the sum takes its row-major layout when x is a
        return self._norm(residual), residual  # column-major view (SkinnyLinear.column_major_out)


class ScaledEmbedding(nn.Embedding):
    """Gemma: token embeddings times sqrt(hidden), the factor rounded to the weight's dtype (as transformers)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.register_buffer("embed_scale", torch.tensor(embedding_dim**0.5), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


def rope_inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Per-pair rotation frequencies, with Llama 3's or linear context scaling applied.

    ``local``: Gemma 3's sliding layers, their own theta and never scaled (as in transformers).
    """
    dim = cfg.head_dim
    theta = (cfg.rope_local_base_freq or cfg.rope_theta) if local else cfg.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = None if local else cfg.rope_scaling
    if not rs:
        return inv_freq
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend between.
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_len = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return torch.where(mid, blended, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3, linear)")


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (the Hugging Face convention) from a precomputed cos/sin table.

    The model looks up cos/sin for the step's positions once (`lookup`) and every
    layer reuses them (`apply`), rotating q and k heads in one call.
    """

    def __init__(self, cfg: ModelConfig, max_positions: int, local: bool = False) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(cfg, local)
        t = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(t, inv_freq)  # [pos, head_dim / 2]
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of each token's angles, shaped [tokens, 1, head_dim / 2] to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim]; rotates each (x1, x2) half-pair by the token's angle."""
        if fused.use_fused(x):  # CUDA: the Triton kernel, fp32 math and one rounding (models/fused.py)
            return fused.rope(x, cos, sin)
        # in x's dtype, as transformers does (for bf16: the same roundings, half the bytes of an fp32 detour)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.lookup(positions)
        return self.apply(x, cos, sin)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        # their readers are elementwise (the activation, the residual add): a SkinnyLinear may return
        # a column-major view rather than copy (minillm/cpu/skinny_linear.py); other classes ignore this
        self.gate_up_proj.column_major_out = self.down_proj.column_major_out = True
        self.down_proj.read_by_residual_add = True

    @staticmethod
    def act(gate: torch.Tensor) -> torch.Tensor:
        return F.silu(gate)

    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up, from the two halves of one product."""
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gated(self.gate_up_proj(x)))


class GeGLU(SwiGLU):
    """Gemma's gate: down(gelu_tanh(gate(x)) * up(x)) (transformers' "gelu_pytorch_tanh")."""

    @staticmethod
    def act(gate: torch.Tensor) -> torch.Tensor:
        return F.gelu(gate, approximate="tanh")


MLP_KINDS: dict[str, type[SwiGLU]] = {"silu": SwiGLU, "gelu_pytorch_tanh": GeGLU}


def make_mlp(cfg: ModelConfig) -> SwiGLU:
    if cfg.hidden_activation not in MLP_KINDS:
        raise ValueError(f"unsupported hidden_activation {cfg.hidden_activation!r} "
                         f"(supported: {', '.join(MLP_KINDS)})")
    return MLP_KINDS[cfg.hidden_activation](cfg.hidden_size, cfg.intermediate_size)
