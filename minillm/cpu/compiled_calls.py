"""The CPU kernels as plain C functions inside a compiled graph's C++ wrapper (compile=True).

`CpuFastPath.compile_options` hands inductor the declarations below (engine/compile.frozen_compile's
`options`), read only where the wrapper is C++ (MINILLM_COMPILE_WRAPPER).
"""
from __future__ import annotations

import torch

from minillm import envs


def direct_calls() -> dict:
    """The custom ops a C++ wrapper calls as plain C functions: {op: [its C declaration]}.

    Otherwise the wrapper calls each of our ops through `aoti_torch_call_dispatcher`: the op found by
    its name, the arguments boxed into a stack and unboxed again, every call -- ~150 calls in a batch-1
    step of the default model (120 few-row products, 30 attentions). Given a declaration, inductor
    writes a direct call to `aoti_torch_cpu_<op name>`, which the kernel library exports
    (minillm/cpu/kernels/skinny_f32.cpp, paged_attention.cpp) and makes visible to the graph's library when it
    loads (gguf_cpu.share_symbols). An op is listed only where its kernel loaded and the name resolves
    in this process: a graph that named a missing function would fail to load.
    MINILLM_COMPILE_DIRECT_CALLS=0 keeps the dispatcher."""
    if not envs.compile_direct_calls():
        return {}
    import ctypes

    from minillm.cpu.kernels import paged_attention_cpu, skinny_cpu

    try:
        process = ctypes.CDLL(None)  # the symbols visible to every library (RTLD_GLOBAL)
    except (OSError, TypeError):  # no such handle on this platform (Windows): the dispatcher it is
        return {}
    calls = {}
    for namespace, kernel in (("minillm_skinny", skinny_cpu), ("minillm_attn", paged_attention_cpu)):
        op, declaration = kernel.C_FUNCTION
        function = declaration.split("(")[0].split()[-1]
        if kernel.available() and hasattr(process, function):
            calls[OpKey(getattr(getattr(torch.ops, namespace), op).default)] = [declaration]
    return calls


class OpKey:
    """A custom op as a key of `custom_ops_to_c_shims` that inductor's graph cache can pickle.

    Inductor looks the op up in that dict (`op in shims`, which this key answers like the op itself)
    and pickles its whole config into each graph's cache key; an OpOverload does not pickle, so every
    graph compiled with the plain dict bypassed the on-disk cache (measured: a tiny model's second run
    in a new process compiled again, 5.3 s, against 2.9 s from the cache). Pickled by the op's name."""

    def __init__(self, op) -> None:
        self.op = op

    def __hash__(self) -> int:
        return hash(self.op)

    def __eq__(self, other: object) -> bool:
        return other is self.op or (isinstance(other, OpKey) and other.op is self.op)

    def __reduce__(self):
        return (str, (self.op.name(),))
