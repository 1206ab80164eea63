"""torch.compile for decode steps on CPU and GPU: inductor freezing, floats specialised,
and the guards evaluated once per shape class rather than before every step.

Decode steps are many small ops (~1,500 per step at batch 1); compiling fuses
them. Prefill chunks stay eager: they are few, large and shape-diverse.

Why skip guards: before every call Dynamo checks ~2,700 guards on the model's modules
(types, ids, lengths of the layer lists) and on the step's inputs. On a 2-core CPU that
is ~1 ms of a ~10 ms Q4 decode step (measured: `TorchDynamo Cache Lookup` in the
profiler). The modules never change under a running engine; only the inputs' shapes do,
and Dynamo tells those apart only as 0, 1 or "2 or more" per dimension (its 0/1
specialisation; sizes are otherwise symbolic with dynamic=True). So the first step of
each such shape class runs with every guard -- compiling if needed -- and later steps of
a class already seen run with `skip_guard_eval_unsafe`, which still evaluates the guards
that tell the cached graphs apart (vLLM skips guards altogether after its warm-up).
MINILLM_COMPILE_GUARDS=always turns the skipping off.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Hashable
from typing import Any

import torch


def shape_class(value: Any) -> Hashable:
    """What Dynamo's guards can tell apart in a step's inputs, as a hashable key: tensors by
    dtype, device and each size as 0, 1 or 2+; ints likewise (symbolic, 0/1-specialised);
    floats, bools and strings by value (floats are specialised); containers and
    dataclasses element by element. Conservative: a key that is new where the guards
    would have passed only costs one step with full guards."""
    if isinstance(value, torch.Tensor):
        return ("T", value.dtype, value.device.type, value.requires_grad, value.is_contiguous(),
                tuple(min(s, 2) for s in value.shape))
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return value
    if isinstance(value, int):
        return ("i", min(value, 2))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(shape_class(v) for v in value))
    if isinstance(value, dict):
        return ("d", tuple((k, shape_class(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value):
        return (type(value).__name__,) + tuple(shape_class(getattr(value, f.name))
                                               for f in dataclasses.fields(value))
    raise TypeError(f"no shape class for a compiled decode input of type {type(value).__name__}")


def frozen_compile(fn: Callable, skip_seen_guards: bool | None = None) -> Callable:
    """torch.compile with inductor freezing: weights become constants, so inductor can
    pre-pack them for oneDNN (the fast matrix-vector path on CPU), and max_autotune
    picks among the candidates. Freezing is read when a graph is compiled -- lazily,
    at a call -- so every call runs under the patched config (passing it through
    torch.compile's `options` did not take effect here).

    skip_seen_guards (default: on unless MINILLM_COMPILE_GUARDS=always): guards run in
    full only on the first call of each `shape_class` of the arguments (module docstring)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    if skip_seen_guards is None:
        skip_seen_guards = os.environ.get("MINILLM_COMPILE_GUARDS", "seen") != "always"
    compiled = torch.compile(fn, dynamic=True)
    seen: set[Hashable] = set()

    def call(*args, **kwargs):
        # specialize_float: module floats (RMSNorm eps) become constants checked by a C++ guard,
        # not ~120 Python lambda guards evaluated before every step
        # max_autotune still picks each GEMM's kernel, but prints no AUTOTUNE table or choice stats per GEMM
        quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
        key = shape_class((args, kwargs)) if skip_seen_guards else None
        with inductor_config.patch(freezing=True, max_autotune=True, **quiet), \
                dynamo_config.patch(specialize_float=True):
            if key is not None and key in seen:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return compiled(*args, **kwargs)
            out = compiled(*args, **kwargs)
            if key is not None:
                seen.add(key)
            return out

    call.shape_classes_seen = seen  # type: ignore[attr-defined]
    return call


def mark_pool_static(tensors: list[torch.Tensor]) -> None:
    """The KV pool never changes shape: static sizes, so no per-layer duck-sizing guards."""
    for t in tensors:
        torch._dynamo.mark_static(t)
