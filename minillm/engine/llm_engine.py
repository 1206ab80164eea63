"""LLMEngine: add requests, step the batch, read results and the step trace.

    engine = LLMEngine(model, tokenizer, eos_ids, EngineConfig(max_num_seqs=8))
    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step(): ...
    engine.trace  # one StepTrace per step

One step is one pipeline, the same for every feature:

    schedule -> propose (speculative only) -> pack -> execute -> choose tokens -> update -> trace -> outputs

(A tree of drafts adds one move between choosing and updating: the accepted path's K/V
are copied to the slots the path now occupies, spec_decode/tree.py.)

Chunked prefill, prefix hits, decode and speculative verification are all
chunks of one ScheduledBatch; one StepBatch packs them for any executor (this
process, or N tensor/pipeline-parallel ranks).
"""
from __future__ import annotations

import logging
import time

from minillm.engine.batch import StepBatch
from minillm.engine.block_manager import PREFIX_CACHES, BlockManager
from minillm.engine.config import EngineConfig
from minillm.engine.cost import bytes_per_weight
from minillm.engine.executor import Executor
from minillm.engine.model_runner import ModelRunner
from minillm.engine.outputs import RequestOutput
from minillm.engine.request import Request, RequestBuilder, RequestError
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import SequenceStatus
from minillm.engine.token_choice import choose_tokens
from minillm.engine.tracer import StepTracer
from minillm.models.llama import LlamaForCausalLM
from minillm.sampling_params import SamplingParams

__all__ = ["LLMEngine", "RequestError"]

log = logging.getLogger(__name__)


def make_block_manager(num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                       hash_algo: str = "sha256", prefix_cache: str = "hash") -> BlockManager:
    """The pool's manager: the hash chain (block_manager.py), or the radix tree (radix_cache.py) on the same pool."""
    if prefix_cache not in PREFIX_CACHES:
        raise ValueError(f"prefix_cache must be one of {PREFIX_CACHES}, got {prefix_cache!r}")
    if prefix_cache == "radix" and enable_prefix_caching:
        from minillm.engine.radix_cache import RadixBlockManager

        return RadixBlockManager(num_blocks, block_size)
    return BlockManager(num_blocks, block_size, enable_prefix_caching, hash_algo)


