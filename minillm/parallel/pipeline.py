"""Pipeline parallelism: the layers split into N contiguous stages, one per rank.

    LLM(pipeline_parallel_size=2)    # layers 0..14 here, 15..29 in a worker process

Where tensor parallelism splits every layer and sums partial results twice per
layer, a pipeline hands the whole hidden state (and the residual) from one
stage to the next once per stage boundary: stage 0 embeds, the last stage
applies the final norm and the LM head and sends the sampled rows' logits back
to rank 0, which samples. Each rank keeps a paged KV pool for its own layers
only, so the KV cache, like the weights, is split N ways.

This is the simple form: one batch at a time, so only one stage works at any
moment (no micro-batches filling the pipeline, as GPipe / PipeDream schedules
do). It buys memory (a model too big for one device runs on N), not speed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.engine.batch import StepBatch
from minillm.parallel import comm


@dataclass(frozen=True)
class PipelineStage:
    rank: int
    size: int
    layers: tuple[int, int]  # half-open range of the full model's layer indices

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.size - 1


def check_pp_size(cfg: ModelConfig, size: int) -> None:
    if size < 1:
        raise ValueError(f"pipeline_parallel_size must be >= 1, got {size}")
    if size > cfg.num_hidden_layers:
        raise ValueError(f"pipeline_parallel_size={size} exceeds the model's {cfg.num_hidden_layers} layers")


def stage_layers(num_layers: int, size: int, rank: int) -> tuple[int, int]:
    """Contiguous, as even as possible; the first `num_layers % size` stages take one layer more."""
    per, extra = divmod(num_layers, size)
    start = rank * per + min(rank, extra)
    return start, start + per + (rank < extra)


@torch.no_grad()
def shard_pipeline(model: nn.Module, rank: int, size: int) -> nn.Module:
    """Keep only stage `rank`'s layers of a loaded LlamaForCausalLM, in place.

    The embedding and LM head stay on every stage (the first stage embeds, the
    last scores; with tied embeddings they are one tensor anyway).
    """
    cfg: ModelConfig = model.config
    check_pp_size(cfg, size)
    a, b = stage_layers(cfg.num_hidden_layers, size, rank)
    model.layers = nn.ModuleList(list(model.layers)[a:b])
    model.full_config = cfg
    model.config = dataclasses.replace(cfg, num_hidden_layers=b - a)  # what this rank's KV pool must hold
    model.pp_stage = PipelineStage(rank, size, (a, b))
    return model


@torch.inference_mode()
def forward_pipeline(runner, batch: StepBatch) -> torch.Tensor | None:
    """Every rank: receive the hidden state, run this stage's layers, pass it on; rank 0 gets the logits.

    `runner` is the rank's ModelRunner (its stage's layers and KV pool). Returns, on rank 0, the
    logits of batch.logit_rows (what ModelRunner.execute returns with one rank); None elsewhere.
    """
    runner.attach()
    model, dev, plan = runner.model, runner.device, runner.plan
    st: PipelineStage = model.pp_stage
    meta = batch.attention_metadata(plan.block_size, dev)
    # as ModelRunner.execute does: the step's shared attention state (decode slots), once for all layers
    runner.backend.prepare(meta, plan.block_size, model.config.num_key_value_heads, plan.quantized)
    rope = model.rotary.lookup(torch.tensor(batch.positions, device=dev))
    shape = (len(batch.token_ids), model.config.hidden_size)
    if st.first:
        x, residual = model.embed_tokens(torch.tensor(batch.token_ids, device=dev)), None
    else:
        x = comm.recv(shape, model.embed_tokens.weight.dtype, dev, st.rank - 1)
        residual = comm.recv(shape, x.dtype, dev, st.rank - 1)
    for layer in model.layers:
        x, residual = layer(rope, x, residual, meta)
    if not st.last:
        comm.send(x, st.rank + 1)
        comm.send(residual, st.rank + 1)
    rows = len(batch.logit_rows)
    if not rows:
        return None
    if st.last:
        x, _ = model.norm(x, residual)
        logits = model.compute_logits(x[torch.tensor(batch.logit_rows, device=dev)])
        comm.send(logits, 0)  # rank 0 samples
        return None
    if st.first:
        return comm.recv((rows, model.config.vocab_size), torch.float32, dev, st.size - 1)
    return None
