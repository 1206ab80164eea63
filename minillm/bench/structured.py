"""`minillm bench structured`: what a JSON schema costs per output token, and what compiling one costs.

Structured outputs (engine/grammar.py) put a grammar mask on every logits row a constrained sequence
chooses from: the matcher fills a bitmask of the allowed tokens, torch unpacks it and sets the rest
to -inf. That work sits on every decode step, so the figure that matters is the time per output
token (TPOT) with a schema against the same requests without one. The issue's target: at most 10%
slower TPOT at batch 1 once the grammar is compiled.

TPOT: chat prompts asking for a fictional person as JSON, greedy, against one fixed schema whose
strings and arrays are bounded (maxLength, maxItems), so every output ends at the grammar's end.
A first constrained run per batch size compiles the grammar and fixes each request's output length
N_i (greedy: the same every run); the plain run gets the same requests with ignore_eos=True and
max_tokens=N_i, so both runs have the same steps at the same batch sizes and contexts, and only the
masks differ. The compared figure is the median decode-step duration from the step trace (a decode
step gives each running sequence one token: its duration is the TPOT of that step), not wall
totals, which the prefill and its cache hits also move. Repeats alternate plain and constrained
(P C, C P, ...) so a shared machine's drift hits both alike; each repeat's ratio (constrained /
plain) and their median are reported, with the masks' share of the constrained run's time (sum of
the trace's grammar_s over sum of its duration_s) and the cost per masked row.

Compile: about ten schemas from one boolean to a 60-property object, a nested order with
pattern/enum and a 200-value enum, each compiled cold on a fresh GrammarCompiler (the engine's class,
built the way its GrammarGate builds it; a fresh one has an empty cache) per repeat, from its
compile_seconds; the tokenizer setup a first constrained request pays once per engine; and the
cache hit (the same schema again: no compile run, only the lookup).
"""
from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from minillm.bench.stats import figure, ratio
from minillm.bench.targets import STRUCTURED_TPOT_BATCH1, Target, target
from minillm.engine.trace import StepTrace
from minillm.roofline.machine_state import MachineState, settle as default_settle
from minillm.sampling_params import SamplingParams
from minillm.structured_outputs import StructuredOutputs

Log = Callable[[str], None]

# the TPOT schema: every string and array bounded, so a greedy model cannot run on forever
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 32},
        "occupation": {"type": "string", "maxLength": 32},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "city", "occupation", "hobbies"],
    "additionalProperties": False,
}

ROLES = ["baker", "retired pilot", "nurse", "software engineer", "fisherman", "violin teacher", "farmer",
         "librarian", "taxi driver", "marine biologist", "street artist", "chemistry student"]
PLACES = ["Lyon", "Osaka", "Nairobi", "Montreal", "Lisbon", "Hanoi", "Cusco", "Oslo"]


def person_prompts(n: int) -> list[str]:
    """n different user messages asking for a fictional person as JSON (96 before they repeat)."""
    combos = [(r, p) for p in PLACES for r in ROLES]
    return [f"Describe a fictional {r} from {p} as a JSON object with their name, age, city, "
            f"occupation and up to three hobbies." for r, p in (combos[i % len(combos)] for i in range(n))]


def _object(props: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props if required is None else required),
            "additionalProperties": False}


_TYPES = [{"type": "string", "maxLength": 16}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
          {"type": "string", "enum": ["low", "medium", "high"]}]


def _wide(n: int) -> dict[str, Any]:
    return _object({f"field_{i:02d}": _TYPES[i % len(_TYPES)] for i in range(n)})


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = _object({"value": {"type": "integer"}})
    for i in range(depth):
        node = _object({"label": {"type": "string", "maxLength": 12}, f"child_{i}": node})
    return node


ADDRESS = _object({"street": {"type": "string", "maxLength": 48}, "city": {"type": "string", "maxLength": 32},
                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                   "country": {"type": "string", "enum": ["FR", "DE", "JP", "KE", "CA", "PT", "VN", "PE", "NO"]}})