class LLMEngine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer=None,
        eos_token_ids: list[int] | None = None,
        config: EngineConfig | None = None,
        **options,
    ) -> None:
        if config is not None and options:
            raise TypeError("pass either an EngineConfig or keyword options, not both")
        self.config = config = config or EngineConfig.from_kwargs(**options)
        self.model = model.eval()
        self.model_config = model.config  # the whole model (a TP shard's model.config is its rank's slice)
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids or model.config.eos_token_id)
        weight_bytes = bytes_per_weight(model)  # before sharding: the whole model's bytes per weight
        self.executor: Executor
        if config.world_size > 1:  # ranks 1..N-1 are worker processes (minillm/parallel)
            from minillm.parallel.launch import make_parallel_executor

            self.executor = make_parallel_executor(model, config)
        else:
            self.executor = ModelRunner(model, config)
        plan = self.executor.plan
        self.max_model_len = min(config.max_model_len or model.config.max_position_embeddings,
                                 model.rotary.cos.shape[0])
        if not config.enable_chunked_prefill:  # without chunking a prompt must fit one step's budget
            self.max_model_len = min(self.max_model_len, config.max_num_batched_tokens)
        self.block_manager = make_block_manager(plan.num_blocks, plan.block_size, config.enable_prefix_caching,
                                                config.prefix_caching_hash_algo, config.prefix_cache)
        if config.kv_allocator != "paged":  # the pre-paging baseline: one contiguous reservation per sequence
            from minillm.engine.contiguous_block_manager import ContiguousBlockManager

            self.block_manager = ContiguousBlockManager(
                plan.num_blocks, plan.block_size, self.max_model_len,
                "request" if config.kv_allocator == "contiguous-request" else "max_model_len")
            need = self.block_manager.blocks_needed(self.max_model_len)
            if config.kv_allocator == "contiguous" and need > plan.num_blocks:
                # every sequence reserves max_model_len: say so now, not at the first step
                raise ValueError(f"kv_allocator='contiguous' reserves max_model_len={self.max_model_len} tokens "
                                 f"({need} blocks) per sequence, but the KV pool has {plan.num_blocks} blocks; "
                                 f"lower max_model_len or raise the KV cache budget")
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len, self.eos_token_ids)
        cfg = self.model_config
        kv_elem_bytes = plan.bytes_per_token / (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim)
        self.tracer = StepTracer(cfg, weight_bytes, kv_elem_bytes, config.max_num_batched_tokens, config.max_num_seqs)
        self.requests: dict[str, Request] = {}
        self._builder = RequestBuilder(tokenizer, cfg.vocab_size, self.max_model_len,
                                       plan.num_blocks * plan.block_size, self.executor.device)
        self.grammars = None  # structured outputs: a GrammarGate (engine/grammar.py), made by the first grammar
        self.proposer = None
        if config.speculative is not None:
            from minillm.spec_decode.factory import make_proposer

            self.proposer = make_proposer(config.speculative, self.executor, config, tokenizer)
            self.scheduler.num_lookahead_slots = config.speculative.num_lookahead_slots

    @property
    def trace(self):
        return self.tracer.trace

    # ----- requests ----------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> Request:
        """Queue a request; priority (lower first) orders it under scheduling_policy="priority"."""
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in the engine")
        now = time.perf_counter() if arrival_time is None else arrival_time
        req = self._builder.build(request_id, prompt, params or SamplingParams(), now, priority)
        if params is not None and params.structured_outputs is not None:
            if self.grammars is None:
                from minillm.engine.grammar import GrammarGate

                self.grammars = GrammarGate(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
            self.grammars.hold(req.seqs, params.structured_outputs)  # enters the scheduler once compiled
        else:
            for s in req.seqs:
                self.scheduler.add(s)
        self.requests[request_id] = req
        self.tracer.arrived(request_id, req.seqs, now, self.scheduler.policy.lane(req.seqs[0]))
        return req

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. Returns False if it was unknown or done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        now = time.perf_counter()
        if self.grammars is not None:
            self.grammars.drop(req.seqs)
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.abort(seq)
                seq.finish_reason, seq.finish_time = "abort", now
                self.tracer.finished(seq)
        if self.proposer is not None:
            self.proposer.release(req.seqs)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished or bool(self.grammars)

    # ----- the step ----------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run, choose tokens, update; returns outputs of requests that changed."""
        t0 = time.perf_counter()
        failed = self._admit_compiled(wait=not self.scheduler.has_unfinished)
        batch = self.scheduler.schedule()
        if self.proposer is not None:
            self.proposer.propose(batch)  # drafts travel in the batch
        packed = StepBatch.build(batch.chunks)
        logits = self.executor.execute(packed) if batch.chunks else None
        chosen, masks = choose_tokens(batch, packed, logits, self.eos_token_ids, self.executor.fast_argmax)
        moves = []
        if self.proposer is not None:
            from minillm.spec_decode.tree import tree_kv_moves

            moves = tree_kv_moves(batch, chosen, self.block_manager.block_size)
        if moves:  # a tree's accepted path: its K/V to the positions it now holds (before trim frees slots)
            self.executor.move_kv(moves)
        update = self.scheduler.update(batch, chosen, t0, time.perf_counter())
        draft = None
        if self.proposer is not None:
            self.proposer.observe(batch, packed, chosen, self.executor.last_hidden)
            self.proposer.release(update.finished)  # a separate draft frees their blocks now
            draft = self.proposer.trace_record()
        self.tracer.record(batch, chosen, update, self.scheduler, self.block_manager, t0, time.perf_counter(),
                           self.executor.take_comm_stats(), draft, self.executor.take_routed_tokens(),
                           path=self.executor.last_path if batch.chunks else "", masks=masks)
        return self._outputs(failed + update.changed)

    def _admit_compiled(self, wait: bool) -> list:
        """Requests whose grammar is ready join the scheduler's queue (wait: nothing else can run);
        returns the sequences of those whose grammar failed to compile, finished."""
        if not self.grammars:
            return []
        ready, failed = self.grammars.ready(wait)
        for s in ready:
            self.scheduler.add(s)
        now = time.perf_counter()
        for seqs, err in failed:  # validated when its SamplingParams was made, so this is the library's fault
            log.warning("request %s: its grammar failed to compile (%s); aborted", seqs[0].request_id, err)
            for s in seqs:
                s.status, s.finish_reason, s.finish_time = SequenceStatus.FINISHED, "abort", now
                self.tracer.finished(s)
        return [s for seqs, _ in failed for s in seqs]

    def _outputs(self, changed) -> list[RequestOutput]:
        outputs = []
        for rid in dict.fromkeys(s.request_id for s in changed):  # each request once, in step order
            req = self.requests[rid]
            outputs.append(req.output())
            if req.finished:
                del self.requests[rid]
        return outputs

    def set_num_speculative_tokens(self, k: int) -> None:
        """Change k on an idle engine (benchmarks sweep it); the proposer and its draft are kept."""
        if self.config.speculative is None:
            raise ValueError("this engine has no speculative config")
        if self.has_unfinished_requests():
            raise ValueError("change num_tokens between runs, not while requests are in flight")
        cfg = self.config.speculative.with_num_tokens(k)
        self.proposer.check_num_tokens(k)
        self.config.speculative = cfg
        self.scheduler.num_lookahead_slots = self.config.speculative.num_lookahead_slots
        self.proposer.set_lookahead(self.scheduler.num_lookahead_slots)

    def close(self) -> None:
        """Stop worker processes, if any, and the grammar compiler's thread."""
        if self.grammars is not None:
            self.grammars.close()
        self.executor.close()

    # ----- conveniences -------------------------------------------------------------------
    def live_sequences(self):
        return [s for r in self.requests.values() for s in r.seqs if not s.is_finished]

    def kv_usage(self) -> float:
        return self.block_manager.num_used_blocks / self.block_manager.num_blocks
