"""LLM: the offline front door.

    from minillm import LLM, SamplingParams
    llm = LLM()                                   # the default model, SmolLM2-135M-Instruct (GGUF)
    outs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator

import torch

from minillm.engine.config import EngineConfig, resolve_dtype
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.outputs import RequestOutput
from minillm.engine.request import check_priority
from minillm.sampling_params import SamplingParams

Message = dict[str, str]

__all__ = ["LLM", "resolve_dtype"]


def chat_params(params: SamplingParams | None) -> SamplingParams:
    """A chat prompt's text comes from its template, which writes the BOS it wants: add no second one."""
    params = params or SamplingParams()
    return params if params.add_special_tokens is not None else dataclasses.replace(params, add_special_tokens=False)


class LLM:
    """LLM(model=None, **options): options are EngineConfig's fields (minillm/engine/config.py),
    e.g. dtype="bfloat16", max_num_seqs=64, kv_cache_dtype="int8", speculative={...},
    tensor_parallel_size=2, quantization="int4"."""

    def __init__(self, model: str | None = None, **options: Any) -> None:
        from minillm.loader import load_model

        self.config = config = EngineConfig.from_kwargs(model=model, **options)  # bad options fail before the load
        if config.world_size > 1:  # a spawned worker re-running an unguarded script stops before loading
            from minillm.parallel.executor import refuse_unguarded_main

            refuse_unguarded_main()
        torch.manual_seed(config.seed)
        self.loaded = load_model(model, dtype=config.torch_dtype, device=config.torch_device,
                                 fast_path=config.fast_path)
        self.quantization_report: dict[str, str] = {}
        if config.quantization is not None or config.quantize_lm_head:
            from minillm.quant.apply import quantize_loaded

            if self.loaded.config.is_moe:  # its layers have experts where the quantizers look for one MLP
                raise ValueError(f"quantization is not supported for mixture-of-experts models "
                                 f"({self.loaded.config.model_type}: {self.loaded.config.num_experts} experts)")

            self.quantization_report = quantize_loaded(self.loaded, config.quantization,
                                                       config.quantization_group_size, lm_head=config.quantize_lm_head,
                                                       calibration=config.quantization_calibration)
        self.tokenizer = self.loaded.tokenizer
        self.engine = LLMEngine(self.loaded.model, self.tokenizer, self.loaded.eos_token_ids, config)
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
        priority: int | list[int] | None = None,
    ) -> list[RequestOutput]:
        """Run all prompts through continuous batching; outputs come back in input order.

        priority: one integer per prompt, or one for all (lower is served first; it orders requests
        only under scheduling_policy="priority", as in vLLM)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        priorities = priority if isinstance(priority, list) else [0 if priority is None else priority] * len(prompts)
        if len(priorities) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(priorities)} priorities")
        for pr in priorities:  # every one checked before any request is queued
            check_priority(pr)
        ids = []
        for p, sp, pr in zip(prompts, params, priorities):
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, p, sp, priority=pr)
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
        return self.generate(prompts, chat_params(sampling_params), use_tqdm=use_tqdm)

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
                    # the engine's text never runs ahead of the final text: a stop string that may
                    # still complete, or a half-decoded character, is held back (engine/detokenizer.py)
                    text = out.outputs[0].text
                    if len(text) > sent:
                        yield text[sent:]
                        sent = len(text)
                    done = out.finished
        finally:
            if not done:
                self.engine.abort_request(rid)

    def stream_chat(self, messages: list[Message], sampling_params: SamplingParams | None = None) -> Iterator[str]:
        return self.stream(self.apply_chat_template(messages), chat_params(sampling_params))