# cold compiles: small to large, flat and nested, with the keywords that make grammars grow
COMPILE_SCHEMAS: dict[str, dict[str, Any]] = {
    "flag": _object({"ok": {"type": "boolean"}}),
    "person": PERSON_SCHEMA,
    "product": _object({"name": {"type": "string", "maxLength": 40}, "price": {"type": "number", "minimum": 0},
                        "currency": {"type": "string", "enum": ["EUR", "USD", "JPY", "GBP"]},
                        "in_stock": {"type": "boolean"},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 5}}),
    "address": ADDRESS,
    "union": {"anyOf": [_object({"kind": {"const": "cat"}, "lives": {"type": "integer", "maximum": 9}}),
                        _object({"kind": {"const": "dog"}, "breed": {"type": "string", "maxLength": 24}}),
                        _object({"kind": {"const": "fish"}, "fresh_water": {"type": "boolean"}})]},
    "order": _object({
        "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
        "status": {"type": "string", "enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
        "customer": _object({"name": {"type": "string", "maxLength": 32},
                             "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"}}),
        "items": {"type": "array", "minItems": 1, "maxItems": 10, "items": _object({
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
            "unit_price": {"type": "number", "minimum": 0}})},
        "shipping": ADDRESS,
        "notes": {"type": "string", "maxLength": 200}}, required=["order_id", "status", "customer", "items", "shipping"]),
    "wide-20": _wide(20),
    "deep-8": _deep(8),
    "enum-200": _object({"code": {"type": "string", "enum": [f"C{i:03d}-{chr(65 + i % 26)}{chr(65 + i // 26)}"
                                                             for i in range(200)]},
                         "count": {"type": "integer"}}),
    "wide-60": _wide(60),
}


@dataclass
class RunResult:
    """One batch of requests run to the end: its steps, wall time and outputs."""

    steps: list[StepTrace]
    wall_s: float
    token_counts: list[int]
    texts: list[str]
    finish_reasons: list[str | None]
    stall_ratio: float | None = None  # the machine-state probe before the run

    def figures(self) -> dict[str, Any]:
        decode = [s for s in self.steps if s.num_prefill_tokens == 0 and s.new_tokens]
        durations = [s.duration_s for s in decode]
        total = sum(s.duration_s for s in self.steps)
        grammar_s = sum(s.grammar_s for s in self.steps)
        rows = sum(s.grammar_rows for s in self.steps)
        masked = [s for s in self.steps if s.grammar_rows]
        return {
            "decode_steps": len(decode),
            "median_decode_step_s": statistics.median(durations) if durations else None,
            "mean_decode_step_s": sum(durations) / len(durations) if durations else None,
            "decode_tokens": sum(len(n.token_ids) for s in decode for n in s.new_tokens),
            "steps": len(self.steps), "steps_s": total, "wall_s": self.wall_s,
            "output_tokens": sum(self.token_counts),
            "grammar_rows": rows, "grammar_s": grammar_s,
            "mask_share": grammar_s / total if total else None,
            # per masked row: the median over steps (a stalled step moves the mean, not this), and the mean
            "mask_us_per_row": statistics.median(s.grammar_s / s.grammar_rows * 1e6 for s in masked) if masked else None,
            "mean_mask_us_per_row": grammar_s / rows * 1e6 if rows else None,
            "median_decode_step_grammar_s": statistics.median(s.grammar_s for s in decode) if decode else None,
            "stall_ratio": self.stall_ratio,
        }


