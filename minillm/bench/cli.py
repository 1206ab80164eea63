"""`minillm bench {latency,throughput,serve,prefix,spec,structured,tp,quant,roofs}`: argument parsing and model loading.

    python -m minillm.bench latency --compare transformers,llama.cpp --json latency.json
    python -m minillm.bench throughput --compare transformers --num-requests 128
    python -m minillm.bench serve --num-requests 32 --max-concurrency 8
    python -m minillm.bench serve --workload mixed --policies fcfs,priority,length-aware --json mixed.json
    python -m minillm.bench prefix --prefix-len 1024
    python -m minillm.bench prefix --workload chat --json chat.json   # multi-turn: none vs hash vs radix
    python -m minillm.bench spec --json spec.json
    python -m minillm.bench structured --batch 1 32 --repeats 3 --json structured.json
    python -m minillm.bench tp --tp 3 --json tp.json
    python -m minillm.bench roofs --remeasure
    python -m minillm.bench quant --settings float,int8,int4,gguf --json quant.json
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Any

import torch

from minillm.roofline.machine_state import QUIET_STALL_RATIO, settle
from minillm.bench.report import format_latency, format_roofs, format_throughput, write_json
from minillm.bench.workload import LatencyWorkload, ThroughputWorkload

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


PEERS = ("transformers", "llama.cpp")


def _peer_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in PEERS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown peer {', '.join(bad) or repr(text)}; choose from {', '.join(PEERS)}")
    return names


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo id, or a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--compare", type=_peer_list, action="append", default=[],
                   help="also run these peers on the same workload, interleaved: transformers, llama.cpp "
                        "(repeat the flag or give a comma list: --compare transformers,llama.cpp)")
    p.add_argument("--repack", choices=["0", "1", "both"], default="both",
                   help="llama.cpp's runtime weight repacking (use_extra_bufts): off, on, or both as two peers")
    p.add_argument("--hf-cache", choices=["dynamic", "static"], default="dynamic",
                   help="transformers' KV cache implementation")
    p.add_argument("--threads", type=int, default=None, help="torch threads for every subject (default: torch's)")
    p.add_argument("--compile", action="store_true", help="minillm with torch.compile'd decode steps")
    p.add_argument("--cpu-decode-step", choices=["auto", "off"], default="auto",
                   help="minillm's one-region C++ decode step on a CPU (minillm/cpu/decode_step.py): where it "
                        "applies (auto), or off (op by op, or the compiled graph with --compile)")
    p.add_argument("--quantization", choices=["int8", "int4", "int4-awq", "gptq", "w8a8", "fp8", "gguf"], default=None,
                   help="minillm's weight-only quantization (peers keep their own weights)")
    p.add_argument("--quantize-lm-head", action="store_true", help="minillm's LM head in int8 too")
    p.add_argument("--json", dest="json_out", default=None, help="write the full report here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--remeasure-roofs", action="store_true", help="measure the machine roofs again")
    p.add_argument("--no-roofs", action="store_true", help="skip the roofs (no bandwidth fraction)")
    p.add_argument("--quiet", action="store_true", help="no per-repeat log lines")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="before each repeat wait up to this long for other tenants' load to stop "
                        "stalling multi-threaded ops (the probe is recorded either way)")


def _model_args(p: argparse.ArgumentParser) -> None:
    """The model, dtype and device flags every minillm-only sub-benchmark takes."""
    p.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo id, or a GGUF file (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--device", default=None)


def _run_args(p: argparse.ArgumentParser) -> None:
    """Threads, seed, log and JSON output flags of the minillm-only sub-benchmarks."""
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--json", dest="json_out", default=None)


def build_parser() -> argparse.ArgumentParser:
    from minillm.bench.quant import DEFAULT_SETTINGS as QUANT_SETTINGS

    parser = argparse.ArgumentParser(prog="minillm bench", description="Measure minillm, optionally beside peers.")
    sub = parser.add_subparsers(dest="command", required=True)

    lat = sub.add_parser("latency", help="batch-1 decode tok/s and 1k-token prefill time")
    _common(lat)
    lat.add_argument("--prompt-len", type=int, default=32)
    lat.add_argument("--output-len", type=int, default=128)
    lat.add_argument("--prefill-len", type=int, default=1024)
    lat.add_argument("--repeats", type=int, default=5, help="decode repeats per subject")
    lat.add_argument("--prefill-repeats", type=int, default=3)

    thr = sub.add_parser("throughput", help="many requests at once: output and total tok/s, TTFT/TPOT percentiles")
    _common(thr)
    thr.add_argument("--num-requests", type=int, default=128)
    thr.add_argument("--prompt-len-range", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    thr.add_argument("--output-len-range", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    thr.add_argument("--repeats", type=int, default=1)
    thr.add_argument("--max-num-seqs", type=int, default=128)
    thr.add_argument("--max-num-batched-tokens", type=int, default=2048)
    thr.add_argument("--hf-batch-size", type=int, nargs="+", default=[8, 16, 32, 64],
                     help="transformers' static batch sizes, swept by default: one peer each (transformers-bN), "
                          "and the target compares with the best of them (a static batcher is only as good as "
                          "its batch size); one value runs one peer")

    srv = sub.add_parser("serve", help="concurrent streaming clients against a live OpenAI-compatible server: "
                                       "TTFT/TPOT/ITL/e2e percentiles, request throughput")
    srv.add_argument("--url", default=None, help="a running server (e.g. http://127.0.0.1:8000); "
                                                 "default: start minillm's server in this process on a free loopback port")
    srv.add_argument("--served-model-name", default=None, help="the model name the server expects (with --url)")
    srv.add_argument("--vocab-size", type=int, default=None, help="prompt token ids are drawn below this (with --url)")
    _model_args(srv)
    srv.add_argument("--num-requests", type=int, default=64)
    srv.add_argument("--prompt-len-range", type=int, nargs=2, default=[32, 384], metavar=("MIN", "MAX"))
    srv.add_argument("--output-len-range", type=int, nargs=2, default=[16, 192], metavar=("MIN", "MAX"))
    srv.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second (default: all at once)")
    srv.add_argument("--max-concurrency", type=int, default=32, help="requests in flight at most")
    srv.add_argument("--workload", choices=["uniform", "mixed"], default="uniform",
                     help="uniform: the lengths above; mixed: many short chats + a few long generations, "
                          "per class and per --policies (bench/serve_mixed.py)")
    srv.add_argument("--policies", default="fcfs,priority,length-aware",
                     help="mixed: scheduling policies to run one after another in this process (comma list)")
    srv.add_argument("--num-short", type=int, default=None, help="mixed: short chats (default 24)")
    srv.add_argument("--num-long", type=int, default=None, help="mixed: long generations (default 5)")
    srv.add_argument("--short-output-len-range", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                     help="mixed: default 8 24")
    srv.add_argument("--long-output-len-range", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                     help="mixed: default 96 128")
    srv.add_argument("--max-num-seqs", type=int, default=None, help="default: 128 (uniform), 4 (mixed)")
    srv.add_argument("--max-num-batched-tokens", type=int, default=2048)
    srv.add_argument("--kv-cache-mb", type=int, default=None)
    srv.add_argument("--threads", type=int, default=None)
    srv.add_argument("--seed", type=int, default=0)
    srv.add_argument("--json", dest="json_out", default=None)

    pre = sub.add_parser("prefix", help="TTFT with prefix caching on vs off for a long shared system prompt; "
                                        "--workload chat: a multi-turn chat, no cache vs hash vs radix")
    _model_args(pre)
    pre.add_argument("--workload", choices=["system", "chat"], default="system",
                     help="system: one shared system prompt, turns one at a time, cache on vs off; chat: interleaved "
                          "multi-turn conversations on a pool that must evict, none vs hash vs radix")
    pre.add_argument("--prefix-len", type=int, default=None, help="the shared system prompt (default 1024; chat 256)")
    pre.add_argument("--num-turns", type=int, default=None, help="user turns (default 8; chat: 4 per conversation)")
    pre.add_argument("--turn-len-range", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"))
    pre.add_argument("--conversations", type=int, default=12, help="chat: conversations")
    pre.add_argument("--answer-len", type=int, default=32, help="chat: tokens generated per turn")
    pre.add_argument("--concurrency", type=int, default=4, help="chat: turns in flight at once")
    pre.add_argument("--pool-fraction", type=float, default=0.5,
                     help="chat: the KV pool as a fraction of every conversation's final turn at once")
    _run_args(pre)

    spc = sub.add_parser("spec", help="speculative decoding: batch-1 speed-up, acceptance and tokens per verify "
                                      "per proposer and k, on a chat and a repeat-the-input workload; gain vs batch")
    _model_args(spc)
    spc.add_argument("--proposers", default="none,ngram,int4",
                     help="comma list: none (always first), ngram, int4, int8, self:N (first N layers), "
                          "draft:MODEL (a separate draft model with the target's tokenizer; draft:MODEL@N: its LM "
                          "head cut to the N most frequent tokens), medusa (the default model's "
                          "shipped heads), medusa:FILE or medusa-tree:3x2x1 (their top-k per head as a tree; k is its depth), "
                          "hydra, hydra:FILE, hydra-tree:2x1 (Hydra heads, which also read the earlier guesses), "
                          "eagle:FILE (an EAGLE layer from `minillm train-eagle`: one decoder layer on the "
                          "target's features that reads the context); @N on medusa, hydra or eagle ranks guesses on N tokens' rows")
    spc.add_argument("--ks", type=int, nargs="+", default=list(range(1, 9)), help="draft lengths k to sweep")
    spc.add_argument("--workloads", nargs="+", choices=["chat", "repeat", "code"], default=["chat", "repeat", "code"])
    spc.add_argument("--quantization", default=None, help="the target's (and by default a draft model's) "
                                                          "weight quantization, e.g. gguf")
    spc.add_argument("--compile", action="store_true", help="decode steps (the draft's too) through torch.compile")
    spc.add_argument("--num-prompts", type=int, default=4, help="prompts per workload (at most 4)")
    spc.add_argument("--output-len", type=int, default=48)
    spc.add_argument("--repeats", type=int, default=1)
    spc.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 4, 16])
    spc.add_argument("--batch-k", type=int, default=4, help="k for the batch-size sweep")
    _run_args(spc)

    sto = sub.add_parser("structured", help="structured outputs: TPOT with a JSON schema vs the same requests "
                                            "without, per batch size; grammar compile time per schema, cold and cached")
    sto.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo "
                                                   "id, or a GGUF file (default: SmolLM2-135M-Instruct)")
    sto.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto",
                     help="default: LLM()'s own (auto: float32 on a CPU, bfloat16 on CUDA)")
    sto.add_argument("--device", default=None)
    sto.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="batch sizes (requests at once)")
    sto.add_argument("--repeats", type=int, default=3, help="plain/constrained pairs per batch size, interleaved; "
                                                            "also fresh compilers for the compile figures")
    sto.add_argument("--max-tokens", type=int, default=256, help="a cap on each constrained output (the schema "
                                                                 "bounds it first)")
    sto.add_argument("--num-schemas", type=int, default=None,
                     help="compile only the first N of the built-in schemas (default: all)")
    sto.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                     help="before each run wait up to this long for other tenants' load to stop stalling "
                          "multi-threaded ops (the probe is recorded either way)")
    _run_args(sto)

    tp = sub.add_parser("tp", help="tensor parallelism: per-step all-reduce bytes and time here, and an "
                                   "analytic speed-up model for Llama-2-7B/70B over NVLink vs PCIe")
    _model_args(tp)
    tp.add_argument("--tp", type=int, default=3, help="ranks to compare with one (must divide the heads; default 3)")
    tp.add_argument("--num-prompts", type=int, default=4)
    tp.add_argument("--prompt-len", type=int, default=64)
    tp.add_argument("--output-len", type=int, default=16)
    tp.add_argument("--timeout", type=float, default=120.0, help="seconds rank 0 waits in a collective")
    tp.add_argument("--bare-repeats", type=int, default=30,
                    help="also time bare gloo all-reduces of the same payloads this many times (0: skip)")
    tp.add_argument("--threads", type=int, default=None)
    tp.add_argument("--seed", type=int, default=0)
    tp.add_argument("--json", dest="json_out", default=None)

    qnt = sub.add_parser("quant", help="weight/KV quantization: batch-1 decode tok/s per setting, bytes per "
                                       "token and the bandwidth roof of each")
    qnt.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo id, or a GGUF file (default: SmolLM2-135M-Instruct)")
    qnt.add_argument("--settings", default=",".join(QUANT_SETTINGS),
                     help="comma list: float, int8, int4, int4-awq, gptq, w8a8, fp8, gguf, head8 (int8 LM head), "
                          "kv-int8, kv-fp8, joined with '+'")
    qnt.add_argument("--group-size", type=int, default=None, help="int4 group size: 32, 64, 128 or 256 (default 32)")
    qnt.add_argument("--prompt-len", type=int, default=32)
    qnt.add_argument("--output-len", type=int, default=64)
    qnt.add_argument("--prefill-len", type=int, default=256, help="tokens of the timed prefill prompt (0: no prefill)")
    qnt.add_argument("--quality-windows", type=int, default=2,
                     help="perplexity/agreement on this many windows of the eval text (0: skip)")
    qnt.add_argument("--quality-len", type=int, default=256, help="tokens per quality window")
    qnt.add_argument("--throughput-requests", type=int, default=16,
                     help="batched throughput: this many requests (prompts 16-128, outputs 16-64 tokens, all at "
                          "once) per setting (0: skip)")
    qnt.add_argument("--tasks", choices=["auto", "code", "facts", "none"], default="auto",
                     help="task suite each setting answers (minillm eval tasks): auto = code for a Qwen2.5-Coder "
                          "model, facts for one with a chat template, else none")
    qnt.add_argument("--task-limit", type=int, default=None, help="only the first N items of the suite")
    qnt.add_argument("--repeats", type=int, default=3)
    qnt.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                     help="the float model's dtype: the 'float' row and what every setting quantizes from")
    qnt.add_argument("--sequential", choices=["auto", "on", "off"], default="auto",
                     help="on: one setting's model copy at a time (measured whole, then freed); off: all held at "
                          "once, decode repeats interleaved; auto: on when one copy per setting would not fit in "
                          "half the memory available")
    qnt.add_argument("--llama-cpp", choices=["auto", "off"], default="auto",
                     help="auto: llama.cpp decodes the same GGUF in this run when llama-cpp-python is installed "
                          "(a ratio is shown only then); off: never")
    qnt.add_argument("--repack", choices=["0", "1", "both"], default="both",
                     help="llama.cpp's runtime weight repacking (use_extra_bufts): off, on, or both as two peers")
    qnt.add_argument("--threads", type=int, default=None)
    qnt.add_argument("--seed", type=int, default=0)
    qnt.add_argument("--remeasure-roofs", action="store_true")
    qnt.add_argument("--no-roofs", action="store_true")
    qnt.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS")
    qnt.add_argument("--quiet", action="store_true")
    qnt.add_argument("--json", dest="json_out", default=None)

    roofs = sub.add_parser("roofs", help="measure (or show the cached) bandwidth and matmul roofs")
    roofs.add_argument("--device", default=None)
    roofs.add_argument("--remeasure", action="store_true")
    roofs.add_argument("--threads", type=int, default=None)
    roofs.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                       help="first wait up to this long for a quiet machine")
    roofs.add_argument("--json", dest="json_out", default=None)
    return parser


def subcommands() -> list[str]:
    """The names `minillm bench` takes, in the order of its parser (`minillm --help` lists them)."""
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def _device(args: argparse.Namespace) -> str:
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _roofs(args: argparse.Namespace, device: str):
    from minillm.roofline.roofs import get_roofs

    if getattr(args, "no_roofs", False):
        return None
    _log("machine roofs: " + ("measuring" if args.remeasure_roofs else "cached or measuring"))
    roofs = get_roofs(device, remeasure=args.remeasure_roofs, wait_quiet_s=args.wait_quiet)
    _log(format_roofs(roofs))
    return roofs


def _subjects(args: argparse.Namespace, device: str, kv_bytes: int | None = None, float_llama_cpp: bool = False,
              **engine_kw: Any) -> list:
    """minillm and the --compare peers. float_llama_cpp (batch-1 latency): where minillm runs float weights,
    llama.cpp runs the same weights in that dtype (the bytes a decode step reads are the comparison);
    elsewhere llama.cpp runs the GGUF as shipped (quantized: its faster setting for batched throughput)."""
    from minillm.bench.minillm_subject import load_minillm

    _log(f"loading minillm ({args.dtype}, {device})")
    subjects = [load_minillm(args.model, args.dtype, device, kv_bytes, compile=args.compile,
                             quantization=args.quantization, quantize_lm_head=args.quantize_lm_head,
                             cpu_decode_step=None if args.cpu_decode_step == "auto" else False, **engine_kw)]
    args.minillm_subject = subjects[0]  # its fast path and the paths its steps took: the report records them
    if "transformers" in args.compare:
        from minillm.bench.hf_subject import load_transformers

        _log(f"loading transformers ({args.dtype}, {device})")
        cache = None if args.hf_cache == "dynamic" else args.hf_cache
        sizes = getattr(args, "hf_batch_size", [8, 16, 32, 64])
        sizes = [sizes] if isinstance(sizes, int) else list(sizes)
        hf = load_transformers(args.model, DTYPES[args.dtype], device, cache, sizes[0])
        if len(sizes) == 1:
            subjects.append(hf)
        else:  # one loaded model, a peer per batch size (a static batcher is only as good as its batch size)
            subjects += [dataclasses.replace(hf, batch_size=b, name=f"transformers-b{b}") for b in sizes]
    if "llama.cpp" in args.compare:
        floats = float_llama_cpp and args.quantization is None
        subjects += _llama_cpp_subjects(args, float_dtype=args.dtype if floats else None)
    return subjects


def _llama_cpp_subjects(args: argparse.Namespace, float_dtype: str | None = None) -> list:
    """llama.cpp on the same GGUF, repack on and/or off; a clear message (and no peer) when it can't run.
    float_dtype (float32, bfloat16): minillm runs float weights, so llama.cpp runs that dtype's copy."""
    from minillm.bench.hf_subject import resolve_model_path
    from minillm.bench.llamacpp_subject import (FLOAT_FTYPES, float_gguf, llama_cpp_available, load_llama_cpp,
                                                probe_llama_cpp)

    ok, why = llama_cpp_available()
    if not ok:
        _log(why)
        args.peer_notes["llama.cpp"] = why
        return []
    folder, gguf = resolve_model_path(args.model)
    if gguf is None:
        args.peer_notes["llama.cpp"] = f"llama.cpp peer skipped: it needs a GGUF file, got the folder {folder}"
        _log(args.peer_notes["llama.cpp"])
        return []
    path, label, settings = f"{folder}/{gguf}", "llama.cpp", {"0": [False], "1": [True], "both": [True, False]}[args.repack]
    if float_dtype in FLOAT_FTYPES:
        # float minillm reads float weights: llama.cpp on the same weights in the same dtype (a copy its own
        # quantizer writes once), one peer (weight repacking is for quantized types only)
        try:
            path = float_gguf(path, float_dtype)
        except Exception as e:
            args.peer_notes["llama.cpp"] = f"no {float_dtype} copy of {gguf} for llama.cpp: {type(e).__name__}: {e}"
            _log(args.peer_notes["llama.cpp"])
            return []
        gguf, label, settings = os.path.basename(path), f"llama.cpp-{float_dtype}", [True]
    args.llama_cpp_gguf = gguf  # recorded in the settings (_llama_cpp_settings)
    out = []
    for repack in settings:
        _log(f"loading llama.cpp ({gguf}, repack {'on' if repack else 'off'})")
        crashed = probe_llama_cpp(path, repack, torch.get_num_threads())
        if crashed:  # e.g. the AMX repack path of some builds: that setting is off for this run
            args.peer_notes[f"llama.cpp repack={int(repack)}"] = f"turned off: {crashed}"
            _log(args.peer_notes[f"llama.cpp repack={int(repack)}"])
            continue
        try:
            out.append(load_llama_cpp(path, repack, torch.get_num_threads(),
                                      max_num_seqs=getattr(args, "max_num_seqs", 64),
                                      # the same per-step token budget as minillm's scheduler
                                      n_batch=getattr(args, "max_num_batched_tokens", 512),
                                      name=None if label == "llama.cpp" else label))
        except Exception as e:  # a broken build must not stop the other subjects
            args.peer_notes[f"llama.cpp repack={int(repack)}"] = f"failed to load: {type(e).__name__}: {e}"
            _log(args.peer_notes[f"llama.cpp repack={int(repack)}"])
    return out


