"""`minillm bench quant`: per quantization setting, size, memory, quality and speed, beside the bandwidth roof.

Every setting gets its own engine over its own copy of the model (loaded once,
quantized per setting); decode repeats alternate the order of the settings so
a drifting shared machine hits all alike. Where one copy per setting does not
fit in memory (a 1.5B model in float32 is 6.2 GB), the settings are measured
one after another instead, each copy freed before the next is made
(`sequential`). For each setting the report holds:

- weight bytes per token: what a batch-1 decode step streams, counted from the
  tensors the model holds (minillm.quant.footprint);
- KV bytes per token (values + scales) and the mean KV bytes a step reads over
  the workload's contexts;
- the bandwidth roof: the measured bandwidth roof / bytes per step, the speed
  if the step were nothing but reading those bytes once;
- measured decode tok/s and its fraction of the roof;
- memory: every weight byte the model keeps (minillm.quant.footprint.model_bytes);
- prefill tok/s of one `prefill_len`-token prompt (one step: every linear an M = prefill_len
  GEMM, where int8 x int8 GEMMs (w8a8) raise the compute roof), when prefill_len > 0;
- perplexity, its change and top-1 agreement with the float model on `quality_windows`
  windows of the eval split of pydoc_data.topics (minillm.eval), when quality_windows > 0;
- memory allocated: the weights plus the engine's KV pool, both counted from the tensors (the
  activations' workspace is transient and not counted: torch's CPU allocator keeps no statistics);
- batched throughput (output tok/s) on a ThroughputWorkload, continuous batching over all its
  requests at once, when throughput_requests > 0;
- a task suite's score and its change vs float (minillm.eval.tasks: code pass@1 with unit tests,
  or facts exact match), generated greedily by the setting's own engine, when tasks is set.

fp8 on CPU stores e4m3 weights and dequantizes them on every call (minillm.quant.fp8):
its row shows the memory saved and the time that costs, not fp8 arithmetic.

llama.cpp: where llama-cpp-python is installed and the model is a GGUF file,
llama.cpp decodes the same prompts from the same file in the same run (with
and without its runtime weight repacking), interleaved with the settings, and
each setting's ratio to each llama.cpp run is reported. Otherwise no ratio is
shown: a figure typed into the code is not a measurement of this machine.
"""
from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from minillm.bench.workload import LatencyWorkload

DEFAULT_SETTINGS = ("float", "int8", "int4", "int4-awq", "gptq", "w8a8", "fp8", "gguf", "gguf+head8", "kv-int8",
                    "int4+head8+kv-int8")


@dataclass
class QuantSubjectRow:
    setting: str
    weight_bytes_per_token: int
    kv_bytes_per_token: int
    mean_kv_read_bytes: float
    roof_tok_s: float | None
    load_s: float
    tok_s: list[float] = field(default_factory=list)
    model_bytes: int | None = None
    prefill_tok_s: list[float] = field(default_factory=list)
    perplexity: float | None = None
    ppl_change_pct: float | None = None  # vs the float model on the same windows
    top1_agreement: float | None = None
    kv_pool_bytes: int | None = None  # the engine's KV pool as allocated
    throughput_tok_s: float | None = None  # output tokens / s on the batched workload
    task_passed: int | None = None
    task_total: int | None = None
    task_change_pts: float | None = None  # score - float's score, percentage points
    task_verdicts: list[bool] | None = None  # per item, in the suite's order
    task_flips: int | None = None  # items whose verdict differs from float's (a net change hides these)

    @property
    def allocated_bytes(self) -> int | None:
        """Weights + KV pool, as allocated."""
        return None if self.model_bytes is None or self.kv_pool_bytes is None else self.model_bytes + self.kv_pool_bytes

    @property
    def task_score(self) -> float | None:
        return self.task_passed / self.task_total if self.task_total else None

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else float("nan")

    @property
    def median_prefill_tok_s(self) -> float | None:
        return statistics.median(self.prefill_tok_s) if self.prefill_tok_s else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["median_tok_s"] = self.median_tok_s
        d["median_prefill_tok_s"] = self.median_prefill_tok_s
        d["roof_fraction"] = self.median_tok_s / self.roof_tok_s if self.roof_tok_s else None
        d["allocated_bytes"] = self.allocated_bytes
        d["task_score"] = self.task_score
        return d


