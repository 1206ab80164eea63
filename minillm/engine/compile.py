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
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch

from minillm import envs


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
    if not cpu or not envs.compile_cpp_wrapper():
        return {}
    return {"cpp_wrapper": True, "size_asserts": False, "alignment_asserts": False}


def private_code(fn: Callable) -> Callable:
    """`fn` (a function or a bound method) over its own copy of its code object.

    Dynamo keeps its compiled graphs on the code object, so every model of one class shares one cache:
    `LlamaForCausalLM.forward`'s. With freezing each model needs graphs of its own (its weights are their
    constants), and the entries of models long gone stay there and count against Dynamo's recompile
    limit (8): the ninth compiled engine of a process fell back to eager without a word (a notebook or
    a test worker reaches that). Over a private code object the cache lives and dies with the engine,
    and with it the graphs' copies of the weights."""
    func = getattr(fn, "__func__", fn)
    if not isinstance(func, types.FunctionType):
        return fn
    copy = types.FunctionType(func.__code__.replace(), func.__globals__, func.__name__, func.__defaults__,
                              func.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = func.__kwdefaults__, func.__qualname__
    return types.MethodType(copy, fn.__self__) if fn is not func else copy  # fn was a bound method


def frozen_compile(fn: Callable, skip_seen_guards: bool | None = None, cpu_wrapper: bool = False,
                   on_new_constants: Callable[[list[torch.Tensor]], Any] | None = None,
                   options: dict[str, Any] | None = None) -> Callable:
    """torch.compile with inductor freezing: weights become constants, so inductor can
    pre-pack them for oneDNN (the fast matrix-vector path on CPU), and max_autotune
    picks among the candidates. Freezing is read when a graph is compiled -- lazily,
    at a call -- so every call runs under the patched config (passing it through
    torch.compile's `options` did not take effect here).

    skip_seen_guards (default: on unless MINILLM_COMPILE_GUARDS=always): guards run in
    full only on the first call of each `shape_class` of the arguments (module docstring).
    cpu_wrapper: the graph runs on the CPU, so its wrapper is C++ (`wrapper_options`).
    on_new_constants: called with each new graph's frozen weights (inductor packs its own copies; the
    generated module's globals), e.g. a fast path's move to 2 MB pages; its results are kept in
    `call.constants_reports`. options: more inductor options (a fast path's, FastPath.compile_options)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as shape_config

    if skip_seen_guards is None:
        skip_seen_guards = envs.compile_skip_seen_guards()
    target = private_code(fn)
    compiled = torch.compile(target, dynamic=True)
    seen: set[Hashable] = set()
    modules: list = []  # the generated code modules of this function's graphs (`release_graphs`)
    state = {"skip": skip_seen_guards, "calls": 0}
    reports: list = []  # not call.constants_reports inside call: a closure over itself would outlive `del call`
    # max_autotune still picks each GEMM's kernel, but prints no AUTOTUNE table or choice stats per GEMM
    quiet = {"autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}
    inductor_options = dict(freezing=True, max_autotune=True, **quiet, **wrapper_options(cpu_wrapper))
    if inductor_options.get("cpp_wrapper"):
        inductor_options.update(options or {})

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
            before, loaded = graphs_compiled(), len(code_modules())
            out = compiled(*args, **kwargs)
            new = code_modules()[loaded:]
            modules.extend(new)
            if on_new_constants is not None and new:  # the frozen graph's own packed weights
                reports.append(on_new_constants(
                    [v for m in new for v in vars(m).values() if isinstance(v, torch.Tensor)]))
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
    call.constants_reports = reports  # type: ignore[attr-defined]  # one per graph compiled (on_new_constants)
    if target is not fn:
        release = weakref.finalize(call, release_graphs, getattr(target, "__func__", target).__code__, modules)
        release.atexit = False  # at exit the process's memory goes anyway
    return call


def code_modules() -> list:
    """Inductor's list of the Python modules it generated in this process (graphs' wrappers), oldest first."""
    from torch._inductor.codecache import PyCodeCache
    return PyCodeCache.modules


def release_graphs(code: types.CodeType, modules: list) -> None:
    """Free a gone engine's compiled graphs and their frozen weights: runs when its compiled step is
    collected. Two holders outlive it otherwise. Dynamo's cache entries on the private code object form a
    cycle through C++ objects that the garbage collector cannot see; `reset_code` clears them. Inductor
    keeps every module it generated -- the frozen weights are their globals -- in its own list and in
    sys.modules. (Measured: a tiny model's weights stayed alive after its compiled engine was deleted.)"""
    from torch._C._dynamo.eval_frame import reset_code
    reset_code(code)
    mine = {id(m) for m in modules}
    code_modules()[:] = [m for m in code_modules() if id(m) not in mine]
    for m in modules:
        if sys.modules.get(m.__name__) is m:
            del sys.modules[m.__name__]
    modules.clear()


def mark_pool_static(tensors: list[torch.Tensor]) -> None:
    """The KV pool never changes shape: static sizes, so no per-layer duck-sizing guards."""
    for t in tensors:
        torch._dynamo.mark_static(t)
