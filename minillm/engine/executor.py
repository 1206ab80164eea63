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
from typing import TYPE_CHECKING

import torch

from minillm.engine.batch import StepBatch
from minillm.engine.kv_cache import KVCachePlan

if TYPE_CHECKING:
    from minillm.models.moe import RoutedTokens
    from minillm.parallel.comm import CommStats


class Executor(ABC):
    plan: KVCachePlan  # the KV pool every rank holds (same number of blocks everywhere)
    device: torch.device  # where rank 0's tensors live (sampling, proposers)

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
        """Drop this process's references to the KV pool's tensors, and to what was built over them (the
        CPU decode step), so that a new engine over the same model can allocate its pool first; the executor
        cannot run a step afterwards. This default covers ModelRunner (its `decode_step` and `pool`); an
        executor that holds no pool in this process has nothing to drop."""
        if getattr(self, "decode_step", None) is not None:
            self.decode_step = None  # it holds the pool's tensors too
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.release()

    def close(self) -> None:
        """Release processes and process groups, if any; safe to call twice."""