@dataclass
class PeerDecodeRow:
    """A peer (llama.cpp) decoding the same prompts in the same run."""

    name: str
    tok_s: list[float] = field(default_factory=list)

    @property
    def median_tok_s(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"median_tok_s": self.median_tok_s}


def peer_ratios(rows: list[QuantSubjectRow], peers: list[PeerDecodeRow]) -> dict[str, dict[str, float]]:
    """setting -> peer -> median tok/s over the peer's median, for peers measured in this run only."""
    return {r.setting: {p.name: r.median_tok_s / p.median_tok_s for p in peers if p.tok_s} for r in rows}


def build_subject(loaded, setting: str, group_size: int | None = None, max_num_seqs: int = 8,
                  num_kv_blocks: int = 64):
    """(MinillmSubject, model) for one setting, on a private copy of the float model unless it is 'float'."""
    from minillm.bench.minillm_subject import MinillmSubject
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine
    from minillm.eval.ppl import parse_setting, setting_model

    s = parse_setting(setting)
    model = setting_model(loaded, s, group_size)
    engine = LLMEngine(model, loaded.tokenizer, loaded.eos_token_ids,
                       EngineConfig(num_kv_blocks=num_kv_blocks, enable_prefix_caching=False, kv_cache_dtype=s.kv_cache_dtype,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=1024))
    return MinillmSubject(engine), model, s


def measure_quant(
    loaded, settings: tuple[str, ...], workload: LatencyWorkload, bandwidth: float | None,
    repeats: int = 3, group_size: int | None = None, log: Callable[[str], None] = lambda s: None,
    peers: Sequence[Any] = (), peer_rows: list[PeerDecodeRow] | None = None,
    quality_windows: int = 0, quality_len: int = 256, throughput: Any = None, tasks: str | None = None,
    task_limit: int | None = None, sequential: bool = False,
) -> list[QuantSubjectRow]:
    """One row per setting. `peers` (subjects with .name and .decode) decode the same prompts; their timings
    are appended to `peer_rows`. `throughput`: a ThroughputWorkload run once per setting; `tasks`: "code" or
    "facts", the suite each setting's engine answers.

    Interleaved (default): every setting's model is held at once and decode repeats alternate the order of
    the settings (and peers), so a drifting shared machine hits all alike. `sequential=True`: one setting's
    copy at a time, measured whole and freed before the next is built -- peak memory is the float model
    plus one quantized copy, the price is that a drift between settings is not cancelled (peers run last)."""
    quality = _QualityProbe(loaded, quality_windows, quality_len) if quality_windows > 0 else None
    rows: list[QuantSubjectRow] = []
    peer_out = [PeerDecodeRow(p.name) for p in peers]
    if peer_rows is not None:
        peer_rows.extend(peer_out)
    if sequential:
        for name in settings:
            subj, row = _build_row(loaded, name, group_size, bandwidth, workload, quality, log)
            rows.append(row)
            _timed_repeats(loaded, [subj], [row], workload, repeats, log)
            _batched(loaded, [subj], [row], throughput, tasks, task_limit, log)
            del subj
            gc.collect()  # the copy goes before the next setting's is made
        if peers:
            _timed_repeats(loaded, list(peers), peer_out, workload, repeats, log)
    else:
        subjects = []
        for name in settings:
            subj, row = _build_row(loaded, name, group_size, bandwidth, workload, quality, log)
            subjects.append(subj)
            rows.append(row)
        _timed_repeats(loaded, subjects + list(peers), rows + peer_out, workload, repeats, log)
        _batched(loaded, subjects, rows, throughput, tasks, task_limit, log)
    if tasks is not None:
        _compare_tasks(rows)
    return rows