def chat_token_ids(tokenizer, messages: list[str]) -> list[list[int]]:
    """Each user message through the model's chat template (which writes its own BOS), as token ids."""
    out = []
    for m in messages:
        text = tokenizer.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def run_requests(engine, prompts: list[list[int]], params: list[SamplingParams], tag: str,
                 stall_ratio: float | None = None) -> RunResult:
    """Add every request at once and step the engine until all finish."""
    first = len(engine.trace)
    ids = [f"{tag}-{first}-{i}" for i in range(len(prompts))]
    t0 = time.perf_counter()
    for rid, p, sp in zip(ids, prompts, params):
        engine.add_request(rid, p, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    wall = time.perf_counter() - t0
    outs = [done[r] for r in ids]
    return RunResult(list(engine.trace[first:]), wall, [len(o.token_ids) for o in outs], [o.text for o in outs],
                     [o.finish_reason for o in outs], stall_ratio)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def measure_tpot(engine, tokenizer, batch_sizes: Sequence[int], repeats: int = 3, max_tokens: int = 256,
                 schema: dict[str, Any] | None = None, log: Log = lambda s: None,
                 settle: Callable[[], MachineState] = default_settle) -> list[dict[str, Any]]:
    """Per batch size: each repeat's plain and constrained run figures (see the module docstring)."""
    spec = StructuredOutputs(json=schema or PERSON_SCHEMA)
    results = []
    for b in batch_sizes:
        prompts = chat_token_ids(tokenizer, person_prompts(b))
        constrained = [SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=spec)] * b
        compiles_before = len(engine.grammars.compiler.compile_seconds) if engine.grammars is not None else 0
        # the first run compiles the grammar (at the first batch size) and fixes each request's length
        calib = run_requests(engine, prompts, constrained, f"so-calib-b{b}")
        lengths = calib.token_counts
        compiles = len(engine.grammars.compiler.compile_seconds) - compiles_before
        plain = [SamplingParams(temperature=0.0, max_tokens=max(n, 1), ignore_eos=True) for n in lengths]
        run_requests(engine, prompts, plain, f"so-warm-b{b}")  # warm-up: the same shapes without masks
        log(f"batch {b}: output tokens per request {min(lengths)}-{max(lengths)} (median "
            f"{statistics.median(lengths):g}); {compiles} grammar compile(s) before the first run")
        reps = []
        for r in range(repeats):
            order = ("plain", "constrained") if r % 2 == 0 else ("constrained", "plain")
            runs: dict[str, RunResult] = {}
            for kind in order:
                stall = settle().stall_ratio
                runs[kind] = run_requests(engine, prompts, plain if kind == "plain" else constrained,
                                          f"so-{kind}-b{b}-r{r}", stall)
            p, c = runs["plain"].figures(), runs["constrained"].figures()
            rep = {"order": list(order), "plain": p, "constrained": c,
                   "step_ratio": ratio(c["median_decode_step_s"], p["median_decode_step_s"]),
                   "mean_step_ratio": ratio(c["mean_decode_step_s"], p["mean_decode_step_s"]),
                   "wall_ratio": ratio(c["wall_s"], p["wall_s"]),
                   "same_lengths": runs["plain"].token_counts == lengths == runs["constrained"].token_counts,
                   "same_constrained_text": runs["constrained"].texts == calib.texts}
            reps.append(rep)
            log(f"batch {b} repeat {r}: decode step plain {p['median_decode_step_s'] * 1e3:.2f} ms, "
                f"constrained {c['median_decode_step_s'] * 1e3:.2f} ms (x{rep['step_ratio']:.3f}); masks "
                f"{c['mask_share'] * 100:.1f}% of the run, {c['mask_us_per_row']:.0f} us/row (median step)")
        results.append({"batch": b, "lengths": lengths, "compiles_before_first_run": compiles,
                        "finish_reasons": dict(Counter(str(f) for f in calib.finish_reasons)),
                        "json_objects": sum(_is_json_object(t) for t in calib.texts),
                        "sample_output": calib.texts[0], "repeats": reps})
    return results


