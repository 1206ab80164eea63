"""Ranks 1..N-1: load the model, keep one shard, own a paged KV pool, run every step rank 0 broadcasts.

Started by the executor with torch.multiprocessing's spawn (a fresh interpreter:
CUDA and forked BLAS thread pools do not survive fork). Startup problems go
back through a queue as text, so the front end can show the worker's traceback.
"""
from __future__ import annotations

import dataclasses
import os
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minillm.config import CacheConfig

# A worker waits for rank 0's next step for as long as the front end idles (a notebook
# may sit for hours), so its own timeout is long; rank 0's short timeout catches hangs.
# If rank 0 dies, its sockets close and the worker's wait fails at once.
WORKER_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass
class WorkerArgs:
    rank: int
    world_size: int
    port: int
    model: str | None  # what load_model() takes; None = the default model
    dtype: torch.dtype
    device: str  # e.g. "cpu" or "cuda:1"
    attention_backend: str
    cache_config: CacheConfig
    num_threads: int
    pipeline: bool = False  # a pipeline stage (pipeline.py) rather than a tensor-parallel shard


def worker_main(args: WorkerArgs, status) -> None:
    """Entry point of a worker process. `status` is a multiprocessing queue back to rank 0."""
    try:
        from minillm.engine.model_runner import ModelRunner, plan_kv_cache
        from minillm.loader import load_model
        from minillm.parallel.batch import forward_batch
        from minillm.parallel.group import init_group
        from minillm.parallel.pipeline import forward_pipeline, shard_pipeline
        from minillm.parallel.shard import shard_model

        torch.set_num_threads(args.num_threads)
        device = torch.device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        shard = shard_pipeline if args.pipeline else shard_model
        forward = forward_pipeline if args.pipeline else forward_batch
        model = shard(load_model(args.model, dtype=args.dtype, device=device).model, args.rank, args.world_size)
        status.put((args.rank, "loaded", os.getpid()))
        init_group(args.rank, args.world_size, args.port, device, WORKER_TIMEOUT_S)
        box = [None]
        dist.broadcast_object_list(box, src=0)  # rank 0's block count: every pool must match
        cache = dataclasses.replace(args.cache_config, num_blocks=box[0])
        runner = ModelRunner(model, plan_kv_cache(model, cache, device), args.attention_backend)
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0)
            if box[0] is None:  # shutdown
                break
            forward(runner, box[0])
    except BaseException:
        status.put((args.rank, "error", traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
