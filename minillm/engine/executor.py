"""The Executor interface: what the engine calls to run one packed step on the model.

    logits = executor.execute(batch)   # StepBatch -> [len(batch.logit_rows), vocab] float32, or None

Three implementations, one contract:

    ModelRunner                 (engine/model_runner.py)  this process's model and KV pool
    TensorParallelExecutor      (parallel/executor.py)    every layer split over N processes
    PipelineParallelExecutor    (parallel/executor.py)    the layers split into N stages

Sampling and verification happen after `execute`, on rank 0 (engine/sampler.py), so a
parallel executor only returns the logits rows the batch asked for.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

import torch

from minillm.engine.batch import StepBatch
from minillm.engine.fast_path import PLAIN, FastPathReport
from minillm.engine.kv_cache import KVCachePlan

if TYPE_CHECKING:
    from minillm.models.moe import RoutedTokens
    from minillm.parallel.comm import CommStats


class Executor(ABC):
    plan: KVCachePlan  # the KV pool every rank holds (same number of blocks everywhere)
    device: torch.device  # where rank 0's tensors live (sampling, proposers)
    # which path ran the last step (engine/fast_path.py: "plain", "compiled graph", "CUDA graph", or a
    # fast path's step runner), and which fast path this executor runs: the trace and the bench read them
    last_path: str = PLAIN
    fast_argmax: Callable[[torch.Tensor], torch.Tensor | None] | None = None  # a fast path's greedy (FastPath.greedy)
    fast_path_report: FastPathReport = FastPathReport("off", why_not="this executor runs no fast path")
    # What the proposers read and set (spec_decode/). An executor that cannot serve them leaves the defaults.
    last_hidden: torch.Tensor | None = None  # final hidden states of the last step's logit rows
    keep_all_hidden: bool = False  # EAGLE: also keep every row's final hidden state ...
    last_all_hidden: torch.Tensor | None = None  # ... here
    # Medusa: given the logit rows' hidden states, more rows for the same LM-head product (or None);
    # their logits land in last_extra_logits
    logit_extras: Callable[[torch.Tensor], torch.Tensor | None] | None = None
    last_extra_logits: torch.Tensor | None = None

    @abstractmethod
    def execute(self, batch: StepBatch) -> torch.Tensor | None:
        """Write the batch's K/V into the pool, run the model, return logits of batch.logit_rows."""

    @property
    @abstractmethod
    def kv_cache_bytes(self) -> int:
        """Bytes of rank 0's KV pool (K, V and, when quantized, their scales)."""

    def move_kv(self, moves: list[tuple[int, int]]) -> None:
        """Copy each (src slot, dst slot) of every layer's pool, in order (a tree's accepted path)."""
        raise NotImplementedError(f"{type(self).__name__} cannot move K/V between slots; "
                                  "tree verification runs on one process")

    def attach(self) -> None:
        """Point the model's attention layers at this executor's pool (a model may serve several engines)."""

    def take_comm_stats(self) -> "CommStats | None":
        """Collective bytes and time since the last call (one step's worth); None for one process."""
        return None

    def take_routed_tokens(self) -> "RoutedTokens | None":
        """A mixture-of-experts model's tokens per expert per layer since the last call; None for a dense one."""
        return None

    def release_kv_cache(self) -> None:
        """Drop this process's references to the KV pool's tensors (and to what was built over them), so
        that a new engine over the same model can allocate its pool first; the executor cannot run a step
        afterwards. An executor that holds no pool in this process has nothing to drop."""

    def close(self) -> None:
        """Release processes and process groups, if any; safe to call twice."""
