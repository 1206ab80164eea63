"""An EAGLE draft layer (Li et al., 2024): one decoder layer that reads the context, on the target's own features.

    x_p  = fc([norm(e(x_{p+1})); h_p])          h_p: the target's final hidden state at p (it chose x_{p+1})
    ĥ_{p+1} = DecoderLayer(x_0 .. x_p)[p]        causal attention over this layer's own K/V cache
    guess for x_{p+2} = argmax LM_head(ĥ_{p+1})  the target's LM head, frozen and shared

A Medusa or Hydra head sees one hidden state and the guessed tokens; it cannot
look back at the prompt. This layer keeps K/V for every position of the
sequence (one layer's worth: 1/30 of the default model's cache), so its guess
for x_{p+2} can copy a name from the question or continue a list. It predicts
the target's next *feature* and feeds that back in for the next guess, which is
EAGLE's insight: the feature sequence is more regular than the token sequence.

At inference the context positions carry the target's true features; a guessed
position carries the layer's own prediction, and its K/V are replaced by the
target's once the verify step has scored it (spec_decode/eagle.py). Training is
teacher-forced on the target's features (spec_decode/eagle_train.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from minillm.config import ModelConfig
from minillm.models.layers import RotaryEmbedding
from minillm.spec_decode.medusa_heads import read_module_file, save_module


@dataclass
class EagleCache:
    """One sequence's K/V in the draft layer: positions start .. start + length - 1 (a prefix-cache hit
    skips positions whose features the target never computed: the cache then starts after them)."""

    k: torch.Tensor  # [kv_heads, capacity, head_dim]
    v: torch.Tensor
    start: int = 0
    length: int = 0

    @property
    def end(self) -> int:
        """The first position this cache does not hold."""
        return self.start + self.length

    def keep_until(self, position: int) -> None:
        """Forget position `position` and every later one (rejected guesses, recomputed chunks); a gap
        before `position` (positions never seen) restarts the cache there."""
        if position > self.end or position < self.start:
            self.start, self.length = position, 0
        else:
            self.length = position - self.start

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [kv_heads, n, head_dim] at the end; returns every held position's K and V."""
        n = k.shape[1]
        if self.length + n > self.k.shape[1]:  # grow by doubling: amortised O(1) per token
            cap = max(2 * self.k.shape[1], self.length + n, 64)
            grown_k = self.k.new_empty(self.k.shape[0], cap, self.k.shape[2])
            grown_v = self.v.new_empty(grown_k.shape)
            grown_k[:, : self.length] = self.k[:, : self.length]
            grown_v[:, : self.length] = self.v[:, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, self.length : self.length + n] = k
        self.v[:, self.length : self.length + n] = v
        self.length += n
        return self.k[:, : self.length], self.v[:, : self.length]


