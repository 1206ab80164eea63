"""Ranks 1..N-1: load the model, keep one shard (or one pipeline stage), own a paged KV pool, run every step.

Started by the executor (executor.py) with "fork" where that is safe, else "spawn"
(see `worker_start_method` there). Each worker gets rank 0's EngineConfig -- the
model to load, its dtype, the KV cache settings, the attention backend -- plus its
rank, the process group's port, its device and the mode. Startup problems go back
through a queue as text, so the front end can show the worker's traceback.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minillm.engine.config import EngineConfig

# A worker waits for rank 0's next step for as long as the front end idles (a notebook
# may sit for hours), so its own timeout is long; rank 0's short timeout catches hangs.
# If rank 0 dies, its sockets close and the worker's wait fails at once.
WORKER_TIMEOUT_S = 7 * 24 * 3600.0

TENSOR, PIPELINE = "tensor", "pipeline"  # every layer split over the ranks / the layers split into stages


@dataclass
class WorkerArgs:
    rank: int
    port: int
    device: str  # e.g. "cpu" or "cuda:1"
    mode: str  # TENSOR or PIPELINE
    num_threads: int  # torch intra-op threads of this process
    config: EngineConfig  # rank 0's: the same model, dtype, KV cache and attention backend everywhere


def shard_for(mode: str):
    """The function that turns a loaded full model into rank r's part, in place: f(model, rank, size)."""
    if mode == TENSOR:
        from minillm.parallel.shard import shard_model

        return shard_model
    if mode == PIPELINE:
        from minillm.parallel.pipeline import shard_pipeline

        return shard_pipeline
    raise ValueError(f"unknown parallel mode {mode!r}")


def run_step(mode: str, runner, batch):
    """One step on this rank: a tensor-parallel shard runs the ordinary forward (its collectives line
    the ranks up), a pipeline stage receives, runs its layers and passes on."""
    if mode == TENSOR:
        return runner.execute(batch)
    from minillm.parallel.pipeline import forward_pipeline

    return forward_pipeline(runner, batch)


def serve_steps(mode: str, model, config: EngineConfig, device: torch.device) -> None:
    """A worker rank inside the process group: own a KV pool of rank 0's block count, then run every
    step rank 0 broadcasts until it broadcasts None (shutdown). Shared by the local workers and the
    ranks torchrun starts (torchrun.py)."""
    from minillm.engine.kv_cache import plan_kv_cache
    from minillm.engine.model_runner import ModelRunner

    box = [None]
    dist.broadcast_object_list(box, src=0)  # rank 0's block count: every pool must match
    plan = plan_kv_cache(model, config.replace(num_kv_blocks=box[0]), device)
    runner = ModelRunner(model, config, plan)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:  # shutdown
            break
        run_step(mode, runner, box[0])


def dump_stacks_on_sigusr1() -> None:
    """Rank 0 sends SIGUSR1 when this worker is stuck (e.g. never loads): print where every thread is.

    To the process's real stderr (fd 2): sys.stderr may be a stand-in without a file descriptor
    (pytest's capture, a notebook kernel's stream), which faulthandler cannot write to.
    """
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or 2, all_threads=True)
    except (AttributeError, ValueError, OSError):  # no usable stderr: no dumps, the worker still runs
        pass


def worker_main(args: WorkerArgs, status) -> None:
    """Entry point of a worker process. `status` is a multiprocessing queue back to rank 0."""
    dump_stacks_on_sigusr1()
    try:
        from minillm.loader import load_model
        from minillm.parallel.group import init_group

        config = args.config
        torch.set_num_threads(args.num_threads)
        device = torch.device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        loaded = load_model(config.model, dtype=config.torch_dtype, device=device)
        model = shard_for(args.mode)(loaded.model.eval(), args.rank, config.world_size)
        del loaded
        status.put((args.rank, "loaded", os.getpid()))
        init_group(args.rank, config.world_size, args.port, device, WORKER_TIMEOUT_S)
        serve_steps(args.mode, model, config, device)
    except BaseException:
        status.put((args.rank, "error", traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
