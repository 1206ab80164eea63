"""`minillm bench tp`: what tensor parallelism communicates per step, and what it would buy on GPUs.

Two parts in one report:

1. Measured here (CPU + gloo, or GPUs + NCCL): the same greedy workload on one
   rank and on N ranks. Per step the trace holds the bytes all-reduced and
   all-gathered and rank 0's wall time inside collectives; the report checks the
   bytes against the analytic count (2 all-reduces per layer + 1 after the
   embedding, tokens x hidden each) and that the tokens match one rank.
   On a CPU the ranks share the same cores and memory bandwidth, so TP does not
   speed anything up here; the time in collectives also includes waiting for
   the slowest rank.
2. Analytic (minillm/parallel/analytic.py, bandwidth sources cited there): the
   speed-up of TP for Llama-2-7B and -70B on H100s over NVLink vs PCIe.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from minillm.bench.workload import random_prompt
from minillm.parallel import analytic

Log = Callable[[str], None]


@dataclass(frozen=True)
class TPWorkload:
    num_prompts: int = 4
    prompt_len: int = 64
    output_len: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.num_prompts, self.prompt_len, self.output_len) < 1:
            raise ValueError("num_prompts, prompt_len and output_len must be >= 1")

    def prompts(self, vocab_size: int) -> list[list[int]]:
        rng = random.Random(f"{self.seed}-tp")
        return [random_prompt(rng, self.prompt_len, vocab_size) for _ in range(self.num_prompts)]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "prompts": "random tokens, all submitted at once", "sampling": "greedy"}


def _run(model: str | None, size: int, wl: TPWorkload, dtype: str, device: str | None, timeout_s: float,
         log: Log) -> dict[str, Any]:
    from minillm import LLM, SamplingParams

    blocks = wl.num_prompts * (-(-(wl.prompt_len + wl.output_len) // 16) + 1) + 8
    t0 = time.perf_counter()
    with LLM(model, dtype=dtype, device=device, block_size=16, num_kv_blocks=blocks, tensor_parallel_size=size,
             distributed_timeout_s=timeout_s) as llm:
        startup = time.perf_counter() - t0
        cfg = llm.engine.model_config
        prompts = wl.prompts(cfg.vocab_size)
        sp = SamplingParams(temperature=0, max_tokens=wl.output_len, ignore_eos=True, logprobs=0)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        wall = time.perf_counter() - t0
        trace = list(llm.trace)
        act_bytes = llm.engine.model.embed_tokens.weight.element_size()
    log(f"tp={size}: started in {startup:.1f} s, {len(trace)} steps in {wall:.2f} s")
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    chosen_logprobs = [[lp[t] for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outs]
    steps = []
    for t in trace:
        expected = analytic.allreduce_payload_bytes(cfg, t.num_tokens, act_bytes) if size > 1 else 0
        steps.append({
            "step": t.step, "prefill_tokens": t.num_prefill_tokens, "decode_tokens": t.num_decode_tokens,
            "duration_s": t.duration_s, "allreduce_bytes": t.allreduce_bytes, "allgather_bytes": t.allgather_bytes,
            "comm_time_s": t.comm_time_s, "allreduce_bytes_analytic": expected,
        })
    return {"tp": size, "startup_s": startup, "generate_s": wall,
            "output_tok_per_s": sum(len(x) for x in tokens) / wall, "tokens": tokens,
            "chosen_logprobs": chosen_logprobs, "steps": steps, "act_bytes": act_bytes,
            "model_config": {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "vocab_size")}}


def _phase_summary(steps: list[dict[str, Any]], phase: str, calls: int) -> dict[str, Any] | None:
    key = "prefill_tokens" if phase == "prefill" else "decode_tokens"
    other = "decode_tokens" if phase == "prefill" else "prefill_tokens"
    sel = [s for s in steps if s[key] > 0 and s[other] == 0]  # pure steps only: one kind of work each
    if not sel:
        return None
    med = lambda k: statistics.median(s[k] for s in sel)  # noqa: E731
    comm, dur = med("comm_time_s"), med("duration_s")
    return {"steps": len(sel), "tokens_per_step": med(key), "allreduce_bytes": med("allreduce_bytes"),
            "allgather_bytes": med("allgather_bytes"), "comm_time_s": comm, "step_time_s": dur,
            "comm_fraction": comm / dur if dur else None, "allreduce_calls_per_step": calls}


def measure_tp(model: str | None, size: int, wl: TPWorkload, dtype: str = "float32", device: str | None = None,
               timeout_s: float = 120.0, log: Log = lambda s: None, bare_repeats: int = 30) -> dict[str, Any]:
    """Run the workload on 1 and on `size` ranks; per-step communication and the comparison.

    Then (bare_repeats > 0, CPU only) the same all-reduce payloads among bare processes: the
    collective's own cost, against which the engine's time in collectives (waits included) reads.
    """
    if size < 2:
        raise ValueError(f"--tp must be >= 2 (it is compared with one rank), got {size}")
    one = _run(model, 1, wl, dtype, device, timeout_s, log)
    tp = _run(model, size, wl, dtype, device, timeout_s, log)
    diffs = [abs(a - b) for xa, xb in zip(one["chosen_logprobs"], tp["chosen_logprobs"]) for a, b in zip(xa, xb)]
    layers = tp["model_config"]["num_hidden_layers"]
    summary = {
        "tokens_identical": one["tokens"] == tp["tokens"],
        "max_abs_logprob_diff": max(diffs) if diffs and one["tokens"] == tp["tokens"] else None,
        "bytes_match_analytic": all(s["allreduce_bytes"] == s["allreduce_bytes_analytic"] for s in tp["steps"]),
        "allreduces_per_step": 2 * layers + 1,
        "prefill": _phase_summary(tp["steps"], "prefill", 2 * layers + 1),
        "decode": _phase_summary(tp["steps"], "decode", 2 * layers + 1),
        "output_tok_per_s": {"tp1": one["output_tok_per_s"], f"tp{size}": tp["output_tok_per_s"]},
    }
    phases = [ph for ph in ("prefill", "decode") if summary[ph] is not None]
    if bare_repeats > 0 and phases and not str(device or "cpu").startswith("cuda"):
        calls = 2 * layers + 1
        payload = {ph: int(summary[ph]["allreduce_bytes"] // calls) for ph in phases}  # one all-reduce's bytes
        bare = time_allreduce(size, sorted(set(payload.values())), bare_repeats)
        log(f"bare gloo all-reduce among {size} processes: "
            + ", ".join(f"{b / 1e3:.1f} kB {t * 1e6:.0f} us" for b, t in sorted(bare.items())))
        for ph in phases:
            summary[ph]["bare_allreduce_s"] = bare[payload[ph]]
            summary[ph]["bare_comm_per_step_s"] = bare[payload[ph]] * calls
    return {"runs": {"tp1": one, f"tp{size}": tp}, "summary": summary}


def _time_allreduce(rank: int, size: int, port: int, payloads: list[int], repeats: int, out) -> None:
    """One rank of the collective timing (a spawned process): median seconds per all-reduce per payload."""
    import torch
    import torch.distributed as dist

    from minillm.parallel.group import init_group

    torch.set_num_threads(1)
    init_group(rank, size, port, torch.device("cpu"), 60.0)
    try:
        res = {}
        for nbytes in payloads:
            x = torch.ones(max(1, nbytes // 4))
            for _ in range(3):  # warm-up: connections, buffers
                dist.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times.append(time.perf_counter() - t0)
            res[nbytes] = statistics.median(times)
        if rank == 0:
            out.put(res)
    finally:
        dist.destroy_process_group()


def time_allreduce(size: int, payloads: list[int], repeats: int = 50) -> dict[int, float]:
    """Bare gloo all-reduces among `size` fresh processes (no model): median seconds per payload in bytes.

    The engine's comm_time_s also holds the wait for the slowest rank; this is the collective alone.
    """
    import torch.multiprocessing as mp

    from minillm.parallel.group import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_time_allreduce, args=(size, free_port(), payloads, repeats, out), nprocs=size,
                       start_method="spawn")
    return out.get()


def analytic_section(sizes: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, Any]:
    links = [analytic.NVLINK4, analytic.PCIE5]
    return {
        "gpu": asdict(analytic.H100_SXM), "links": [asdict(link) for link in links],
        "models": {"Llama-2-7B": asdict(analytic.LLAMA2_7B), "Llama-2-70B": asdict(analytic.LLAMA2_70B)},
        "sources": "see minillm/parallel/analytic.py: NVIDIA H100 datasheet (NVLink 4: 900 GB/s bidirectional, "
                   "989 TFLOP/s BF16 dense, 3.35 TB/s HBM3); PCI-SIG PCIe 5.0 x16 ~63 GB/s per direction",
        "rows": analytic.speedup_table({"Llama-2-7B": analytic.LLAMA2_7B, "Llama-2-70B": analytic.LLAMA2_70B},
                                       [analytic.DECODE_1, analytic.DECODE_64, analytic.PREFILL_2K],
                                       list(sizes), links),
    }


def format_tp(result: dict[str, Any], model_section: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"tokens identical to one rank: {s['tokens_identical']}   "
             f"max |logprob diff| of chosen tokens: {s['max_abs_logprob_diff']}",
             f"all-reduce bytes match the analytic count ({s['allreduces_per_step']} per step): "
             f"{s['bytes_match_analytic']}"]
    for ph in ("prefill", "decode"):
        p = s[ph]
        if p is None:
            continue
        lines.append(f"{ph:7s} step (median of {p['steps']}): {p['tokens_per_step']:.0f} tokens, "
                     f"all-reduce {p['allreduce_bytes'] / 1e3:.1f} kB, gather {p['allgather_bytes'] / 1e3:.1f} kB, "
                     f"in collectives {p['comm_time_s'] * 1e3:.1f} of {p['step_time_s'] * 1e3:.1f} ms")
        if "bare_allreduce_s" in p:
            one = p["allreduce_bytes"] / p["allreduce_calls_per_step"]
            lines.append(f"{'':9s}a bare gloo all-reduce of {one / 1e3:.1f} kB (no model): "
                         f"{p['bare_allreduce_s'] * 1e6:.0f} us, x {p['allreduce_calls_per_step']} = "
                         f"{p['bare_comm_per_step_s'] * 1e3:.1f} ms per step")
    lines.append("output tok/s: " + ", ".join(f"{k} {v:.1f}" for k, v in s["output_tok_per_s"].items()))
    lines.append("analytic TP speed-up on H100 SXM (step time, speed-up vs 1 GPU, share of it in collectives):")
    fits1 = {(r["model"], r["workload"]): r["fits"] for r in model_section["rows"] if r["tp"] == 1}
    for r in model_section["rows"]:
        if r["tp"] == 1:
            continue
        star = "" if fits1[(r["model"], r["workload"])] else " *"
        lines.append(f"  {r['model']:11s} {r['workload']:31s} {r['link']:19s} tp={r['tp']}: "
                     f"{r['step_ms']:8.2f} ms  x{r['speedup']:.2f}  comm {100 * r['comm_fraction']:.0f}%{star}")
    if not all(fits1.values()):
        lines.append("  * one 80 GB GPU cannot hold the BF16 weights: the 1-GPU baseline is hypothetical")
    return "\n".join(lines)