def _compare_tasks(rows: list[QuantSubjectRow]) -> None:
    """Each row's task score change vs the float row, and how many items flipped either way."""
    base = next((r for r in rows if r.setting == "float"), None)
    if base is None:
        return
    for row in rows:
        row.task_change_pts = round(100.0 * (row.task_score - base.task_score), 2)
        row.task_flips = sum(a != b for a, b in zip(row.task_verdicts, base.task_verdicts))


def _build_row(loaded, name: str, group_size: int | None, bandwidth: float | None, workload: LatencyWorkload,
               quality: "_QualityProbe | None", log: Callable[[str], None]) -> tuple[Any, QuantSubjectRow]:
    """Build one setting's engine and its row: bytes, roof, memory, and quality when asked."""
    from minillm.attention.kv_quant import kv_bytes_per_token, resolve_kv_cache_dtype
    from minillm.quant.footprint import model_bytes, weight_bytes_per_token

    cfg = loaded.model.config
    contexts = range(workload.prompt_len + 1, workload.prompt_len + workload.output_len)
    t0 = time.perf_counter()
    subj, model, s = build_subject(loaded, name, group_size, max_num_seqs=16, num_kv_blocks=256)
    kv_dtype = resolve_kv_cache_dtype(s.kv_cache_dtype) or model.embed_tokens.weight.dtype
    kv_tok = kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, kv_dtype)
    kv_read = kv_tok * statistics.mean(contexts)
    wb = weight_bytes_per_token(model)
    roof = bandwidth / (wb + kv_read) if bandwidth else None
    row = QuantSubjectRow(name, wb, kv_tok, kv_read, roof, round(time.perf_counter() - t0, 2),
                          model_bytes=model_bytes(model), kv_pool_bytes=subj.engine.executor.kv_cache_bytes)
    log(f"built {name}: {wb / 1e6:.1f} MB weights/token, {kv_tok} B KV/token ({row.load_s}s)")
    if quality is not None:
        quality.score(row, model, s.kv_cache_dtype)
        _attach(subj)  # scoring bound its own KV pool to the model
        log(f"quality {name}: perplexity {row.perplexity:.3f}, top-1 agreement {row.top1_agreement:.4f}")
    return subj, row


def _timed_repeats(loaded, everyone: list[Any], timed: list[Any], workload: LatencyWorkload, repeats: int,
                   log: Callable[[str], None]) -> None:
    """Warm up, then `repeats` rounds of batch-1 decode (and prefill for engines), the order alternating."""
    vocab = loaded.model.config.vocab_size
    for s in everyone:  # warm-up: allocations, oneDNN primitives, first-call packing
        _attach(s)
        s.decode(workload.decode_prompt(-1, vocab), min(8, workload.output_len))
    order = list(range(len(everyone)))
    for r in range(repeats):
        prompt = workload.decode_prompt(r, vocab)
        for i in order if r % 2 == 0 else order[::-1]:
            _attach(everyone[i])
            run = everyone[i].decode(prompt, workload.output_len)
            timed[i].tok_s.append(run.decode_tok_s)
            label = getattr(timed[i], "setting", None) or timed[i].name
            log(f"decode {label:20s} repeat {r}: {run.decode_tok_s:7.2f} tok/s")
        if workload.prefill_len > 0:
            long_prompt = workload.prefill_prompt(r, vocab)
            for i in order if r % 2 == 0 else order[::-1]:
                if not isinstance(timed[i], QuantSubjectRow):
                    continue  # peers decode only
                _attach(everyone[i])
                ttft = everyone[i].prefill(long_prompt)
                timed[i].prefill_tok_s.append(len(long_prompt) / ttft)
                log(f"prefill {timed[i].setting:20s} repeat {r}: {timed[i].prefill_tok_s[-1]:7.1f} tok/s")