def measure_compile(tokenizer, vocab_size: int, eos_token_ids: set[int], schemas: dict[str, dict[str, Any]],
                    repeats: int = 3, log: Log = lambda s: None) -> dict[str, Any]:
    """Per repeat a fresh GrammarCompiler: its tokenizer setup, every schema compiled cold, then each
    schema again (the cache hit: no compile run, the lookup's seconds)."""
    from minillm.engine.grammar import GrammarCompiler

    setup_s: list[float] = []
    cold: dict[str, list[float]] = {name: [] for name in schemas}
    hit: dict[str, list[float]] = {name: [] for name in schemas}
    compiles_on_hit = 0
    for r in range(repeats):
        t0 = time.perf_counter()
        compiler = GrammarCompiler(tokenizer, vocab_size, set(eos_token_ids))
        setup_s.append(time.perf_counter() - t0)
        try:
            for name, schema in schemas.items():
                compiler.submit(StructuredOutputs(json=schema)).result()
                cold[name].append(compiler.compile_seconds[-1])
            runs = len(compiler.compile_seconds)
            for name, schema in schemas.items():
                t0 = time.perf_counter()
                compiler.submit(StructuredOutputs(json=schema)).result()  # an equal spec, a new object
                hit[name].append(time.perf_counter() - t0)
            compiles_on_hit += len(compiler.compile_seconds) - runs
        finally:
            compiler.close()
        log(f"compile repeat {r}: setup {setup_s[-1]:.2f} s; " + ", ".join(
            f"{n} {cold[n][-1] * 1e3:.1f}" for n in schemas) + " ms")
    return {
        "tokenizer_setup_s": figure("s", setup_s),
        "schemas": [{"name": n, "schema_bytes": len(json.dumps(s)), "cold_compile_s": figure("s", cold[n]),
                     "cache_hit_s": figure("s", hit[n])} for n, s in schemas.items()],
        "compiles_on_cache_hit": compiles_on_hit,
    }


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize_structured(tpot: list[dict[str, Any]], compile_: dict[str, Any],
                         engine_compile_s: list[float]) -> dict[str, Any]:
    """Medians over the repeats per batch size, and the batch-1 target (TPOT at most 10% higher: the
    Target is met when plain / constrained step time >= 1 / 1.1)."""
    by_batch = []
    for res in tpot:
        reps = res["repeats"]
        ms = lambda kind: [r[kind]["median_decode_step_s"] * 1e3 for r in reps]  # noqa: E731
        by_batch.append({
            "batch": res["batch"],
            "tpot_ms_plain": figure("ms", ms("plain")), "tpot_ms_constrained": figure("ms", ms("constrained")),
            "step_ratio": figure("ratio", [r["step_ratio"] for r in reps]),
            # the fastest repeat of each over the other's: other tenants only slow a run down
            "fastest_step_ratio": ratio(min(ms("constrained")), min(ms("plain"))),
            "mean_step_ratio": figure("ratio", [r["mean_step_ratio"] for r in reps]),
            "wall_ratio": figure("ratio", [r["wall_ratio"] for r in reps]),
            "mask_share": figure("fraction", [r["constrained"]["mask_share"] for r in reps]),
            "mask_us_per_row": figure("us", [r["constrained"]["mask_us_per_row"] for r in reps]),
            "mean_mask_us_per_row": figure("us", [r["constrained"]["mean_mask_us_per_row"] for r in reps]),
            "mask_ms_per_decode_step": figure("ms", [r["constrained"]["median_decode_step_grammar_s"] * 1e3
                                                     for r in reps]),
            "output_tokens_per_request": {"min": min(res["lengths"]), "median": statistics.median(res["lengths"]),
                                          "max": max(res["lengths"])},
            "json_objects": res["json_objects"], "finish_reasons": res["finish_reasons"],
            "same_lengths_every_repeat": all(r["same_lengths"] for r in reps),
        })
    one = next((b for b in by_batch if b["batch"] == 1), None)
    targets: list[Target] = [target(STRUCTURED_TPOT_BATCH1, 1 / one["step_ratio"].median
                                    if one and one["step_ratio"].median else None)]
    cold = [s["cold_compile_s"].median for s in compile_["schemas"]]
    return {
        "tpot": by_batch,
        "batch1_step_ratio": one["step_ratio"].median if one else None,
        "compile": {**compile_, "median_cold_compile_s": _median(cold), "max_cold_compile_s": max(cold, default=None),
                    "engine_compile_seconds": list(engine_compile_s)},
        "targets": targets,
    }