class EagleLayer(nn.Module):
    kind = "eagle"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, inter = cfg.hidden_size, cfg.intermediate_size
        self.hidden_size = h
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        # the embedding table's rows are not on the features' scale (Gemma's are scaled up): normalise them
        self.token_norm = nn.RMSNorm(h, eps)
        self.fc = nn.Linear(2 * h, h)
        self.attn_norm = nn.RMSNorm(h, eps)
        self.qkv_proj = nn.Linear(h, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps)
        self.gate_up_proj = nn.Linear(h, 2 * inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)
        with torch.no_grad():  # at the start ĥ_{p+1} = h_p: the layer repeats the target's guess, as Medusa's heads
            self.fc.weight.zero_()
            self.fc.weight[:, h:].copy_(torch.eye(h))
            self.fc.bias.zero_()
            self.o_proj.weight.zero_()
            self.down_proj.weight.zero_()
        self.metadata: dict[str, str] = {}

    def inputs(self, h: torch.Tensor, token_embedding: torch.Tensor) -> torch.Tensor:
        """The layer's input at p from the feature h_p and the embedding of x_{p+1}."""
        return self.fc(torch.cat([self.token_norm(token_embedding), h], dim=-1))

    def project_qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """x [..., T, hidden] -> q [..., T, heads, d], k and v [..., T, kv_heads, d] (q and k rotated)."""
        qkv = self.qkv_proj(self.attn_norm(x))
        nq, nkv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[..., :nq].unflatten(-1, (self.num_heads, self.head_dim))
        k = qkv[..., nq : nq + nkv].unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = qkv[..., nq + nkv :].unflatten(-1, (self.num_kv_heads, self.head_dim))
        return RotaryEmbedding.apply(q, *rope), RotaryEmbedding.apply(k, *rope), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual adds and the SwiGLU MLP after attention ([..., T, heads * d] attended)."""
        x = x + self.o_proj(attended)
        gate, up = self.gate_up_proj(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)

    def forward(self, h: torch.Tensor, token_embedding: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Teacher-forced, whole sequences: h, token_embedding [B, T, hidden] (h_p and e(x_{p+1})), rope for
        positions 0 .. T-1 -> [B, T, hidden], ĥ_{p+1} at every p (causal; padding after a sequence is harmless)."""
        x = self.inputs(h, token_embedding)
        q, k, v = self.project_qkv(x, rope)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=True)
        return self.finish(x, o.transpose(1, 2).flatten(-2))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: EagleCache) -> torch.Tensor:
        """One sequence's n new rows (q [n, heads, d], k and v [n, kv_heads, d], already rotated): their K/V
        join the cache, and each row attends to the cache and the new rows up to itself -> [n, heads * d]."""
        n = q.shape[0]
        keys, values = cache.append(k.transpose(0, 1), v.transpose(0, 1))
        mask = None
        if n > 1:  # query i sees the keys before it and itself: bottom-right causal
            total = keys.shape[1]
            mask = torch.arange(total, device=q.device) <= torch.arange(total - n, total, device=q.device)[:, None]
        o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
                                           attn_mask=mask, enable_gqa=True)
        return o[0].transpose(0, 1).flatten(-2)

    def extend(self, h: torch.Tensor, token_embedding: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               cache: EagleCache) -> torch.Tensor:
        """One sequence's next n positions (h, token_embedding [n, hidden], rope of positions
        cache.end .. cache.end + n - 1): their K/V join the cache; returns ĥ [n, hidden]."""
        x = self.inputs(h, token_embedding)
        return self.finish(x, self.attend(*self.project_qkv(x, rope), cache))

    def new_cache(self, capacity: int = 64) -> EagleCache:
        w = self.qkv_proj.weight
        shape = (self.num_kv_heads, capacity, self.head_dim)
        return EagleCache(w.new_empty(shape), w.new_empty(shape))

    # ----- files ---------------------------------------------------------------------------
    def save(self, path: str | Path, **metadata) -> None:
        meta = {**self.metadata, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}}
        meta.update(kind=self.kind, shape=json.dumps(self.shape()))
        save_module(self, path, meta)

    def shape(self) -> dict[str, int]:
        return {"hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.down_proj.in_features}

    @classmethod
    def load(cls, path: str | Path, cfg: ModelConfig) -> "EagleLayer":
        """A trained layer for the target whose config is cfg (its shapes must match)."""
        p = Path(path)
        meta, tensors = read_module_file(p, "EAGLE layer", "minillm train-eagle")
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{p}: a file of kind {meta.get('kind', 'medusa')!r}, not an EAGLE layer")
        layer = cls(cfg)
        if json.loads(meta.get("shape", "{}")) != layer.shape():
            raise ValueError(f"{p}: a layer of shape {meta.get('shape')}, the target's is {layer.shape()} "
                             "(another base model)")
        try:
            layer.load_state_dict(tensors)
        except RuntimeError as e:
            raise ValueError(f"{p}: its tensors do not fit an EAGLE layer ({str(e)[:300]})") from e
        layer.metadata = dict(meta)
        return layer.eval()
