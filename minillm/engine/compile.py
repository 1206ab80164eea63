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

What keeps that sound: duck sizing is off (Dynamo would otherwise guard that two sizes that
happened to be equal at compile time, say a batch of 3 and a 3-block table, stay equal --
a relation the shape class cannot see), and every AUDIT_EVERY-th call of a seen class runs
the full guards anyway: if that compiles a new graph, the classes missed a distinction, so
skipping stops for this function with a warning. (Dynamo itself refuses to compile under
the skipping stance; that refusal, raised before the graph runs, stops the skipping too.)
MINILLM_COMPILE_GUARDS=always turns the skipping off.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
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


AUDIT_EVERY = 256  # a seen class's guards still run in full once per this many calls


def graphs_compiled() -> int:
    """How many graphs Dynamo has compiled in this process (its own counter)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def wrapper_options(cpu: bool) -> dict[str, Any]:
    """Inductor's wrapper -- the code that calls a graph's kernels in order -- as C++ on the CPU.

    A CPU decode step has no CUDA graph to replay, so the wrapper runs every step: in Python
    it costs ~1 ms of a ~9 ms Q4 decode step of the default model on a 2-core EPYC (several
    hundred kernel and op calls, each with its size and alignment asserts). As C++ with the
    asserts off the step took 17% less in the same process (paired, 5 repeats); the price is
    compile time, ~2x from a cold cache (the wrapper is one more C++ file per graph).
    MINILLM_COMPILE_WRAPPER=python keeps the Python wrapper."""
    if not cpu or os.environ.get("MINILLM_COMPILE_WRAPPER", "cpp") == "python":
        return {}
    return {"cpp_wrapper": True, "size_asserts": False, "alignment_asserts": False}


def frozen_compile(fn: Callable, skip_seen_guards: bool | None = None, cpu_wrapper: bool = False) -> Callable:
    """torch.compile with inductor freezing: weights become constants, so inductor can
    pre-pack them for oneDNN (the fast matrix-vector path on CPU), and max_autotune
    picks among the candidates. Freezing is read when a graph is compiled -- lazily,
    at a call -- so every call runs under the patched config (passing it through
    torch.compile's `options` did not take effect here).

    skip_seen_guards (default: on unless MINILLM_COMPILE_GUARDS=always): guards run in
    full only on the first call of each `shape_class` of the arguments (module docstring).
    cpu_wrapper: the graph runs on the CPU, so its wrapper is C++ (`wrapper_options`)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as shape_config

    if skip_seen_guards is None:
        skip_seen_guards = os.environ.get("MINILLM_COMPILE_GUARDS", "seen") != "always"
    compiled = torch.compile(fn, dynamic=True)
    seen: set[Hashable] = set()
    state = {"skip": skip_seen_guards, "calls": 0}
    # max_autotune still picks each GEMM's kernel, but prints no AUTOTUNE table or choice stats per GEMM
    quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    inductor_options = dict(freezing=True, max_autotune=True, **quiet, **wrapper_options(cpu_wrapper))

    def call(*args, **kwargs):
        key = shape_class((args, kwargs)) if state["skip"] else None
        state["calls"] += 1
        if key in seen and state["calls"] % AUDIT_EVERY:
            # no config patches here: they are read only when a graph compiles, and nothing compiles
            # under this stance (Dynamo refuses, raising before the graph runs)
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return compiled(*args, **kwargs)
            except RuntimeError as e:
                if "skip_guard_eval_unsafe" not in str(e):
                    raise
                stop_skipping()
        # specialize_float: module floats (RMSNorm eps) become constants checked by a C++ guard,
        # not ~120 Python lambda guards evaluated before every step
        with inductor_config.patch(**inductor_options), \
                dynamo_config.patch(specialize_float=True), shape_config.patch(use_duck_shape=False):
            before = graphs_compiled()
            out = compiled(*args, **kwargs)
            if key in seen and graphs_compiled() > before:  # an audit call needed a new graph
                stop_skipping()
            elif key is not None and state["skip"]:
                seen.add(key)
            return out

    def stop_skipping() -> None:
        state["skip"] = False
        seen.clear()
        warnings.warn("minillm: a compiled decode step needed a new graph for a shape class it had already "
                      "seen; its guards now run on every step", RuntimeWarning, stacklevel=3)

    call.shape_classes_seen = seen  # type: ignore[attr-defined]
    return call


def mark_pool_static(tensors: list[torch.Tensor]) -> None:
    """The KV pool never changes shape: static sizes, so no per-layer duck-sizing guards."""
    for t in tensors:
        torch._dynamo.mark_static(t)
