"""Run calibration text through a model one decoder layer at a time (for GPTQ's sequential quantization).

GPTQ quantizes layer i on the inputs it sees once layers 0..i-1 are already
quantized, so each layer corrects the errors of those before it (as the
reference implementation does). Running the whole model once per layer would
cost L full passes; instead the hidden states entering the current layer are
kept (for every calibration token) and pushed through that layer only:

    walker = LayerWalker(model, windows)          # embeddings of every window
    for layer in model.layers:
        walker.feed(layer, {lin: taps}, stop=lin)  # capture a linear's inputs (stop there)
        ...quantize lin...
        walker.advance(layer)                      # the (now quantized) layer's outputs

The windows go through in chunks, each a packed prefill of whole windows with
a private paged KV cache (minillm.models.standalone.attach_private_cache), so
attention is the model's own; the model's cache binding is restored at the end.
The layer loop is the one of LlamaForCausalLM.forward (embed, shared RoPE
lookup, layer(rope, x, residual, meta)), which Gemma 3 shares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from minillm.attention.metadata import AttentionMetadata


class _StopLayer(Exception):
    """Raised by the tap on the last module a feed needs: the rest of the layer is not computed."""


@dataclass
class _Chunk:
    hidden: torch.Tensor
    residual: torch.Tensor | None
    rope: tuple
    meta: AttentionMetadata


class LayerWalker:
    def __init__(self, model, wins: torch.Tensor, windows_per_chunk: int = 8, block_size: int = 16) -> None:
        from minillm.models.standalone import attach_private_cache

        if wins.dim() != 2 or wins.shape[0] < 1 or wins.shape[1] < 1:
            raise ValueError(f"calibration must be token windows [n, len], got {tuple(wins.shape)}")
        self.model = model
        attn = model.attention_layers()
        self._saved = [(a.k_cache, a.v_cache, a.k_scale, a.v_scale, a.backend) for a in attn]
        n, length = wins.shape
        per_seq = -(-length // block_size)
        per_chunk = min(windows_per_chunk, n)
        attach_private_cache(model, per_chunk * per_seq * block_size, block_size)
        device = model.embed_tokens.weight.device
        self.chunks: list[_Chunk] = []
        with torch.no_grad():
            for start in range(0, n, per_chunk):
                ids = wins[start:start + per_chunk].to(device)
                m = ids.shape[0]
                tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(m)]
                meta = AttentionMetadata.build([length] * m, [length] * m, tables, block_size, device)
                positions = torch.arange(length, device=device).repeat(m)
                self.chunks.append(_Chunk(model.embed_tokens(ids.reshape(-1)), None, model.rotary.lookup(positions), meta))

    @torch.no_grad()
    def feed(self, layer: nn.Module, taps: dict[nn.Module, Callable[[torch.Tensor], None]],
             stop: nn.Module | None = None) -> None:
        """Run every chunk through `layer` as it is now, calling taps[m](input) before each tapped module;
        the layer's forward ends at `stop`'s input (its outputs are not needed)."""
        def tap(fn, is_stop):
            def hook(_m, args):
                fn(args[0].detach())
                if is_stop:
                    raise _StopLayer
            return hook

        hooks = [m.register_forward_pre_hook(tap(fn, m is stop)) for m, fn in taps.items()]
        try:
            for c in self.chunks:
                try:
                    layer(c.rope, c.hidden, c.residual, c.meta)
                except _StopLayer:
                    pass
        finally:
            for h in hooks:
                h.remove()

    @torch.no_grad()
    def advance(self, layer: nn.Module) -> None:
        """Replace the stored hidden states by `layer`'s outputs: the inputs of the next layer."""
        for c in self.chunks:
            c.hidden, c.residual = layer(c.rope, c.hidden, c.residual, c.meta)

    def close(self) -> None:
        """Give the attention layers back the cache (and backend) they had before the walk."""
        for a, (k, v, ks, vs, backend) in zip(self.model.attention_layers(), self._saved):
            a.k_cache, a.v_cache, a.k_scale, a.v_scale, a.backend = k, v, ks, vs, backend
        self.chunks = []
