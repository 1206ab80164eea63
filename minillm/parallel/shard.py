"""Which rank holds what, and shard_model(): turn a loaded model into one rank's shard in place.

Megatron-style split of each decoder layer over N ranks:

    qkv_proj      column-parallel: rank r keeps the rows of its query heads and of its KV heads
    o_proj        row-parallel: the input columns of rank r's query heads; all-reduce after
    gate_up_proj  column-parallel: rows [r*I/N, (r+1)*I/N) of gate and the same rows of up
    down_proj     row-parallel: the matching input columns; all-reduce after
    embedding     vocab-parallel rows; all-reduce after
    lm_head       vocab-parallel rows; all-gather of the logits

Query head h attends with KV head h // (H / KV), so giving each rank a
contiguous run of query heads gives it a contiguous run of KV heads. With more
ranks than KV heads, each KV head is replicated on N / KV ranks.

A mixture-of-experts layer (models/moe.py) is split by *experts* instead (expert
parallelism): rank r keeps experts [r*E/N, (r+1)*E/N) whole, the router on every
rank, and a Qwen2-MoE shared expert column/row-split like a dense MLP. Every rank
routes all T tokens, runs its own experts on the tokens sent to them, and one
all-reduce sums the partial outputs (shared expert's share included).

Why all-gather + all-reduce rather than an all-to-all dispatch: after attention's
o_proj all-reduce, every rank already holds all T tokens' hidden states, so the
"all-gather of tokens" costs nothing here, and the combine is one all-reduce of
T x H -- the same bytes as a dense MLP's down_proj all-reduce, and exact (the sum
of the same partial products, in another order). An all-to-all pays off where ranks
hold *different* tokens (data-parallel attention): each rank sends its T/N tokens'
k copies to the experts' ranks and receives the results back, 2 k T/N x H per rank
(of which (N-1)/N leaves the rank), against T x H to all-gather the tokens plus
T x H to combine them -- less whenever k < N, at the price of uneven message sizes
and a host round-trip to size them. minillm's ranks all serve the same batch (one
scheduler on rank 0, attention split by heads), so the gather is free and one
all-reduce is all the MoE layer adds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from minillm.config import ModelConfig
from minillm.models.moe import SparseMoeBlock
from minillm.parallel import comm
from minillm.parallel.layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


@dataclass(frozen=True)
class RankShard:
    """What rank `rank` of `size` holds (half-open index ranges into the full model)."""

    rank: int
    size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    kv_replicas: int  # ranks holding each KV head (1 = split, > 1 = replicated)
    mlp_cols: tuple[int, int]  # rows of gate and of up; input columns of down_proj
    vocab_rows: tuple[int, int]  # real rows; the shard is padded to vocab_rows_padded
    vocab_rows_padded: int


def check_tp_size(cfg: ModelConfig, size: int) -> None:
    """ValueError if the model's heads / MLP cannot be split evenly over `size` ranks."""
    h, kv, i = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    if h % size:
        raise ValueError(f"tensor_parallel_size={size} must divide the {h} query heads")
    if (size <= kv and kv % size) or (size > kv and size % kv):
        raise ValueError(
            f"tensor_parallel_size={size} must divide the {kv} KV heads or be a multiple of them (replication)"
        )
    dense = not cfg.is_moe or any(not cfg.is_moe_layer(layer) for layer in range(cfg.num_hidden_layers))
    if dense and i % size:
        raise ValueError(f"tensor_parallel_size={size} must divide intermediate_size={i}")
    if cfg.is_moe and cfg.num_experts % size:
        raise ValueError(f"tensor_parallel_size={size} must divide the {cfg.num_experts} experts "
                         "(each rank keeps an equal share of them)")
    if cfg.shared_expert_intermediate_size % size:
        raise ValueError(f"tensor_parallel_size={size} must divide "
                         f"shared_expert_intermediate_size={cfg.shared_expert_intermediate_size}")


