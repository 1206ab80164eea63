"""LLM: the offline front door.

    from minillm import LLM, SamplingParams
    llm = LLM()                                   # the default model, SmolLM2-135M-Instruct (GGUF)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import itertools
from typing import Iterator, Sequence as Seq

import torch

from minillm.config import CacheConfig, SchedulerConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.outputs import RequestOutput
from minillm.sampling_params import SamplingParams

Message = dict[str, str]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str | torch.dtype = "float32",
        device: str | None = None,
        attention_backend: str = "torch",
        block_size: int = 16,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.9,
        num_kv_blocks: int | None = None,
        enable_prefix_caching: bool = True,
        kv_cache_dtype: str = "auto",
        enable_chunked_prefill: bool = True,
        max_num_seqs: int = 128,
        max_num_batched_tokens: int = 2048,
        max_model_len: int | None = None,
        seed: int = 0,
        compile: bool = False,
        speculative: dict | None = None,
        tensor_parallel_size: int = 1,
        tensor_parallel_timeout_s: float = 60.0,
        pipeline_parallel_size: int = 1,
        quantization: str | None = None,
        quantization_group_size: int | None = None,
        quantize_lm_head: bool = False,
    ) -> None:
        from minillm.attention.kv_quant import resolve_kv_cache_dtype
        from minillm.loader import load_model

        resolve_kv_cache_dtype(kv_cache_dtype)  # fail before the (slow) model load
        from minillm.quant.apply import check_llm_options

        # weight quantization: "int8" | "int4" | "int4-awq" | "gguf" (keep the file's Q4 codes);
        # int4 group size None = 32 (most accurate; 128 does not divide the default model's 576)
        check_llm_options(quantization, quantization_group_size)
        if (quantization is not None or quantize_lm_head) and (tensor_parallel_size > 1 or pipeline_parallel_size > 1):
            raise ValueError("weight quantization is not supported with tensor or pipeline parallelism")
        from minillm.spec.config import parse_speculative

        speculative = parse_speculative(speculative)  # bad configs fail before the model load too
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
        if tensor_parallel_size > 1 and speculative is not None:
            raise ValueError("speculative decoding is not supported with tensor_parallel_size > 1")
        if not isinstance(pipeline_parallel_size, int) or pipeline_parallel_size < 1:
            raise ValueError(f"pipeline_parallel_size must be an int >= 1, got {pipeline_parallel_size!r}")
        if pipeline_parallel_size > 1 and (tensor_parallel_size > 1 or speculative is not None
                                           or quantization is not None):
            raise ValueError("pipeline_parallel_size > 1 does not combine with tensor_parallel_size > 1, "
                             "speculative decoding or weight quantization")
        torch.manual_seed(seed)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.loaded = load_model(model, dtype=resolve_dtype(dtype), device=dev)
        self.quantization_report: dict[str, str] = {}
        if quantization is not None or quantize_lm_head:  # quantize_lm_head: an int8 LM head (the embedding stays)
            from minillm.quant.apply import quantize_loaded

            self.quantization_report = quantize_loaded(self.loaded, quantization, quantization_group_size,
                                                       lm_head=quantize_lm_head)
        tensor_parallel = None
        if tensor_parallel_size > 1 or pipeline_parallel_size > 1:  # ranks 1..N-1: worker processes (minillm/parallel)
            from minillm.parallel.executor import TensorParallelConfig

            tensor_parallel = TensorParallelConfig(max(tensor_parallel_size, pipeline_parallel_size), model,
                                                   resolve_dtype(dtype), timeout_s=tensor_parallel_timeout_s,
                                                   pipeline=pipeline_parallel_size > 1)
        self.tokenizer = self.loaded.tokenizer
        self.engine = LLMEngine(
            self.loaded.model,
            self.tokenizer,
            self.loaded.eos_token_ids,
            CacheConfig(block_size=block_size, kv_cache_memory_bytes=kv_cache_memory_bytes,
                        gpu_memory_utilization=gpu_memory_utilization, num_blocks=num_kv_blocks,
                        enable_prefix_caching=enable_prefix_caching, kv_cache_dtype=kv_cache_dtype),
            SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            enable_chunked_prefill=enable_chunked_prefill, max_model_len=max_model_len),
            attention_backend=attention_backend,
            compile=compile,
            speculative=speculative,
            tensor_parallel=tensor_parallel,
        )
        self._ids = itertools.count()

    def close(self) -> None:
        """Release worker processes (tensor parallelism); safe to call twice. Also on `with LLM(...)` exit."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def trace(self):
        return self.engine.trace

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run all prompts through continuous batching; outputs come back in input order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = []
        for p, sp in zip(prompts, params):
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, p, sp)
            ids.append(rid)
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(ids) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(ids), desc="requests", unit="req", dynamic_ncols=True)
        wanted = set(ids)
        try:
            while wanted - results.keys():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid in wanted - results.keys():  # leave the engine clean for the next call
                self.engine.abort_request(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[r] for r in ids]

    def apply_chat_template(self, messages: list[Message]) -> str:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (list of {"role", "content"}) or several; each gets the model's chat template."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(c) for c in convs]  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def stream(self, prompt: str | list[int], sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text as it is produced (one completion). Other queued requests keep progressing."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() yields one completion; use n=1")
        rid = f"stream-{next(self._ids)}"
        self.engine.add_request(rid, prompt, params)
        sent = 0
        done = False
        try:
            while not done:
                for out in self.engine.step():
                    if out.request_id != rid:
                        continue
                    text = out.outputs[0].text
                    # hold back a trailing replacement char: a multi-byte character may be half decoded
                    safe = len(text) if out.finished else len(text.rstrip("\ufffd"))
                    if safe > sent:
                        yield text[sent:safe]
                        sent = safe
                    done = out.finished
        finally:
            if not done:
                self.engine.abort_request(rid)

    def stream_chat(self, messages: list[Message], sampling_params: SamplingParams | None = None) -> Iterator[str]:
        return self.stream(self.apply_chat_template(messages), sampling_params)