def _settings(args: argparse.Namespace, device: str) -> dict[str, Any]:
    return {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "device": device,
            "threads": torch.get_num_threads(), "compare": list(args.compare), "hf_cache": args.hf_cache,
            "prefix_caching": False, "compile": args.compile, "seed": args.seed, "wait_quiet_s": args.wait_quiet,
            "quantization": args.quantization, "quantize_lm_head": args.quantize_lm_head,
            **_llama_cpp_settings(args)}


def _paths(args: argparse.Namespace, report: dict[str, Any]) -> dict[str, Any]:
    """The report with minillm's fast path (start-up choices included) and the paths its steps took."""
    subject = getattr(args, "minillm_subject", None)
    if subject is not None:
        report["settings"]["fast_path"] = subject.fast_path()
        report["settings"]["decode_path"] = subject.decode_path()
    return report


def _llama_cpp_settings(args: argparse.Namespace) -> dict[str, Any]:
    """How llama.cpp was driven, its version and build, and why it did not run (when it didn't)."""
    if "llama.cpp" not in args.compare:
        return {}
    from minillm.bench.llamacpp_subject import DRIVEN, llama_cpp_version, system_info

    return {"llama_cpp": {"version": llama_cpp_version(), "driven": DRIVEN, "repack": args.repack,
                          "gguf": getattr(args, "llama_cpp_gguf", None), "system_info": system_info(),
                          "notes": dict(args.peer_notes)}}


