"""torch.compile for decode steps on CPU and GPU: inductor freezing, floats specialised.

Decode steps are many small ops (~1,500 per step at batch 1); compiling fuses
them. Prefill chunks stay eager: they are few, large and shape-diverse.
"""
from __future__ import annotations

import torch


def frozen_compile(fn):
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
        # max_autotune still picks each GEMM's kernel, but prints no AUTOTUNE table or choice stats per GEMM
        quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
        with inductor_config.patch(freezing=True, max_autotune=True, **quiet), \
                dynamo_config.patch(specialize_float=True):
            return compiled(*args, **kwargs)

    return call


def mark_pool_static(tensors: list[torch.Tensor]) -> None:
    """The KV pool never changes shape: static sizes, so no per-layer duck-sizing guards."""
    for t in tensors:
        torch._dynamo.mark_static(t)
