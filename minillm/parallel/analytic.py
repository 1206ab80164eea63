"""An analytic model of tensor-parallel speed-up: compute split N ways, communication added.

One engine step on N GPUs takes

    t_N = max(FLOPs / N / peak, bytes / N / HBM)             each rank: 1/N of weights, heads, KV
        + collectives * 2 ceil(log2 N) * hop latency         small messages: a tree (NCCL's choice)
        + 2 (N-1)/N * all-reduce payload / link bandwidth    ring all-reduce traffic per rank
        + (N-1)/N * all-gather payload / link bandwidth      the LM head's logits

with 2 all-reduces per layer (after o_proj and down_proj) plus one after the
vocab-parallel embedding, each of tokens x hidden activations, and one
all-gather of the sampled rows' logits. Speed-up is t_1 / t_N. Norms, RoPE and
sampling (replicated on every rank) are left out; so is overlap of compute and
communication (Megatron-style TP cannot overlap these: the next matmul needs
the sum). The point it makes: decode moves few bytes per all-reduce, so it is
latency-bound; prefill moves many, so the link bandwidth decides.

Hardware figures (peak, datasheet values; achieved is lower):
- H100 SXM5: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3 (NVIDIA H100 Tensor Core GPU datasheet).
- NVLink 4 on H100 SXM: 900 GB/s total bidirectional per GPU = 450 GB/s each way
  (NVIDIA H100 datasheet / Hopper architecture whitepaper).
- PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b ~ 63 GB/s each way (PCI-SIG PCIe 5.0 spec);
  GPUs talking through the host or a PCIe switch, no NVLink.
- Per-hop latency: ~3 us over NVLink, ~10 us over PCIe: assumptions that put a small
  all-reduce on 8 GPUs at ~18 us / ~60 us, the range NCCL's small-message all-reduce times
  show in nccl-tests; not measured here.
- Memory: an H100 holds 80 GB; Llama-2-70B's BF16 weights (~138 GB) need N >= 2, so its
  N = 1 row is a hypothetical baseline (the `fits` column says so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minillm.config import ModelConfig
from minillm.engine.cost import step_cost


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # FLOP/s, dense, at the weight dtype
    hbm_bytes_per_s: float
    memory_bytes: float


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # one direction, per GPU
    hop_latency_s: float


H100_SXM = Gpu("H100 SXM5 (BF16 dense)", 989e12, 3.35e12, 80e9)
NVLINK4 = Link("NVLink 4 (H100 SXM)", 450e9, 3e-6)
PCIE5 = Link("PCIe Gen5 x16", 63e9, 10e-6)

# Llama 2 shapes from the released config.json files (7B: MHA; 70B: GQA with 8 KV heads)
LLAMA2_7B = ModelConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
LLAMA2_70B = ModelConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                         num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=4096)


@dataclass(frozen=True)
class Workload:
    """One engine step: `num_seqs` sequences, each computing `new_tokens` with `context` tokens after the step."""

    name: str
    num_seqs: int
    new_tokens: int
    context: int

    @property
    def tokens(self) -> int:
        return self.num_seqs * self.new_tokens


DECODE_1 = Workload("decode, batch 1, context 1024", 1, 1, 1024)
DECODE_64 = Workload("decode, batch 64, context 1024", 64, 1, 1024)
PREFILL_2K = Workload("prefill, 1 x 2048 tokens", 1, 2048, 2048)


def allreduce_payload_bytes(cfg: ModelConfig, tokens: int, act_bytes: int) -> int:
    """Bytes summed by one step's all-reduces: 2 per layer + the embedding, each tokens x hidden."""
    return (2 * cfg.num_hidden_layers + 1) * tokens * cfg.hidden_size * act_bytes


def allgather_payload_bytes(cfg: ModelConfig, rows: int, size: int, logit_bytes: int) -> int:
    """Bytes of the gathered logits: `rows` rows of the vocabulary padded to a multiple of `size`."""
    return rows * -(-cfg.vocab_size // size) * size * logit_bytes


@dataclass(frozen=True)
class StepEstimate:
    size: int
    compute_s: float
    comm_s: float
    allreduce_bytes: int
    allgather_bytes: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def estimate_step(cfg: ModelConfig, w: Workload, size: int, gpu: Gpu, link: Link, dtype_bytes: int = 2) -> StepEstimate:
    """Time of one step on `size` GPUs (a roofline per rank plus ring collectives)."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    cost = step_cost(cfg, [(w.new_tokens, w.context)] * w.num_seqs, w.num_seqs, dtype_bytes, dtype_bytes)
    compute = max(cost.flops / size / gpu.peak_flops, cost.bytes_moved / size / gpu.hbm_bytes_per_s)
    ar = allreduce_payload_bytes(cfg, w.tokens, dtype_bytes)
    ag = allgather_payload_bytes(cfg, w.num_seqs, size, dtype_bytes)
    comm = 0.0
    if size > 1:
        collectives = 2 * cfg.num_hidden_layers + 2  # all-reduces and the gather
        comm = (collectives * 2 * math.ceil(math.log2(size)) * link.hop_latency_s + 2 * (size - 1) / size * ar / link.bytes_per_s
                + (size - 1) / size * ag / link.bytes_per_s)
    return StepEstimate(size, compute, comm, ar if size > 1 else 0, ag if size > 1 else 0)


def speedup_table(
    models: dict[str, ModelConfig], workloads: list[Workload], sizes: list[int], links: list[Link],
    gpu: Gpu = H100_SXM,
) -> list[dict]:
    """Rows of (model, workload, link, N): step time, its compute and comm parts, speed-up over N=1."""
    rows = []
    for mname, cfg in models.items():
        for w in workloads:
            t1 = estimate_step(cfg, w, 1, gpu, links[0]).total_s
            for link in links:
                for n in sizes:
                    e = estimate_step(cfg, w, n, gpu, link)
                    rows.append({
                        "model": mname, "workload": w.name, "link": link.name, "tp": n,
                        "step_ms": e.total_s * 1e3, "compute_ms": e.compute_s * 1e3, "comm_ms": e.comm_s * 1e3,
                        "comm_fraction": e.comm_s / e.total_s, "speedup": t1 / e.total_s,
                        "allreduce_bytes": e.allreduce_bytes, "allgather_bytes": e.allgather_bytes,
                        "weight_gb_per_gpu": cfg.num_parameters() * 2 / n / 1e9,
                        "fits": cfg.num_parameters() * 2 / n < 0.9 * gpu.memory_bytes,
                    })
    return rows
