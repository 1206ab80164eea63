"""Attention backends by name: `EngineConfig(attention_backend="torch" | "triton" | "tiled")`."""
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
    if name == "tiled":  # the online softmax tile by tile in PyTorch (slow; for reading and exercise 04)
        from minillm.attention.tiled_backend import TiledAttentionBackend

        return TiledAttentionBackend()
    raise ValueError(f"unknown attention_backend {name!r} (choose 'torch', 'triton' or 'tiled')")
