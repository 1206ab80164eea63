"""`minillm serve`: load a model, build the engine, serve the OpenAI-compatible API with uvicorn.

    minillm serve --port 8000                      # SmolLM2-135M-Instruct, the default model
    curl localhost:8000/v1/completions -H 'content-type: application/json' \\
         -d '{"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 16}'
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from minillm import envs
from minillm.server.limits import DEFAULT_MAX_REQUEST_BYTES

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minillm serve", description="an OpenAI-compatible server for minillm")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=None, help="a name from `minillm models`, a Hugging Face folder or Hub repo id, or a .gguf file (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: from --model)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 elsewhere")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"],
                   help="auto: triton on CUDA, torch elsewhere")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--kv-cache-mb", type=int, default=None, help="KV pool budget in MiB")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--prefix-cache", default="hash", choices=["hash", "radix"],
                   help="hash: chained block hashes; radix: a token tree, least recently used leaves evicted")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority", "length-aware"],
                   help="fcfs; priority: a request's priority, lower first (vLLM's); length-aware: a short-request lane")
    p.add_argument("--max-queue-len", type=int, default=1024,
                   help="sequences waiting or running (n per request) beyond which new requests get HTTP 429")
    p.add_argument("--max-n", type=int, default=None, help="the largest n a request may ask for (default: --max-num-seqs)")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="the largest request body accepted; more is HTTP 413")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer <key>` on /v1/* (default: $MINILLM_API_KEY; none: open)")
    p.add_argument("--api-key-all-routes", action="store_true", help="require the key on /health and /metrics too")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    p.add_argument("--no-warmup", action="store_true", help="report ready at once, without the warm-up requests")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    from minillm.parallel.launch import add_parallel_args

    add_parallel_args(p)  # under torchrun, rank 0 serves and the other ranks run its steps
    return p


def served_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return Path(args.model).name if args.model else DEFAULT_MODEL_NAME


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_queue_len < 1:
        raise SystemExit("--max-queue-len must be >= 1")
    if args.max_n is not None and args.max_n < 1:
        raise SystemExit("--max-n must be >= 1")
    if args.max_request_bytes < 1024:
        raise SystemExit("--max-request-bytes must be >= 1024")
    if args.shutdown_grace < 0:
        raise SystemExit("--shutdown-grace must be >= 0")
    from minillm.parallel.launch import run_command
    from minillm.parallel.torchrun import torchrun_env

    return run_command(torchrun_env(), lambda: serve(args), args.tensor_parallel_size, args.pipeline_parallel_size)


def serve(args: argparse.Namespace) -> int:
    """Rank 0 (or the only process): load, build the engine, run uvicorn until stopped."""
    from minillm.extras import SERVER_MODULES, require

    require("minillm serve", "server", SERVER_MODULES)  # before the model loads, not after
    from minillm import LLM
    from minillm.server.app import create_app
    from minillm.server.auth import exposure_warning
    from minillm.server.lifecycle import serve_app
    from minillm.server.limits import ServerLimits

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    api_key = args.api_key or envs.api_key()
    warning = exposure_warning(args.host, api_key)
    if warning:
        logging.getLogger("minillm.server").warning(warning)
    llm = LLM(args.model, dtype=args.dtype, attention_backend=args.attention_backend,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.max_model_len, block_size=args.block_size,
              kv_cache_memory_bytes=None if args.kv_cache_mb is None else args.kv_cache_mb * 2**20,
              enable_prefix_caching=not args.no_prefix_caching, prefix_cache=args.prefix_cache,
              scheduling_policy=args.scheduling_policy, tensor_parallel_size=args.tensor_parallel_size,
              pipeline_parallel_size=args.pipeline_parallel_size)
    limits = ServerLimits(max_n=args.max_n or args.max_num_seqs, max_request_bytes=args.max_request_bytes)
    app = create_app(llm.engine, llm.tokenizer, served_name(args), max_queue_len=args.max_queue_len, limits=limits,
                     api_key=api_key, protect_all_routes=args.api_key_all_routes, warmup=not args.no_warmup)
    # SIGTERM: drain for --shutdown-grace seconds, then abort what is left; exit 1 if the engine failed
    return serve_app(app, args.host, args.port, args.log_level, args.shutdown_grace)


if __name__ == "__main__":
    raise SystemExit(main())
