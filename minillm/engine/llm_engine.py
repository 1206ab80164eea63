"""LLMEngine: add requests, step the batch, read results and the step trace.

    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step(): ...
    engine.trace  # one StepTrace per step

Each step: the scheduler picks chunks within the token budget, the model
runner computes them and samples, then this class appends tokens, checks stop
conditions, frees finished sequences' blocks and records the step.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from minillm.config import CacheConfig, SchedulerConfig
from minillm.engine.block_manager import BlockManager
from minillm.engine.cost import step_cost
from minillm.engine.model_runner import ModelRunner, plan_kv_cache
from minillm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minillm.engine.scheduler import Scheduler, SchedulerOutput
from minillm.engine.sequence import Sequence
from minillm.engine import trace as tr
from minillm.models.llama import LlamaForCausalLM
from minillm.sampling_params import SamplingParams
from minillm.spec.config import SpecConfig, parse_speculative


class RequestError(ValueError):
    """A request the engine refuses up front (it never enters the queue)."""


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    max_tokens: int  # effective limit after the context length and the pool


@dataclass
class _Pending:
    arrivals: list[tr.Arrival] = field(default_factory=list)
    finished: list[tr.Finished] = field(default_factory=list)


class LLMEngine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer=None,
        eos_token_ids: list[int] | None = None,
        cache_config: CacheConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
        attention_backend: str = "torch",
        compile: bool = False,
        speculative: "SpecConfig | dict | None" = None,
        tensor_parallel: "TensorParallelConfig | None" = None,
    ) -> None:
        self.model = model.eval()
        self.model_config = model.config  # the whole model (a TP shard's model.config is its rank's slice)
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids or model.config.eos_token_id)
        self.cache_config = cache_config or CacheConfig()
        self.scheduler_config = scheduler_config or SchedulerConfig()
        sc = self.scheduler_config
        self.max_model_len = min(sc.max_model_len or model.config.max_position_embeddings,
                                 model.rotary.cos.shape[0])
        device = model.embed_tokens.weight.device
        if tensor_parallel is not None and tensor_parallel.size > 1:
            # minillm/parallel: shards the model over N ranks; run() has ModelRunner's interface
            from minillm.parallel.executor import TPExecutor

            if compile or speculative is not None:
                raise ValueError("compile=True and speculative decoding are not supported with tensor_parallel_size > 1")
            self.runner = TPExecutor(model, tensor_parallel, self.cache_config, attention_backend)
            spec = self.runner.spec
        else:
            spec = plan_kv_cache(model, self.cache_config, device)
            self.runner = ModelRunner(model, spec, attention_backend, compile=compile)
        self.block_manager = BlockManager(spec.num_blocks, spec.block_size, self.cache_config.enable_prefix_caching)
        self.scheduler = Scheduler(sc, self.block_manager)
        if not sc.enable_chunked_prefill and sc.max_num_batched_tokens < self.max_model_len:
            # without chunking a prompt must fit one step's budget
            self.max_model_len = sc.max_num_batched_tokens
        self.requests: dict[str, Request] = {}
        self.trace: list[tr.StepTrace] = []  # a long-running server may trim it; steps keep counting
        self._num_steps = 0
        self._seq_ids = itertools.count()
        self._pending = _Pending()
        # speculative decoding (minillm/spec): k lookahead slots per decoding sequence, step via spec_step
        self.spec = parse_speculative(speculative)
        self.proposer = None
        if self.spec is not None:
            from minillm.spec.step import make_proposer

            self.proposer = make_proposer(self.spec, self)
            self.scheduler.num_lookahead_slots = self.spec.num_tokens
        self._weight_bytes_per_param = model.embed_tokens.weight.element_size()
        if any(type(m).__name__ == "QuantLinear" for m in model.modules()):  # weight-only quantized:
            from minillm.engine.cost import weight_bytes  # the bytes it stores, per parameter on average
            from minillm.quant.footprint import weight_bytes_per_token

            self._weight_bytes_per_param = weight_bytes_per_token(model) / weight_bytes(model.config, 1.0)
        # bytes per cached K/V element as stored, per-token-per-head scales included (int8/fp8 caches)
        cfg = model.config
        self._kv_elem_bytes = spec.bytes_per_block / (
            spec.block_size * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim)

    # ----- requests ----------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        params = params or SamplingParams()
        params.validate()
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in the engine")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this engine has no tokenizer: pass prompt token ids")
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=False) if prompt else []
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise RequestError(f"request {request_id!r}: the prompt is empty")
        vocab = self.model.config.vocab_size
        if any(not (0 <= t < vocab) for t in ids):
            raise RequestError(f"request {request_id!r}: prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"request {request_id!r}: prompt has {len(ids)} tokens but the context length is "
                f"{self.max_model_len} (prompt plus at least one generated token must fit)"
            )
        bm = self.block_manager
        pool_tokens = bm.num_blocks * bm.block_size
        room = min(self.max_model_len, pool_tokens) - len(ids)
        if room < 1:
            raise RequestError(
                f"request {request_id!r}: prompt of {len(ids)} tokens can never fit the KV pool "
                f"({bm.num_blocks} blocks x {bm.block_size} = {pool_tokens} tokens)"
            )
        if params.max_tokens is not None and len(ids) + params.max_tokens > pool_tokens:
            raise RequestError(
                f"request {request_id!r}: prompt ({len(ids)}) + max_tokens ({params.max_tokens}) can never fit "
                f"the KV pool of {pool_tokens} tokens; lower max_tokens or raise the KV cache budget"
            )
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        now = time.perf_counter() if arrival_time is None else arrival_time
        seqs: list[Sequence] = []
        for i in range(params.n):
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.runner.device).manual_seed(params.seed + i)
            seq = Sequence(next(self._seq_ids), request_id, i, list(ids), len(ids), params, now, generator=gen)
            if i > 0:
                seq.wait_for_parent = seqs[0]
            seqs.append(seq)
        req = Request(request_id, text, list(ids), params, seqs, now, max_tokens)
        self.requests[request_id] = req
        for s in seqs:
            self.scheduler.add(s)
        self._pending.arrivals.append(tr.Arrival(request_id, tuple(s.seq_id for s in seqs), now, len(ids)))
        return req

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. Returns False if it was unknown or done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        now = time.perf_counter()
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.abort(seq)
                seq.finish_reason, seq.finish_time = "abort", now
                self._pending.finished.append(tr.Finished(seq.seq_id, request_id, "abort", seq.num_output_tokens))
        return True

    abort = abort_request

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # ----- the step ----------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run, sample, update; returns outputs of requests that changed."""
        if self.spec is not None:
            from minillm.spec.step import spec_step

            return spec_step(self)
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        result = self.runner.run(sched.chunks) if sched.chunks else None
        now = time.perf_counter()
        changed: dict[str, Request] = {}
        new_tokens: list[tr.NewTokens] = []
        sampled_idx = 0
        sampled_flags: list[bool] = []
        for c in sched.chunks:
            seq = c.seq
            seq.num_computed_tokens += c.num_new_tokens
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = t0
            self.block_manager.register_full_blocks(seq)
            sampled_flags.append(c.completes)
            if not c.completes:
                continue
            token = result.token_ids[sampled_idx]
            logprob = result.logprobs[sampled_idx]
            sampled_idx += 1
            if seq.num_output_tokens == 0 and seq.index == 0:
                self.scheduler.release_children(seq)
            self._append_token(seq, token, logprob, now)
            new_tokens.append(tr.NewTokens(seq.seq_id, (token,)))
            changed[seq.request_id] = self.requests[seq.request_id]
        self._record(t0, time.perf_counter(), sched, sampled_flags, new_tokens)
        outputs = [self._make_output(r) for r in changed.values()]
        for out in outputs:
            if out.finished:
                self.requests.pop(out.request_id, None)
        return outputs

    def _append_token(self, seq: Sequence, token: int, logprob: dict[int, float] | None, now: float) -> None:
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.last_token_time = now
        if logprob is not None:
            seq.logprobs.append(logprob)
        p = seq.params
        req = self.requests[seq.request_id]
        n_out = seq.num_output_tokens
        if self.tokenizer is not None:
            seq.output_text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=p.skip_special_tokens)
        reason = None
        if n_out >= p.min_tokens:
            if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
                reason, seq.stop_reason = "stop", token
            elif p.stop and self.tokenizer is not None:
                for s in p.stop:
                    at = seq.output_text.find(s)
                    if at >= 0:
                        reason, seq.stop_reason = "stop", s
                        seq.output_text = seq.output_text[:at]
                        break
        if reason is None and (n_out >= req.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = "length"
        if reason is not None:
            seq.finish_reason, seq.finish_time = reason, now
            self.scheduler.finish(seq)
            self._pending.finished.append(tr.Finished(seq.seq_id, seq.request_id, reason, n_out))

    def _make_output(self, req: Request) -> RequestOutput:
        first = req.seqs[0]
        done = all(s.is_finished for s in req.seqs)
        outs = [
            CompletionOutput(
                s.index, s.output_text, list(s.output_token_ids), s.finish_reason, s.stop_reason,
                list(s.logprobs) if s.params.logprobs is not None else None,
            )
            for s in req.seqs
        ]
        firsts = [s.first_token_time for s in req.seqs if s.first_token_time is not None]
        metrics = RequestMetrics(
            arrival_time=req.arrival_time,
            first_scheduled_time=first.first_scheduled_time,
            first_token_time=min(firsts) if firsts else None,
            last_token_time=first.last_token_time,
            finish_time=max((s.finish_time or 0.0) for s in req.seqs) if done else None,
            num_generated_tokens=first.num_output_tokens,
            num_cached_tokens=first.num_cached_tokens,
            num_preemptions=sum(s.num_preemptions for s in req.seqs),
        )
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, done, metrics)

    # ----- the trace -----------------------------------------------------------------
    def _record(
        self, t0: float, t1: float, sched: SchedulerOutput, sampled: list[bool], new_tokens: list[tr.NewTokens]
    ) -> None:
        bm = self.block_manager
        ev = bm.take_events()
        scheduled = []
        pre = dec = 0
        for c, did_sample in zip(sched.chunks, sampled):
            phase = "decode" if c.num_new_tokens == 1 and c.num_computed_before >= c.seq.num_prompt_tokens else "prefill"
            if phase == "decode":
                dec += c.num_new_tokens
            else:
                pre += c.num_new_tokens
            scheduled.append(tr.ScheduledSeq(
                c.seq.seq_id, c.seq.request_id, phase, c.num_new_tokens, c.num_computed_before,
                c.num_computed_before + c.num_new_tokens, c.num_prefix_hit_tokens, c.seq.num_prompt_tokens, did_sample,
            ))
        cost = step_cost(
            self.model_config,
            [(c.num_new_tokens, c.num_computed_before + c.num_new_tokens) for c in sched.chunks],
            sum(sampled), self._weight_bytes_per_param, self._kv_elem_bytes,
        ) if sched.chunks else None
        holders = self.scheduler.running
        pending, self._pending = self._pending, _Pending()
        self.trace.append(tr.StepTrace(
            step=self._num_steps, start_time=t0, duration_s=t1 - t0,
            scheduled=tuple(scheduled), num_prefill_tokens=pre, num_decode_tokens=dec, num_spec_tokens=0,
            token_budget=self.scheduler_config.max_num_batched_tokens,
            max_num_seqs=self.scheduler_config.max_num_seqs,
            num_waiting=len(self.scheduler.waiting) + len(self.scheduler.parked),
            num_running=len(holders),
            arrivals=tuple(pending.arrivals), new_tokens=tuple(new_tokens), finished=tuple(pending.finished),
            preemptions=tuple(
                tr.Preemption(p.seq.seq_id, p.seq.request_id, p.reason, p.num_blocks_freed, p.num_tokens_lost)
                for p in sched.preempted
            ),
            num_blocks=bm.num_blocks, block_size=bm.block_size,
            blocks_allocated=tuple(ev.allocated), blocks_freed=tuple(ev.freed),
            blocks_evicted=tuple(ev.evicted), blocks_shared=tuple(ev.shared),
            block_tables=tuple((s.seq_id, tuple(s.block_table)) for s in holders),
            block_ref_counts=tuple(b.ref_count for b in bm.blocks),
            block_cached=tuple(b.block_hash is not None for b in bm.blocks),
            free_queue=tuple(bm.free_queue),
            prefix_queried_tokens=ev.queried_tokens, prefix_hit_tokens=ev.hit_tokens,
            spec=(),
            flops=cost.flops if cost else 0.0, bytes_moved=cost.bytes_moved if cost else 0.0,
            weight_bytes=cost.weight_bytes if cost else 0.0,
            kv_read_bytes=cost.kv_read_bytes if cost else 0.0, kv_write_bytes=cost.kv_write_bytes if cost else 0.0,
            **self._comm_fields(),
        ))
        self._num_steps += 1

    def _comm_fields(self) -> dict[str, float]:
        """This step's tensor-parallel communication (the executor counts it; one rank has none)."""
        take = getattr(self.runner, "take_comm_stats", None)
        if take is None:
            return {}
        c = take()
        return {"allreduce_bytes": float(c.allreduce_bytes), "allgather_bytes": float(c.allgather_bytes),
                "comm_time_s": c.time_s, "p2p_bytes": float(c.p2p_bytes)}

    def close(self) -> None:
        """Stop tensor-parallel workers, if any (a one-rank engine holds nothing to release)."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    # ----- conveniences -------------------------------------------------------------------
    def live_sequences(self) -> list[Sequence]:
        return [s for r in self.requests.values() for s in r.seqs if not s.is_finished]

    def kv_usage(self) -> float:
        return self.block_manager.num_used_blocks / self.block_manager.num_blocks