def _batched(loaded, subjects: list[Any], rows: list[QuantSubjectRow], throughput: Any, tasks: str | None,
             task_limit: int | None, log: Callable[[str], None]) -> None:
    """The batched workload's output tok/s and the task suite's score, per setting."""
    if throughput is not None:
        prompts, out_lens = throughput.requests(loaded.model.config.vocab_size)
        for row, subj in zip(rows, subjects):
            _attach(subj)
            run = subj.serve(prompts, out_lens)
            row.throughput_tok_s = run.output_tokens / run.wall_s
            log(f"throughput {row.setting:20s}: {row.throughput_tok_s:7.1f} output tok/s ({run.num_steps} steps)")
    if tasks is not None:
        for row, subj in zip(rows, subjects):
            _attach(subj)
            row.task_verdicts = task_verdicts(subj, loaded.tokenizer, tasks, task_limit)
            row.task_passed, row.task_total = sum(row.task_verdicts), len(row.task_verdicts)
            log(f"tasks {row.setting:20s}: {row.task_passed}/{row.task_total} ({tasks})")


def needs_sequential(loaded, settings: Sequence[str], available_bytes: int | None = None) -> bool:
    """True when one quantized copy per setting (counted at the float model's size, the copy made before
    quantizing) would not fit in half the memory available now."""
    import os

    from minillm.eval.ppl import parse_setting
    from minillm.quant.footprint import model_bytes

    if available_bytes is None:
        available_bytes = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    parsed = [parse_setting(x) for x in settings]
    copies = sum(1 for s in parsed if s.needs_copy(loaded.model))  # build_subject copies these
    return model_bytes(loaded.model) * copies > available_bytes // 2


def task_verdicts(subject: Any, tokenizer, suite: str, limit: int | None = None) -> list[bool]:
    """Pass/fail per item of one task suite answered greedily by `subject`'s engine, checked as
    `minillm eval tasks` checks it (code: the function's unit tests; facts: exact match)."""
    from minillm.eval.tasks.code_check import STOP, check_all
    from minillm.eval.tasks.facts_check import is_match, messages
    from minillm.eval.tasks.run import DEFAULT_MAX_TOKENS, suite_items
    from minillm.sampling_params import SamplingParams

    items = suite_items(suite, limit)
    if suite == "code":
        prompts = [t.prompt for t in items]  # text, tokenized by the engine as LLM.generate does
        params = SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS["code"], stop=list(STOP))
    else:
        prompts = [tokenizer.apply_chat_template(messages(i), tokenize=False, add_generation_prompt=True)
                   for i in items]
        params = SamplingParams(temperature=0.0, max_tokens=DEFAULT_MAX_TOKENS["facts"])
    outs, _ = subject.run(prompts, [params] * len(prompts))
    texts = [o.outputs[0].text for o in outs]
    if suite == "code":
        return [bool(r.passed) for r in check_all(items, texts)]
    return [bool(is_match(i, x)) for i, x in zip(items, texts)]


class _QualityProbe:
    """Perplexity and top-1 agreement of each setting's model against the float model, on the same windows."""

    def __init__(self, loaded, num_windows: int, length: int) -> None:
        from minillm.eval import corpus_tokens, score_windows, windows

        self.wins = windows(corpus_tokens(loaded.tokenizer, "eval", num_windows * length), length, num_windows)
        self.base = score_windows(loaded.model, self.wins, chunk_size=64)

    def score(self, row: QuantSubjectRow, model, kv_cache_dtype: str) -> None:
        from minillm.eval import score_windows

        got = score_windows(model, self.wins, chunk_size=64, kv_cache_dtype=kv_cache_dtype)
        row.perplexity = got.perplexity
        row.ppl_change_pct = 100.0 * (got.perplexity / self.base.perplexity - 1.0)
        row.top1_agreement = (got.top1 == self.base.top1).double().mean().item()


