"""`minillm bench spec`: speculative decoding's speed-up, acceptance and the batch sizes where it fades.

One model, one engine per proposer (none, n-gram, int4 draft, a separate draft
model, ...), each with its own KV pool; k is changed between runs on the same
engine (LLMEngine.set_num_speculative_tokens), so the draft is built once.
Three workloads:

* chat: open questions, chat-templated; the answer rarely repeats the prompt.
* repeat: the answer quotes its input (repeat a text or code, fix spelling),
  where prompt lookup shines. (The 135M model does not copy reliably when asked
  to *edit* code, so the workload asks it to repeat and correct.)
* code: code completion, a raw function head and docstring (no chat template),
  where a same-family draft model agrees most.

Batch-1 decode speed is read from the step trace: tokens emitted in steps that
hold no prefill, over those steps' wall time (proposals included). Every
configuration runs each prompt in turn, interleaved, so slow drift of the
machine hits them alike. Greedy decoding, so every configuration emits the
same tokens and the comparison is token for token.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from minillm.bench.stats import figure, ratio
from minillm.bench.targets import Target, target
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.trace import StepTrace
from minillm.sampling_params import SamplingParams

Log = Callable[[str], None]

SPEC_BATCH1_SPEEDUP = ("spec_batch1_speedup",
                       "batch-1 decode tok/s with / without speculation: the median over workloads, "
                       "for the proposer and k with the best median", 1.5)
SPEC_DRAFT_MODEL_CODE = ("spec_draft_model_code_speedup",
                         "batch-1 decode tok/s with / without a separate draft model on code completion (best k)", 1.5)
SPEC_MEDUSA_CHAT = ("spec_medusa_chat_speedup",
                    "batch-1 decode tok/s with / without Medusa heads on chat (the best of the Medusa family -- Medusa, Hydra, EAGLE -- and k)", 1.3)

CHAT = (
    "What is the capital of France and why is it famous?",
    "Explain how a rainbow forms.",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
)
PASSAGE = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
           "All that glitters is not gold.")
CODE = "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"
REPEAT = (
    "Repeat the following text exactly: " + PASSAGE,
    "Repeat this code exactly:\n```python\n" + CODE + "```",
    "Correct the spelling in this text and write it out in full: The quik brown fox jumpd over the lazy dog. "
    "A jurney of a thousand miles begins with a singel step.",
    "Repeat the following text exactly: To be, or not to be, that is the question. Whether tis nobler in the mind "
    "to suffer the slings and arrows of outrageous fortune.",
)
COMPLETE = (
    'def binary_search(items, target):\n    """Return the index of target in the sorted list items, or -1."""\n',
    'import math\n\n\ndef is_prime(n: int) -> bool:\n    """Return True if n is a prime number."""\n',
    'def word_counts(text):\n    """Count how often each word occurs in text; return a dict."""\n',
    'class Stack:\n    """A last-in, first-out stack backed by a list."""\n\n    def __init__(self):\n',
)
WORKLOADS = {"chat": CHAT, "repeat": REPEAT, "code": COMPLETE}
RAW_WORKLOADS = ("code",)  # completions of the text itself, no chat template


@dataclass(frozen=True)
class SpecWorkload:
    name: str
    prompts: tuple[str, ...]
    output_len: int = 48
    chat: bool = True  # wrap each prompt in the model's chat template (one user turn)

    def token_ids(self, tokenizer) -> list[list[int]]:
        out = []
        for q in self.prompts:
            text = q if not self.chat else tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            out.append(tokenizer.encode(text, add_special_tokens=False))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sampling": "greedy, stops at end of sequence or output_len",
                "template": "the model's chat template, one user turn" if self.chat else "none: raw completion"}


def _vocab_suffix(name: str) -> tuple[str, dict[str, int]]:
    """"MODEL@N" -> ("MODEL", {"draft_vocab": N}); anything else (a path with "@" in it) unchanged."""
    head, at, n = name.rpartition("@")
    return (head, {"draft_vocab": int(n)}) if at and n.isdigit() and head else (name, {})


LOOKUP_MIN = 3  # +lookup: a suffix of at least 3 tokens seen before (1 or 2 match by chance too often in code)


@dataclass(frozen=True)
class Proposer:
    """A name on the command line: none, ngram, int4, int8, self:N (the target's first N layers),
    draft:MODEL (a separate draft model: a registered name, folder, .gguf file or Hub id),
    draft:MODEL@N (the same, its LM head cut to the N most frequent tokens: draft_vocab=N),
    a +compile suffix on either (draft:MODEL@N+compile: the draft's decode forwards compiled, the target's not),
    a +lookup suffix (prompt lookup first, the draft where it finds nothing: prompt_lookup_min=LOOKUP_MIN),
    medusa (the default model's shipped heads), medusa:FILE (heads from `minillm train-medusa`), either
    with @N (its guesses ranked on the N most frequent tokens' rows: draft_vocab=N), or
    medusa-tree:3x2x1 (the shipped heads' top-k per head verified as a tree: widths per depth; k is its depth),
    or medusa-tree:0/1/2/0-0 (the tree's rank paths: nodes by slashes, ranks by dashes);
    hydra, hydra:FILE, hydra-tree:2x1, with @N as Medusa's: Hydra heads (spec_decode/hydra.py), which also read
    the tokens guessed before them; eagle:FILE, with @N as Medusa's: an EAGLE layer (spec_decode/eagle.py),
    one decoder layer on the target's features that reads the context."""

    name: str

    @property
    def speculative(self) -> dict[str, Any] | None:
        if self.name == "none":
            return None
        if self.name == "ngram":
            return {"method": "ngram", "num_tokens": 1}
        if self.name in ("int4", "int8"):
            return {"method": "draft", "model": self.name, "num_tokens": 1}
        if self.name.startswith("self:") and self.name[5:].isdigit():
            return {"method": "draft", "model": "self", "num_layers": int(self.name[5:]), "num_tokens": 1}
        name, vocab = _vocab_suffix(self.name)
        for kind in ("medusa", "hydra", "eagle"):
            if name == kind or (name.startswith(kind + ":") and name[len(kind) + 1:].strip()):
                heads = None if name == kind else name[len(kind) + 1:].strip()
                if kind == "eagle" and heads is None:
                    raise ValueError("proposer 'eagle' needs a layer file: eagle:FILE (`minillm train-eagle`)")
                return {"method": kind, "heads": heads, "num_tokens": 1, **vocab}
        if self.name.startswith("draft:") and self.name[6:].strip():
            name, extra = self.name[6:].strip(), {}
            suffixes = {"+compile": ("compile", True), "+lookup": ("prompt_lookup_min", LOOKUP_MIN)}
            while (suffix := next((f for f in suffixes if name.endswith(f) and name[: -len(f)]), None)):
                name, (key, value) = name[: -len(suffix)], suffixes[suffix]
                extra[key] = value
            model, vocab = _vocab_suffix(name)
            return {"method": "draft", "model": model, "num_tokens": 1, **vocab, **extra}
        if self.tree_widths is not None:
            return {"method": name.partition("-")[0], "tree": self.tree_widths, **vocab}
        if self.tree_paths is not None:
            return {"method": name.partition("-")[0], "tree": self.tree_paths, **vocab}
        raise ValueError(f"unknown proposer {self.name!r}: use none, ngram, int4, int8, self:N, draft:MODEL[@N][+compile][+lookup], "
                         f"medusa, medusa:FILE, medusa-tree:WxWx.., the same with hydra, or eagle:FILE[@N]")

    @property
    def tree_widths(self) -> list[int] | None:
        head, _, widths = _vocab_suffix(self.name)[0].partition(":")
        parts = widths.split("x")
        if head not in ("medusa-tree", "hydra-tree") or not all(w.isdigit() and int(w) > 0 for w in parts):
            return None
        return [int(w) for w in parts]

    @property
    def tree_paths(self) -> list[list[int]] | None:
        """hydra-tree:0/1/2/0-0: rank paths (Medusa's medusa_choices), nodes by slashes, ranks by dashes."""
        head, _, spec = _vocab_suffix(self.name)[0].partition(":")
        paths = [p.split("-") for p in spec.split("/")]
        if head not in ("medusa-tree", "hydra-tree") or "/" not in spec and "-" not in spec or not all(
                r.isdigit() for p in paths for r in p):
            return None
        return [[int(r) for r in p] for p in paths]

    @property
    def fixed_k(self) -> int | None:
        """A tree's depth is its k: the sweep over k does not apply."""
        if self.tree_widths is not None:
            return len(self.tree_widths)
        return None if self.tree_paths is None else max(len(p) for p in self.tree_paths)

    @property
    def is_draft_model(self) -> bool:
        return self.name.startswith("draft:")

    @property
    def is_medusa(self) -> bool:
        """Drafts on the target's hidden state: Medusa's heads, Hydra's (Medusa heads that read earlier guesses),
        or EAGLE's layer (which also reads the context)."""
        return self.name.partition(":")[0].partition("@")[0] in ("medusa", "medusa-tree", "hydra", "hydra-tree",
                                                                 "eagle")


@dataclass
class RunStats:
    """One run's decode figures from its steps."""

    decode_tokens: int = 0
    decode_s: float = 0.0
    proposed: int = 0
    accepted: int = 0
    verifies: int = 0  # (sequence, step) pairs that verified at least one proposal
    emitted_in_verifies: int = 0
    step_s: list[float] = field(default_factory=list)  # decode / verify steps' wall times
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, steps: list[StepTrace]) -> None:
        for s in steps:
            if s.num_prefill_tokens == 0 and s.new_tokens:
                self.decode_tokens += sum(len(n.token_ids) for n in s.new_tokens)
                self.decode_s += s.duration_s
                self.step_s.append(s.duration_s)
            for r in s.spec:
                self.proposed += r.num_proposed
                self.accepted += r.num_accepted
                if r.num_proposed:
                    self.verifies += 1
                    self.emitted_in_verifies += r.num_emitted


def build_engines(model, tokenizer, eos_token_ids, proposers: list[str], kv_cache_bytes: int,
                  max_num_seqs: int = 64, **options) -> dict[str, LLMEngine]:
    """One engine per proposer on the same model; options: more EngineConfig fields (quantization, compile)."""
    from minillm.engine.config import EngineConfig

    return {
        p: LLMEngine(model, tokenizer, eos_token_ids,
                     EngineConfig(kv_cache_memory_bytes=kv_cache_bytes, enable_prefix_caching=False,
                                  max_num_seqs=max_num_seqs, max_num_batched_tokens=2048,
                                  speculative=Proposer(p).speculative, **options))
        for p in proposers
    }


def run_batch(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], list[StepTrace]]:
    first = len(engine.trace)
    base = f"spec-bench-{first}-"
    for i, p in enumerate(prompts):
        engine.add_request(f"{base}{i}", p, SamplingParams(temperature=0.0, max_tokens=output_len))
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
    return [done[f"{base}{i}"] for i in range(len(prompts))], engine.trace[first:]


def configs(proposers: list[str], ks: list[int]) -> list[tuple[str, int]]:
    out = [(p, 0) for p in proposers if p == "none"]
    for p in proposers:
        if p != "none":
            fixed = Proposer(p).fixed_k
            out += [(p, fixed)] if fixed else [(p, k) for k in ks]
    return out


def takes_k(engine: LLMEngine, name: str, k: int, log: Log) -> bool:
    """Whether the proposer can guess k tokens: k beyond it (two Hydra heads at k = 3) is left out and
    logged, not silently capped."""
    if not k or engine.config.speculative is None or Proposer(name).fixed_k:
        return True
    try:
        engine.proposer.check_num_tokens(k)
    except ValueError as err:
        log(f"{name} at k={k} left out: {err}")
        return False
    return True


def measure_batch1(engines: dict[str, LLMEngine], workload: SpecWorkload, prompts: list[list[int]], ks: list[int],
                   repeats: int = 1, log: Log = lambda s: None) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (proposer, k): decode tok/s per prompt and repeat, acceptance, tokens per verify."""
    cfgs = [(name, k) for name, k in configs(list(engines), ks) if takes_k(engines[name], name, k, log)]
    stats = {c: RunStats() for c in cfgs}
    speeds: dict[tuple[str, int], list[float]] = {c: [] for c in cfgs}
    for name, k in cfgs:  # warm-up at each k: allocations, oneDNN primitives, a compiled draft's graphs
        e = engines[name]
        if k and not Proposer(name).fixed_k:
            e.set_num_speculative_tokens(k)
        run_batch(e, prompts[:1], 4 * (k + 1))
    for r in range(repeats):
        for i, p in enumerate(prompts):
            order = cfgs if (r + i) % 2 == 0 else list(reversed(cfgs))
            for name, k in order:
                e = engines[name]
                if k and not Proposer(name).fixed_k:
                    e.set_num_speculative_tokens(k)
                (out,), steps = run_batch(e, [p], workload.output_len)
                one = RunStats()
                one.add(steps)
                stats[(name, k)].add(steps)
                stats[(name, k)].outputs.append(out)
                if one.decode_s > 0:
                    speeds[(name, k)].append(one.decode_tokens / one.decode_s)
            log(f"{workload.name} repeat {r} prompt {i}: " + ", ".join(
                f"{n}{'/k=' + str(k) if k else ''} {speeds[(n, k)][-1]:.1f}" for n, k in cfgs if speeds[(n, k)]))
    ref = stats[cfgs[0]].outputs
    return {c: {"proposer": c[0], "k": c[1], "decode_tok_per_s": figure("tok/s", speeds[c]),
                "acceptance_rate": ratio(s.accepted, s.proposed),
                "mean_accepted": ratio(s.accepted, s.verifies),
                "tokens_per_verify": ratio(s.emitted_in_verifies, s.verifies),
                "step_ms": figure("ms", [t * 1e3 for t in s.step_s]).median if s.step_s else None,
                "proposed": s.proposed, "accepted": s.accepted,
                "same_tokens_as_first_config": s.outputs == ref}
            for c, s in stats.items()}


def measure_batch_scaling(engines: dict[str, LLMEngine], workload: SpecWorkload, prompts: list[list[int]],
                          batch_sizes: list[int], k: int, log: Log = lambda s: None) -> dict[str, dict[int, float]]:
    """Decode tok/s of the whole batch per proposer (all at the same k) and batch size."""
    out: dict[str, dict[int, float]] = {name: {} for name, e in engines.items() if takes_k(e, name, k, log)}
    for b in batch_sizes:
        batch = [prompts[i % len(prompts)] for i in range(b)]
        for name in out:
            e = engines[name]
            if e.config.speculative is not None and not Proposer(name).fixed_k:
                e.set_num_speculative_tokens(k)
            _, steps = run_batch(e, batch, workload.output_len)
            s = RunStats()
            s.add(steps)
            out[name][b] = s.decode_tokens / s.decode_s if s.decode_s else float("nan")
            log(f"{workload.name} batch {b:3d} {name:8s} k={k}: {out[name][b]:.1f} tok/s")
    return out


def summarize_spec(batch1: dict[str, dict], scaling: dict[str, dict[str, dict[int, float]]]) -> dict[str, Any]:
    """Speed-ups over the no-speculation run of the same workload; per (proposer, k) the median over
    workloads; the best of those medians is the target's figure (one setting that must serve every
    workload, not the best cell). A separate draft model also has its own target on code completion,
    Medusa on chat."""
    import statistics

    rows, per_config = [], {}
    for wl, res in batch1.items():
        base = res[("none", 0)]["decode_tok_per_s"].median
        base_step = res[("none", 0)]["step_ms"]
        for (name, k), r in res.items():
            sp = ratio(r["decode_tok_per_s"].median, base)
            # a step's cost in plain decode steps: speed-up = tokens per step / this
            rows.append({"workload": wl, **r, "speedup": sp, "step_cost_vs_decode": ratio(r["step_ms"], base_step)})
            if name != "none" and sp is not None:
                per_config.setdefault((name, k), {})[wl] = sp
    medians = [{"proposer": n, "k": k, "median_speedup": statistics.median(by.values()), "by_workload": by}
               for (n, k), by in per_config.items()]
    best = max(medians, key=lambda m: m["median_speedup"], default=None)
    code = [r for r in rows if r["workload"] == "code" and Proposer(r["proposer"]).is_draft_model
            and r["speedup"] is not None]
    best_code = max(code, key=lambda r: r["speedup"], default=None)
    chat = [r for r in rows if r["workload"] == "chat" and Proposer(r["proposer"]).is_medusa
            and r["speedup"] is not None]
    best_chat = max(chat, key=lambda r: r["speedup"], default=None)
    gains = {wl: {name: {b: ratio(v, per["none"][b]) for b, v in per[name].items()}
                  for name in per if name != "none"} for wl, per in scaling.items() if "none" in per}
    targets: list[Target] = [target(SPEC_BATCH1_SPEEDUP, best["median_speedup"] if best else None)]
    if best_code is not None:
        targets.append(target(SPEC_DRAFT_MODEL_CODE, best_code["speedup"]))
    if best_chat is not None:
        targets.append(target(SPEC_MEDUSA_CHAT, best_chat["speedup"]))
    return {"batch1": rows, "best": best, "median_over_workloads": medians,
            "best_draft_model_on_code": None if best_code is None else
            {"proposer": best_code["proposer"], "k": best_code["k"], "speedup": best_code["speedup"],
             "acceptance_rate": best_code["acceptance_rate"]},
            "best_medusa_on_chat": None if best_chat is None else
            {"proposer": best_chat["proposer"], "k": best_chat["k"], "speedup": best_chat["speedup"],
             "acceptance_rate": best_chat["acceptance_rate"]},
            "batch_scaling_tok_per_s": scaling, "batch_scaling_speedup": gains, "targets": targets}


def format_spec(summary: dict[str, Any]) -> str:
    from minillm.bench.report import format_targets

    lines = ["speculative decoding, batch-1 greedy decode (median tok/s, speed-up, acceptance, tokens per verify, "
             "median step time / plain decode step)"]
    for r in summary["batch1"]:
        acc = r["acceptance_rate"]
        tpv = r["tokens_per_verify"]
        lines.append(f"  {r['workload']:6s} {r['proposer']:8s} k={r['k']}  {r['decode_tok_per_s'].median:6.1f} tok/s  "
                     f"x{(r['speedup'] or float('nan')):.2f}  acc {'-' if acc is None else f'{acc:.2f}'}  "
                     f"tok/verify {'-' if tpv is None else f'{tpv:.2f}'}  "
                     f"step cost x{(r['step_cost_vs_decode'] or float('nan')):.2f}"
                     + ("" if r["same_tokens_as_first_config"] else "  (OUTPUT DIFFERS)"))
    for wl, per in summary["batch_scaling_speedup"].items():
        for name, by_b in per.items():
            lines.append(f"  {wl} {name}: speed-up by batch " + ", ".join(
                f"{b}: x{v:.2f}" for b, v in by_b.items() if v is not None))
    lines += format_targets(summary["targets"])
    return "\n".join(lines)

