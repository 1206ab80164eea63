"""The fast-path interface: how an optional accelerator plugs into the plain engine.

The core (engine/, models/, attention/, sampler) is plain PyTorch: it is the code a
learner reads, and with `EngineConfig(fast_path="off")` it is all that runs. A fast
path is an optional package that speeds some of it up on some hardware. The core
declares what a fast path may do, at these points, and names no fast path itself:

    why_not(model, config, device)    None if it applies here, else the reason in words
    prepare(model, config, device)    before the KV pool exists: weight layouts, module swaps;
                                      returns its start-up choices (recorded in `report`)
    attention_backend(name)           a replacement for the named backend (a subclass), or None
    step_runner(model, pool, config)  a StepRunner that runs whole steps in one call, or None
    greedy(logits)                    the argmax of the sampler's rows (the same first maximum)
    compile_options()                 more inductor options for a compiled step (compile=True)
    gguf_dequantizer(block_bytes)     a faster GGUF dequantizer for a file this size (the loader)
    on_compiled_weights(tensors)      the constants of each new compiled graph (compile=True)

Fast paths are found by the `minillm.fast_paths` entry point group (pyproject.toml),
as vLLM finds its platform plugins: the CPU fast path is `minillm.cpu`.
"""
from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from minillm.attention.base import AttentionBackend
    from minillm.engine.batch import StepBatch
    from minillm.engine.config import EngineConfig
    from minillm.engine.kv_cache import KVCachePool

ENTRY_POINT_GROUP = "minillm.fast_paths"

# the path that ran a step, as the trace records it (StepTrace.path)
PLAIN, COMPILED, CUDA_GRAPH = "plain", "compiled graph", "CUDA graph"


class FastPathUnavailable(RuntimeError):
    """fast_path="require", but no fast path can run here (the message says why)."""


class StepRunner(ABC):
    """Runs a whole step (every layer) in place of the model's forward, for the batches it fits."""

    name: str  # what the trace records as the step's path

    @abstractmethod
    def fits(self, batch: "StepBatch") -> bool:
        """Whether this step can run here (else the model's forward runs it)."""

    @abstractmethod
    def run(self, batch: "StepBatch") -> torch.Tensor:
        """The step's final hidden states [len(batch.token_ids), hidden], K/V written to the pool."""


class FastPath(ABC):
    name: str

    @abstractmethod
    def why_not(self, model: torch.nn.Module, config: "EngineConfig", device: torch.device) -> str | None:
        """None where this fast path applies to this model on this device, else why not."""

    def prepare(self, model: torch.nn.Module, config: "EngineConfig", device: torch.device) -> dict[str, Any]:
        """Change the model in place for speed (same outputs); return the start-up choices made."""
        return {}

    def attention_backend(self, name: str) -> "AttentionBackend | None":
        return None

    def step_runner(self, model: torch.nn.Module, pool: "KVCachePool", config: "EngineConfig",
                    graphs: bool) -> StepRunner | None:
        return None

    def compile_options(self) -> dict[str, Any]:
        return {}

    def greedy(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The first maximum of each row (torch's rule), or None where this fast path does not take them."""
        return None

    def gguf_dequantizer(self, block_bytes: int) -> Callable | None:
        """A faster (raw bytes, GGML type, rows, cols) -> float32 tensor for a GGUF file with this many
        quantized bytes, or None (gguf-py's numpy then dequantizes, as the plain path does)."""
        return None

    def on_compiled_weights(self, tensors: list[torch.Tensor]) -> Any:
        """Called with the constants of each new compiled graph (compile=True); returns a report or None."""
        return None


@dataclass
class FastPathReport:
    """Which fast path this engine runs and what it chose at start-up (Executor.fast_path_report; the bench JSON)."""

    mode: str
    name: str | None = None  # None: the plain path only
    why_not: str | None = None  # why no fast path runs, where none does
    choices: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def installed_fast_paths() -> list[FastPath]:
    """Every fast path the installed packages declare, in name order."""
    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            found.append(ep.load()())
        except Exception as e:  # a broken plug-in must not stop the plain engine
            warnings.warn(f"minillm: fast path {ep.name!r} could not be loaded ({type(e).__name__}: {e}); "
                          "the plain path runs", RuntimeWarning, stacklevel=2)
    return found


def choose_fast_path(model: torch.nn.Module, config: "EngineConfig",
                     device: torch.device) -> tuple[FastPath | None, FastPathReport]:
    """The fast path this engine uses, or None: the first installed one that applies (mode "auto"),
    none at all ("off"), or the first that applies else FastPathUnavailable ("require")."""
    mode = config.fast_path
    if mode == "off":
        return None, FastPathReport(mode, why_not='fast_path="off"')
    reasons = []
    for fp in installed_fast_paths():
        why = fp.why_not(model, config, device)
        if why is None:
            return fp, FastPathReport(mode, fp.name)
        reasons.append(f"{fp.name}: {why}")
    why_not = "; ".join(reasons) or f"no fast path is installed (entry point group {ENTRY_POINT_GROUP!r})"
    if mode == "require":
        raise FastPathUnavailable(f'fast_path="require", but no fast path can run this engine: {why_not}')
    return None, FastPathReport(mode, why_not=why_not)


def fast_dequantizer(mode: str, block_bytes: int) -> Callable | None:
    """The first installed fast path's GGUF dequantizer for a file with this many quantized bytes, or None
    (mode "off": always None; the loader runs before the engine, so it asks by mode)."""
    if mode == "off":
        return None
    for fp in installed_fast_paths():
        dequantize = fp.gguf_dequantizer(block_bytes)
        if dequantize is not None:
            return dequantize
    return None