def format_structured(summary: dict[str, Any]) -> str:
    from minillm.bench.report import format_targets

    lines = ["structured outputs: median decode-step time (TPOT) with a JSON schema / without, same requests "
             "and output lengths (median over repeats; each repeat in brackets)"]
    for b in summary["tpot"]:
        r = b["step_ratio"]
        lines.append(f"  batch {b['batch']:3d}: plain {b['tpot_ms_plain'].median:7.2f} ms, schema "
                     f"{b['tpot_ms_constrained'].median:7.2f} ms  x{r.median:.3f} "
                     f"[{', '.join(f'{v:.3f}' for v in r.values)}; fastest runs x{b['fastest_step_ratio']:.3f}]")
        lines.append(f"             masks {b['mask_share'].median * 100:.1f}% of the constrained run, "
                     f"{b['mask_ms_per_decode_step'].median:.2f} ms per decode step, "
                     f"{b['mask_us_per_row'].median:.0f} us/row; {b['json_objects']}/{b['batch']} JSON objects, "
                     f"{b['output_tokens_per_request']['median']:g} tokens/request (median)")
    c = summary["compile"]
    lines.append(f"  grammar compile, cold (median of {len(c['tokenizer_setup_s'].values)} fresh compilers; "
                 f"tokenizer setup {c['tokenizer_setup_s'].median:.2f} s each):")
    lines.append("    " + ", ".join(f"{s['name']} ({s['schema_bytes']} B) {s['cold_compile_s'].median * 1e3:.1f} ms"
                                    for s in c["schemas"]))
    hit = _median([s["cache_hit_s"].median for s in c["schemas"]])
    lines.append(f"  cache hit (same schema again): {c['compiles_on_cache_hit']} compiles, "
                 f"{(hit or 0) * 1e6:.0f} us lookup (median)")
    lines += format_targets(summary["targets"])
    return "\n".join(lines)


def bench_structured(llm, batch_sizes: Sequence[int] = (1, 32), repeats: int = 3, max_tokens: int = 256,
                     num_schemas: int | None = None, settings: dict[str, Any] | None = None,
                     log: Log = lambda s: None,
                     settle: Callable[[], MachineState] = default_settle) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole benchmark on a loaded LLM: (JSON report, summary with live objects for printing)."""
    import torch

    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context
    from minillm.roofline.machine_state import probe_machine_state

    engine, tokenizer = llm.engine, llm.tokenizer
    device = llm.config.torch_device
    before = probe_machine_state()
    tpot = measure_tpot(engine, tokenizer, batch_sizes, repeats, max_tokens, log=log, settle=settle)
    schemas = dict(list(COMPILE_SCHEMAS.items())[:num_schemas])
    compile_ = measure_compile(tokenizer, engine.model.config.vocab_size, engine.eos_token_ids, schemas,
                               repeats, log)
    after = probe_machine_state()
    summary = summarize_structured(tpot, compile_, engine.grammars.compiler.compile_seconds)
    settings = {"device": str(device), "dtype": str(llm.config.torch_dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(), "batch_sizes": list(batch_sizes), "repeats": repeats,
                "max_tokens": max_tokens, "prefix_caching": llm.config.enable_prefix_caching,
                "max_num_seqs": llm.config.max_num_seqs,
                "max_num_batched_tokens": llm.config.max_num_batched_tokens, **(settings or {})}
    workload = {"prompts": "chat template, user asks for a fictional person as JSON (bench/structured.py "
                           "person_prompts)", "schema": PERSON_SCHEMA, "decoding": "greedy",
                "plain": "the same prompts, ignore_eos=True, max_tokens = the constrained run's length per request",
                "compared": "median decode-step duration from the step trace (steps with no prefill)",
                "compile_schemas": list(schemas)}
    report = build_report("structured", **report_context(None, device.type), settings=settings, workload=workload,
                          machine_state={"before": before.to_dict(), "after": after.to_dict()},
                          runs=tpot, **summary)
    return report, summary