def _attach(subject: Any) -> None:
    """KV-only settings share the float model: point it at this engine's pool (peers have their own)."""
    engine = getattr(subject, "engine", None)
    if engine is not None:
        engine.executor.attach()


def format_quant(rows: list[QuantSubjectRow], bandwidth: float | None, peers: Sequence[PeerDecodeRow] = (),
                 peer_note: str | None = None) -> str:
    bw = f"{bandwidth / 1e9:.1f} GB/s" if bandwidth else "not measured"
    measured = [p for p in peers if p.tok_s]
    ratios = peer_ratios(rows, measured)
    lines = [f"per setting: weights streamed per decoded token, memory, batch-1 decode (bandwidth roof {bw}), "
             f"prefill, quality against the float model",
             f"{'setting':20s} {'W MB/tok':>9s} {'mem MB':>7s} {'alloc MB':>8s} {'KV B/tok':>9s} {'roof tok/s':>10s} "
             f"{'tok/s':>8s} {'of roof':>8s} {'prefill/s':>9s} {'batch/s':>8s} {'ppl':>7s} {'d ppl %':>7s} {'top-1':>6s} "
             f"{'task':>7s} {'d pt':>6s} {'flips':>5s}"
             + "".join(f" {'vs ' + p.name:>22s}" for p in measured)]

    def opt(v, spec: str, width: int) -> str:  # spec: sign and precision, e.g. "+.2f"
        if v is None:
            return f"{'n/a':>{width}s}"
        sign = "+" if spec.startswith("+") else ""
        return format(v, f"{sign}{width}{spec.lstrip('+')}")

    for r in rows:
        d = r.to_dict()
        roof = f"{r.roof_tok_s:10.1f}" if r.roof_tok_s else f"{'n/a':>10s}"
        frac = f"{d['roof_fraction']:8.1%}" if d["roof_fraction"] else f"{'n/a':>8s}"
        mem = opt(r.model_bytes / 1e6 if r.model_bytes else None, ".1f", 7)
        alloc = opt(r.allocated_bytes / 1e6 if r.allocated_bytes else None, ".1f", 8)
        task = f"{r.task_passed}/{r.task_total}" if r.task_total else "n/a"
        lines.append(f"{r.setting:20s} {r.weight_bytes_per_token / 1e6:9.1f} {mem} {alloc} {r.kv_bytes_per_token:9d} {roof} "
                     f"{r.median_tok_s:8.1f} {frac} {opt(r.median_prefill_tok_s, '.1f', 9)} "
                     f"{opt(r.throughput_tok_s, '.1f', 8)} "
                     f"{opt(r.perplexity, '.3f', 7)} {opt(r.ppl_change_pct, '+.2f', 7)} {opt(r.top1_agreement, '.3f', 6)} "
                     f"{task:>7s} {opt(r.task_change_pts, '+.1f', 6)} {opt(r.task_flips, 'd', 5)}"
                     + "".join(f" {ratios[r.setting][p.name]:22.2f}" for p in measured))
    lines.append("mem: weights held; alloc: weights + KV pool as allocated; batch/s: output tok/s of the batched "
                 "workload; task: the suite's passed/total, d pt: its change from float in points, flips: items whose "
                 "verdict differs from float's")
    if any(r.setting.split("+")[0] == "fp8" for r in rows):
        lines.append("fp8 here: e4m3 weights stored, dequantized on every call (no fp8 arithmetic on this CPU)")
    for p in measured:
        lines.append(f"{p.name}: {p.median_tok_s:.1f} tok/s (median of {len(p.tok_s)}, same prompts, this run)")
    if not measured:
        lines.append(f"llama.cpp: not measured in this run ({peer_note or 'not asked for'}), so no ratio is shown")
    elif peer_note:
        lines.append(f"llama.cpp: {peer_note}")
    return "\n".join(lines)