def rank_shard(cfg: ModelConfig, rank: int, size: int) -> RankShard:
    check_tp_size(cfg, size)
    h, kv, i, v = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size
    hq = h // size
    if size <= kv:
        nkv, replicas = kv // size, 1
        kv0 = rank * nkv
    else:
        nkv, replicas = 1, size // kv
        kv0 = rank // replicas
    per = -(-v // size)  # ceil: equal slices for the all-gather
    return RankShard(
        rank, size, (rank * hq, (rank + 1) * hq), (kv0, kv0 + nkv), replicas,
        (rank * i // size, (rank + 1) * i // size), (min(rank * per, v), min((rank + 1) * per, v)), per,
    )


def qkv_rows(cfg: ModelConfig, s: RankShard) -> torch.Tensor:
    """Row indices of the fused [q; k; v] weight that rank s keeps, in q, k, v order."""
    d, q_size, kv_size = cfg.head_dim, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    q = torch.arange(s.q_heads[0] * d, s.q_heads[1] * d)
    k = torch.arange(s.kv_heads[0] * d, s.kv_heads[1] * d) + q_size
    return torch.cat((q, k, k + kv_size))


def gate_up_rows(cfg: ModelConfig, s: RankShard) -> torch.Tensor:
    cols = torch.arange(*s.mlp_cols)
    return torch.cat((cols, cols + cfg.intermediate_size))


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    lin.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias.contiguous(), requires_grad=False)
    return lin


def _row_parallel(full: nn.Linear, cols: torch.Tensor, rank: int) -> RowParallelLinear:
    w = full.weight
    with torch.device("meta"):  # no throwaway init; the parameters are replaced below
        lin = RowParallelLinear(len(cols), w.shape[0], full.bias is not None, rank)
    lin.weight = nn.Parameter(w[:, cols].contiguous(), requires_grad=False)
    if full.bias is not None:
        lin.bias = nn.Parameter(full.bias.detach().clone(), requires_grad=False)
    return lin


def _vocab_rows(w: torch.Tensor, s: RankShard) -> torch.Tensor:
    rows = w[s.vocab_rows[0] : s.vocab_rows[1]]
    pad = s.vocab_rows_padded - rows.shape[0]
    if pad:
        rows = torch.cat((rows, rows.new_zeros(pad, rows.shape[1])))
    return rows.contiguous()


def expert_range(cfg: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    """The experts rank `rank` of `size` keeps (the same in every MoE layer)."""
    per = cfg.num_experts // size
    return rank * per, (rank + 1) * per


@torch.no_grad()
def shard_experts(block: SparseMoeBlock, cfg: ModelConfig, rank: int, size: int) -> None:
    """Keep this rank's experts (whole) and its columns of the shared expert; the router stays whole."""
    lo, hi = expert_range(cfg, rank, size)
    ex = block.experts
    ex.gate_up_proj = nn.Parameter(ex.gate_up_proj[lo:hi].clone(), requires_grad=False)
    ex.down_proj = nn.Parameter(ex.down_proj[lo:hi].clone(), requires_grad=False)
    block.expert_range = (lo, hi)
    shared = block.shared_expert
    if shared is not None:  # Megatron split; no all-reduce of its own: the block's one reduce sums it
        width = cfg.shared_expert_intermediate_size
        cols = torch.arange(rank * width // size, (rank + 1) * width // size, device=shared.down_proj.weight.device)
        shared.gate_up_proj = _linear(shared.gate_up_proj.weight[torch.cat((cols, cols + width))], None)
        shared.down_proj = _linear(shared.down_proj.weight[:, cols], None)
    block.reduce = comm.all_reduce


@torch.no_grad()
def shard_model(model: nn.Module, rank: int, size: int) -> nn.Module:
    """Replace the full weights of a loaded LlamaForCausalLM by rank `rank`'s shard, in place.

    Afterwards model.config describes this rank's attention (its query / KV head
    counts: what its paged KV pool must hold) and model.full_config the whole model.
    """
    cfg: ModelConfig = model.config
    s = rank_shard(cfg, rank, size)
    d = cfg.head_dim
    qkv_idx, gu_idx = qkv_rows(cfg, s), gate_up_rows(cfg, s)
    q_cols = torch.arange(s.q_heads[0] * d, s.q_heads[1] * d)
    mlp_cols = torch.arange(*s.mlp_cols)
    for layer in model.layers:
        a = layer.self_attn
        dev = a.qkv_proj.weight.device
        a.qkv_proj = _linear(a.qkv_proj.weight[qkv_idx.to(dev)],
                             None if a.qkv_proj.bias is None else a.qkv_proj.bias[qkv_idx.to(dev)])
        a.o_proj = _row_parallel(a.o_proj, q_cols.to(dev), rank)
        a.num_heads, a.num_kv_heads = s.q_heads[1] - s.q_heads[0], s.kv_heads[1] - s.kv_heads[0]
        a.q_size, a.kv_size = a.num_heads * d, a.num_kv_heads * d
        m = layer.mlp
        if isinstance(m, SparseMoeBlock):
            shard_experts(m, cfg, rank, size)
            continue
        m.gate_up_proj = _linear(m.gate_up_proj.weight[gu_idx.to(dev)], None)
        m.down_proj = _row_parallel(m.down_proj, mlp_cols.to(dev), rank)
    emb = model.embed_tokens.weight
    scale = getattr(model.embed_tokens, "embed_scale", None)  # Gemma: sqrt(hidden), kept (a plain copy)
    scale = None if scale is None else scale.detach().clone()
    with torch.device("meta"):
        embed = VocabParallelEmbedding(s.vocab_rows_padded, cfg.hidden_size, s.vocab_rows[0], cfg.vocab_size,
                                       embed_scale=scale)
        head = ParallelLMHead(cfg.hidden_size, s.vocab_rows_padded, cfg.vocab_size)
    embed.weight = nn.Parameter(_vocab_rows(emb, s), requires_grad=False)
    if cfg.tie_word_embeddings:
        head.weight = embed.weight
    else:
        head.weight = nn.Parameter(_vocab_rows(model.lm_head.weight, s), requires_grad=False)
    model.embed_tokens, model.lm_head = embed, head
    model.full_config = cfg
    model.config = dataclasses.replace(
        cfg, num_attention_heads=s.q_heads[1] - s.q_heads[0], num_key_value_heads=s.kv_heads[1] - s.kv_heads[0],
    )
    model.tp_shard = s
    return model