def _latency(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.runner import latency_report

    device = _device(args)
    roofs = _roofs(args, device)
    subjects = _subjects(args, device, float_llama_cpp=True)
    wl = LatencyWorkload(args.prompt_len, args.output_len, args.prefill_len, args.seed)
    report, summary = latency_report(
        subjects, subjects[0].config, DTYPES[args.dtype], wl, roofs, _settings(args, device),
        args.repeats, args.prefill_repeats, device=device, log=(lambda s: None) if args.quiet else _log,
        settle=functools.partial(settle, args.wait_quiet),
    )
    print(format_latency(summary))
    return _paths(args, report)


def _throughput(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.minillm_subject import kv_bytes_for
    from minillm.bench.runner import throughput_report

    device = _device(args)
    roofs = _roofs(args, device)
    wl = ThroughputWorkload(args.num_requests, tuple(args.prompt_len_range), tuple(args.output_len_range), args.seed)
    subjects = _subjects(args, device, None, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens)
    # Size minillm's KV pool to hold every request at once, so the run measures batching, not preemption.
    cfg = subjects[0].config
    prompts, outs = wl.requests(cfg.vocab_size)
    kv_dtype = subjects[0].engine.executor.plan.dtype
    subjects[0].resize_kv_cache(kv_bytes_for(cfg, kv_dtype, [len(p) + n for p, n in zip(prompts, outs)]))
    settings = {**_settings(args, device), "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_num_batched_tokens, "hf_batch_size": args.hf_batch_size,
                "kv_cache_bytes": subjects[0].engine.executor.kv_cache_bytes}
    report, summary = throughput_report(
        subjects, cfg, DTYPES[args.dtype], wl, roofs, settings, args.repeats, device=device,
        log=(lambda s: None) if args.quiet else _log, settle=functools.partial(settle, args.wait_quiet),
    )
    print(format_throughput(summary))
    return _paths(args, report)


def _serve(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.extras import SERVER_MODULES, require

    # the clients need httpx; serving in-process needs the server itself
    require("minillm bench serve", "server", ("httpx",) + (() if args.url else SERVER_MODULES))
    from minillm.bench.report import build_report, format_serve
    from minillm.bench.serve import ServeWorkload, bench_serve
    from minillm.roofline.machine import machine_info

    device = _device(args)
    if args.workload == "mixed":
        return _serve_mixed(args, device)
    args.max_num_seqs = args.max_num_seqs or 128
    wl = ServeWorkload(args.num_requests, tuple(args.prompt_len_range), tuple(args.output_len_range),
                       args.request_rate, args.max_concurrency, args.seed)
    settings: dict[str, Any] = {"threads": torch.get_num_threads(), "seed": args.seed}
    if args.url:
        name = args.served_model_name or "SmolLM2-135M-Instruct"
        summary = bench_serve(args.url, name, wl, args.vocab_size or 49152)
        settings.update(server=args.url, model=name, in_process=False)
    else:
        from minillm import LLM
        from minillm.server.app import create_app
        from minillm.server.background import ServerThread

        _log(f"loading minillm ({args.dtype}, {device}) and serving it on loopback")
        llm = LLM(args.model, dtype=args.dtype, device=device, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False,
                  kv_cache_memory_bytes=None if args.kv_cache_mb is None else args.kv_cache_mb * 2**20)
        name = "minillm-bench"
        with ServerThread(create_app(llm.engine, llm.tokenizer, name)) as srv:
            _log(f"server at {srv.url}; {wl.num_requests} requests, {wl.max_concurrency} in flight at most")
            summary = bench_serve(srv.url, name, wl, llm.engine.model.config.vocab_size)
        settings.update(server="in-process uvicorn on loopback (clients share the process)", in_process=True,
                        model=args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)",
                        dtype=args.dtype, device=device, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, prefix_caching=False)
    from minillm.bench.runner import report_context

    report = build_report("serve", **report_context(None, device), settings=settings, workload=wl.to_dict(), **summary)
    print(format_serve(summary))
    return report


def _prefix_chat(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.minillm_subject import load_minillm
    from minillm.bench.prefix_chat import ChatWorkload, chat_engines, format_chat, measure_chat, summarize_chat
    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context

    device = _device(args)
    wl = ChatWorkload(args.prefix_len or 256, args.conversations, args.num_turns or 4, tuple(args.turn_len_range),
                      args.answer_len, args.concurrency, args.pool_fraction, args.seed)
    _log(f"loading minillm ({args.dtype}, {device})")
    subject = load_minillm(args.model, args.dtype, device)
    cfg = subject.config
    bs = subject.engine.config.block_size
    blocks = wl.pool_blocks(cfg.vocab_size, bs)
    engines = chat_engines(subject.engine, blocks)
    raw = measure_chat(engines, wl, cfg.vocab_size, log=(lambda s: None) if args.quiet else _log)
    summary = summarize_chat(raw)
    settings = {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "dtype": args.dtype,
                "device": device, "threads": torch.get_num_threads(), "seed": args.seed, "block_size": bs,
                "num_kv_blocks": blocks, "final_turn_blocks": sum(-(-n // bs) for n in wl.final_lengths(cfg.vocab_size)),
                "max_num_batched_tokens": subject.engine.config.max_num_batched_tokens}
    report = build_report("prefix", **report_context(None, device), settings=settings, workload=wl.to_dict(), **summary)
    print(format_chat(summary))
    return report


def _serve_mixed(args: argparse.Namespace, device: str) -> dict[str, Any]:
    from minillm import LLM
    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context
    from minillm.bench.serve_mixed import MixedWorkload, format_mixed, measure_policies, parse_policies
    from minillm.engine.llm_engine import LLMEngine

    if args.url:
        raise SystemExit("minillm bench serve --workload mixed starts its own engine per policy; drop --url")
    try:
        policies = parse_policies(args.policies)
        given = {"num_short": args.num_short, "num_long": args.num_long, "max_concurrency": args.max_concurrency,
                 "short_output_len_range": args.short_output_len_range and tuple(args.short_output_len_range),
                 "long_output_len_range": args.long_output_len_range and tuple(args.long_output_len_range)}
        wl = MixedWorkload(seed=args.seed, **{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        raise SystemExit(f"minillm bench serve: {e}")
    max_num_seqs = args.max_num_seqs or 4
    _log(f"loading minillm ({args.dtype}, {device})")
    llm = LLM(args.model, dtype=args.dtype, device=device, max_num_seqs=max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False,
              kv_cache_memory_bytes=None if args.kv_cache_mb is None else args.kv_cache_mb * 2**20,
              short_lane_max_tokens=wl.short_max_tokens)

    def make_engine(policy: str) -> LLMEngine:  # the same weights, a fresh pool and scheduler per policy
        return LLMEngine(llm.engine.model, llm.tokenizer, sorted(llm.engine.eos_token_ids),
                         llm.config.replace(scheduling_policy=policy))

    summary = measure_policies(make_engine, llm.tokenizer, policies, wl, llm.engine.model.config.vocab_size, _log)
    cfg = llm.config
    settings = {"threads": torch.get_num_threads(), "seed": args.seed, "in_process": True,
                "server": "in-process uvicorn on loopback (clients share the process), one engine per policy in turn",
                "model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "dtype": args.dtype,
                "device": device, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                "prefix_caching": False, "short_lane_max_tokens": cfg.short_lane_max_tokens,
                "short_lane_share": cfg.short_lane_share, "long_lane_max_wait_steps": cfg.long_lane_max_wait_steps}
    report = build_report("serve", **report_context(None, device), settings=settings, workload=wl.to_dict(), **summary)
    print(format_mixed(summary))
    return report


def _prefix(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.minillm_subject import kv_bytes_for, load_minillm
    from minillm.bench.prefix import PrefixWorkload, measure_prefix, summarize_prefix, twin_engines
    from minillm.bench.report import build_report, format_prefix
    from minillm.bench.runner import report_context
    from minillm.roofline.machine_state import probe_machine_state

    if args.workload == "chat":
        return _prefix_chat(args)
    device = _device(args)
    wl = PrefixWorkload(args.prefix_len or 1024, args.num_turns or 8, tuple(args.turn_len_range), seed=args.seed)
    _log(f"loading minillm ({args.dtype}, {device})")
    subject = load_minillm(args.model, args.dtype, device)
    cfg = subject.config
    warm, turns = wl.prompts(cfg.vocab_size)
    # a pool that holds every prompt at once: the cached prefix is never evicted during the run
    kv = kv_bytes_for(cfg, subject.engine.executor.plan.dtype, [len(p) + wl.output_len for p in [warm, *turns]])
    engines = twin_engines(subject, kv)
    before = probe_machine_state()
    raw = measure_prefix(engines, wl, cfg.vocab_size, log=(lambda s: None) if args.quiet else _log)
    after = probe_machine_state()
    summary = summarize_prefix(raw)
    settings = {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "dtype": args.dtype,
                "device": device, "threads": torch.get_num_threads(), "seed": args.seed, "kv_cache_bytes": kv,
                "block_size": engines["cached"].config.block_size}
    report = build_report("prefix", **report_context(None, device),
                          machine_state={"before": before.to_dict(), "after": after.to_dict()},
                          settings=settings, workload=wl.to_dict(), **summary)
    print(format_prefix(summary))
    return report


def _tp(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context
    from minillm.bench.tp import TPWorkload, analytic_section, format_tp, measure_tp

    device = _device(args)
    wl = TPWorkload(args.num_prompts, args.prompt_len, args.output_len, seed=args.seed)
    result = measure_tp(args.model, args.tp, wl, args.dtype, device, args.timeout, log=_log,
                        bare_repeats=args.bare_repeats)
    model_section = analytic_section()
    settings = {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "dtype": args.dtype,
                "device": device, "tp": args.tp, "backend": "nccl" if device.startswith("cuda") else "gloo",
                "rank0_threads": torch.get_num_threads(), "timeout_s": args.timeout}
    report = build_report("tp", **report_context(None, device), settings=settings, workload=wl.to_dict(),
                          measured=result, analytic=model_section)
    print(format_tp(result, model_section))
    return report


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench import spec as sb
    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context
    from minillm.engine.config import resolve_dtype
    from minillm.loader import load_model
    from minillm.roofline.machine_state import probe_machine_state

    device = _device(args)
    proposers = ["none"] + [p.strip() for p in args.proposers.split(",") if p.strip() and p.strip() != "none"]
    for p in proposers:
        sb.Proposer(p).speculative  # a clear error before the model load
    if any(not 1 <= k <= 16 for k in args.ks) or not 1 <= args.num_prompts <= 4:
        raise SystemExit("--ks must lie in 1..16 and --num-prompts in 1..4")
    torch.manual_seed(args.seed)
    _log(f"loading minillm ({args.dtype}, {device})")
    loaded = load_model(args.model, dtype=resolve_dtype(args.dtype), device=torch.device(device))
    options: dict[str, Any] = {"compile": args.compile}
    if args.quantization:
        from minillm.quant.apply import quantize_loaded

        quantize_loaded(loaded, args.quantization)
        options["quantization"] = args.quantization  # a draft model follows it ("auto")
    engines = sb.build_engines(loaded.model, loaded.tokenizer, loaded.eos_token_ids, proposers, 64 << 20, **options)
    log = (lambda s: None) if args.quiet else _log
    before = probe_machine_state()
    batch1, scaling, workloads = {}, {}, {}
    for name in args.workloads:
        wl = sb.SpecWorkload(name, sb.WORKLOADS[name][: args.num_prompts], args.output_len,
                             chat=name not in sb.RAW_WORKLOADS)
        workloads[name] = wl.to_dict()
        prompts = wl.token_ids(loaded.tokenizer)
        batch1[name] = sb.measure_batch1(engines, wl, prompts, args.ks, args.repeats, log)
        if args.batch_sizes:
            scaling[name] = sb.measure_batch_scaling(engines, wl, prompts, args.batch_sizes, args.batch_k, log)
    after = probe_machine_state()
    summary = sb.summarize_spec(batch1, scaling)
    settings = {"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)", "dtype": args.dtype,
                "device": device, "threads": torch.get_num_threads(), "seed": args.seed, "proposers": proposers,
                "ks": args.ks, "batch_sizes": args.batch_sizes, "batch_k": args.batch_k, "repeats": args.repeats,
                "prefix_caching": False, "quantization": args.quantization, "compile": args.compile}
    report = build_report("spec", **report_context(None, device),
                          machine_state={"before": before.to_dict(), "after": after.to_dict()},
                          settings=settings, workload=workloads, **summary)
    print(sb.format_spec(summary))
    return report


def _structured(args: argparse.Namespace) -> dict[str, Any]:
    from minillm import LLM
    from minillm.bench.structured import bench_structured, format_structured

    if any(b < 1 for b in args.batch) or args.repeats < 1 or args.max_tokens < 1:
        raise SystemExit("minillm bench structured: --batch, --repeats and --max-tokens must be >= 1")
    opts = {k: v for k, v in (("dtype", args.dtype), ("device", args.device)) if v not in (None, "auto")}
    _log(f"loading minillm: LLM({', '.join([repr(args.model)] * bool(args.model) + [f'{k}={v!r}' for k, v in opts.items()])})")
    torch.manual_seed(args.seed)
    with LLM(args.model, **opts) as llm:
        report, summary = bench_structured(
            llm, args.batch, args.repeats, args.max_tokens, args.num_schemas,
            settings={"model": args.model or "default (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized)",
                      "llm_options": opts or "LLM() defaults", "seed": args.seed, "wait_quiet_s": args.wait_quiet},
            log=(lambda s: None) if args.quiet else _log, settle=functools.partial(settle, args.wait_quiet))
    print(format_structured(summary))
    return report


def _quant(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.quant import PeerDecodeRow, format_quant, measure_quant, peer_ratios
    from minillm.bench.report import build_report
    from minillm.bench.runner import report_context
    from minillm.eval.ppl import parse_setting
    from minillm.loader import load_model

    settings = tuple(x.strip() for x in args.settings.split(",") if x.strip())
    try:
        for x in settings:
            parse_setting(x)
    except ValueError as e:
        raise SystemExit(f"minillm bench quant: {e}")
    roofs = _roofs(args, "cpu")
    bw = roofs.bandwidth_bytes_per_s if roofs is not None else None
    from minillm.bench.quant import needs_sequential
    from minillm.engine.config import resolve_dtype

    loaded = load_model(args.model, dtype=resolve_dtype(args.dtype))
    sequential = args.sequential == "on" or (args.sequential == "auto" and needs_sequential(loaded, settings))
    # the prefill prompt plus its one generated token must fit the model's context
    prefill = min(args.prefill_len, loaded.model.config.max_position_embeddings - 1)
    wl = LatencyWorkload(args.prompt_len, args.output_len, prefill, args.seed)
    throughput = (ThroughputWorkload(args.throughput_requests, (16, 128), (16, 64), args.seed)
                  if args.throughput_requests > 0 else None)
    tasks = args.tasks
    if tasks == "auto":
        has_template = getattr(loaded.tokenizer, "chat_template", None) is not None
        tasks = "code" if "coder" in str(args.model or "").lower() else "facts" if has_template else None
    elif tasks == "none":
        tasks = None
    # llama.cpp on the same GGUF, in this run, or no ratio at all (never a figure typed into the code)
    args.compare = ["llama.cpp"] if args.llama_cpp == "auto" else []
    peers = _llama_cpp_subjects(args) if args.llama_cpp == "auto" else []
    if args.llama_cpp == "off":
        args.peer_notes["llama.cpp"] = "turned off (--llama-cpp off)"
    peer_rows: list[PeerDecodeRow] = []
    try:
        rows = measure_quant(loaded, settings, wl, bw, args.repeats, args.group_size,
                             quality_windows=args.quality_windows, quality_len=args.quality_len,
                             throughput=throughput, tasks=tasks, task_limit=args.task_limit, sequential=sequential,
                             log=(lambda s: None) if args.quiet else _log, peers=peers, peer_rows=peer_rows)
    finally:
        for p in peers:
            p.close()
    note = "; ".join(args.peer_notes.values()) or None
    report = build_report("quant", **report_context(roofs, "cpu"), workload=wl,
                          settings={"model": args.model or "default", "threads": torch.get_num_threads(),
                                    "dtype": args.dtype, "sequential": sequential,
                                    "group_size": args.group_size, "settings": list(settings),
                                    "quality": {"text": "pydoc_data.topics, eval split", "windows": args.quality_windows,
                                                "tokens_per_window": args.quality_len},
                                    "fp8_on_cpu": "e4m3 weights stored, dequantized on every call",
                                    "throughput": throughput.to_dict() if throughput else None,
                                    "tasks": {"suite": tasks, "limit": args.task_limit},
                                    **_llama_cpp_settings(args)},
                          rows=[r.to_dict() for r in rows], llama_cpp_decode=[p.to_dict() for p in peer_rows],
                          ratios_to_llama_cpp=peer_ratios(rows, peer_rows))
    print(format_quant(rows, bw, peer_rows, note))
    return report


def _show_roofs(args: argparse.Namespace) -> dict[str, Any]:
    from minillm.bench.report import jsonable
    from minillm.roofline.roofs import get_roofs

    roofs = get_roofs(_device(args), remeasure=args.remeasure, wait_quiet_s=args.wait_quiet)
    print(format_roofs(roofs))
    return jsonable(roofs)


def _warn_if_noisy(report: dict[str, Any]) -> None:
    states = (report.get("machine_state") or {}).values()
    worst = max((s.get("stall_ratio") or 0.0 for s in states), default=0.0)
    if worst > QUIET_STALL_RATIO:
        _log(f"warning: another tenant kept a core busy during this run (stall ratio {worst:.3g}); "
             "multi-threaded figures are unreliable: compare interleaved ratios, use --threads 1 or --wait-quiet")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.compare = list(dict.fromkeys(p for group in getattr(args, "compare", []) for p in group))
    args.peer_notes = {}  # peer name -> why it did not run
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    report = {"latency": _latency, "throughput": _throughput, "serve": _serve, "prefix": _prefix,
              "spec": _spec, "structured": _structured, "tp": _tp, "roofs": _show_roofs, "quant": _quant}[args.command](args)
    for note in args.peer_notes.values():  # a peer that did not run is said on stdout too, not only in the JSON
        print(f"note: {note}")
    _warn_if_noisy(report)
    if args.json_out:
        write_json(report, args.json_out)
        _log(f"wrote {args.json_out}")
    return 0
