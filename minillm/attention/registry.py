"""Attention backends by name: `EngineConfig(attention_backend="torch" | "triton")`."""
from __future__ import annotations

from minillm.attention.base import AttentionBackend


def make_attention_backend(name: str) -> AttentionBackend:
    # imported on demand: the Triton backend pulls in triton (and its interpreter switch)
    if name == "torch":
        from minillm.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from minillm.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention_backend {name!r} (choose 'torch' or 'triton')")
