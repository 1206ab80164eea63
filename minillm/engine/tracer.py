"""StepTracer: assembles one StepTrace record per engine step (the record every view reads).

The engine tells it what happened between steps (arrivals, aborts) and hands
it each step's batch and update; the tracer adds the pool's events and state,
the step's analytic cost (engine/cost.py, drafts included, counted once) and
the executor's collective traffic, and appends an immutable record.
"""
from __future__ import annotations

from minillm.config import ModelConfig
from minillm.engine import trace as tr
from minillm.engine.batch import ScheduledBatch
from minillm.engine.block_manager import BlockManager
from minillm.engine.cost import model_costs, step_cost
from minillm.engine.scheduler import ChosenTokens, Scheduler, StepUpdate
from minillm.engine.sequence import Sequence


class StepTracer:
    def __init__(self, model_config: ModelConfig, bytes_per_weight: float, bytes_per_kv_elem: float,
                 token_budget: int, max_num_seqs: int) -> None:
        self.model_config = model_config  # the whole model (a TP shard's config is its rank's slice)
        self.bytes_per_weight = bytes_per_weight  # as stored: a quantized model's codes + scales per weight
        self.bytes_per_kv_elem = bytes_per_kv_elem  # as stored: int8/fp8 caches add their scales
        self.model_costs = model_costs(model_config, bytes_per_weight)  # the same every step
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.trace: list[tr.StepTrace] = []  # a long-running server may trim it; steps keep counting
        self.num_steps = 0
        self._arrivals: list[tr.Arrival] = []
        self._finished: list[tr.Finished] = []

    # ----- between steps -----------------------------------------------------------------
    def arrived(self, request_id: str, seqs: list[Sequence], arrival_time: float, lane: str = "") -> None:
        self._arrivals.append(tr.Arrival(request_id, tuple(s.seq_id for s in seqs), arrival_time,
                                         seqs[0].num_prompt_tokens, seqs[0].priority, lane,
                                         tuple(seqs[0].token_ids[: seqs[0].num_prompt_tokens])))

    def finished(self, seq: Sequence) -> None:
        self._finished.append(tr.Finished(seq.seq_id, seq.request_id, seq.finish_reason or "abort",
                                          seq.num_output_tokens))

    # ----- one step ------------------------------------------------------------------------
    def record(self, batch: ScheduledBatch, chosen: list[ChosenTokens | None], update: StepUpdate,
               scheduler: Scheduler, bm: BlockManager, start: float, end: float, comm=None,
               draft: tr.DraftRecord | None = None, routed=None, path: str = "", masks=None) -> tr.StepTrace:
        for seq in update.finished:
            self.finished(seq)
        scheduled, spec = [], []
        pre = dec = n_spec = 0
        lane = scheduler.policy.lane
        for c, picked in zip(batch.chunks, chosen):
            drafts = len(c.draft_token_ids)
            before = c.num_computed_before
            if drafts:
                phase = "verify"
            elif c.num_new_tokens == 1 and before >= c.seq.num_prompt_tokens:
                phase = "decode"
            else:
                phase = "prefill"
            if phase == "prefill":
                pre += c.num_new_tokens
            else:
                dec += c.num_new_tokens
            n_spec += drafts
            scheduled.append(tr.ScheduledSeq(
                c.seq.seq_id, c.seq.request_id, phase, c.num_query_tokens, before,
                before + c.num_query_tokens, c.num_prefix_hit_tokens, c.seq.num_prompt_tokens, picked is not None,
                c.seq.priority, lane(c.seq),
            ))
            if c.num_lookahead:
                accepted = picked.num_accepted if picked is not None else 0
                emitted = len(update.emitted.get(c.seq.seq_id, ()))
                parents = tuple(c.draft_parents or ())
                path = tuple((picked.accepted_nodes or ()) if picked is not None else ())
                if parents:  # a tree: the bonus comes at a leaf
                    bonus = bool(path) and path[-1] not in parents
                else:
                    bonus = bool(drafts) and accepted == drafts
                spec.append(tr.SpecRecord(c.seq.seq_id, drafts, accepted, tuple(c.draft_token_ids), emitted,
                                          bonus, parents, path))
        cost = step_cost(
            self.model_config,
            [(c.num_query_tokens, c.num_computed_before + c.num_query_tokens) for c in batch.chunks],
            sum(1 + len(c.draft_token_ids) for c, picked in zip(batch.chunks, chosen) if picked is not None),
            self.bytes_per_weight, self.bytes_per_kv_elem, self.model_costs,
        ) if batch.chunks else None
        ev = bm.take_events()
        ref_counts, cached, free_order = bm.block_snapshot()
        holders = scheduler.running
        arrivals, finished = self._arrivals, self._finished
        self._arrivals, self._finished = [], []
        rec = tr.StepTrace(
            step=self.num_steps, start_time=start, duration_s=end - start,
            scheduled=tuple(scheduled), num_prefill_tokens=pre, num_decode_tokens=dec, num_spec_tokens=n_spec,
            token_budget=self.token_budget, max_num_seqs=self.max_num_seqs,
            num_waiting=scheduler.num_waiting, num_running=len(holders),
            arrivals=tuple(arrivals),
            new_tokens=tuple(tr.NewTokens(sid, tuple(toks)) for sid, toks in update.emitted.items()),
            finished=tuple(finished),
            preemptions=tuple(
                tr.Preemption(p.seq.seq_id, p.seq.request_id, p.reason, p.num_blocks_freed, p.num_tokens_lost)
                for p in batch.preempted
            ),
            num_blocks=bm.num_blocks, block_size=bm.block_size,
            blocks_allocated=tuple(ev.allocated), blocks_freed=tuple(ev.freed),
            blocks_evicted=tuple(ev.evicted), blocks_shared=tuple(ev.shared),
            block_tables=tuple((s.seq_id, tuple(s.block_table)) for s in holders),
            block_ref_counts=ref_counts, block_cached=cached, free_queue=free_order,
            prefix_queried_tokens=ev.queried_tokens, prefix_hit_tokens=ev.hit_tokens,
            spec=tuple(spec),
            flops=cost.flops if cost else 0.0, bytes_moved=cost.bytes_moved if cost else 0.0,
            weight_bytes=cost.weight_bytes if cost else 0.0,
            kv_read_bytes=cost.kv_read_bytes if cost else 0.0, kv_write_bytes=cost.kv_write_bytes if cost else 0.0,
            **({} if comm is None else {
                "allreduce_bytes": float(comm.allreduce_bytes), "allgather_bytes": float(comm.allgather_bytes),
                "comm_time_s": comm.time_s, "p2p_bytes": float(comm.p2p_bytes)}),
            draft=draft, prefix_tree=bm.prefix_tree_snapshot(),
            **({} if masks is None else {"grammar_rows": masks.rows, "grammar_s": masks.seconds}),
            **({} if routed is None else {"moe_layers": routed.layers, "expert_tokens": routed.counts}),
            queue=tuple(tr.QueueEntry(s.seq_id, s.request_id, s.priority, lane(s), running)
                        for group, running in ((scheduler.waiting, False), (holders, True)) for s in group),
            scheduling_policy=scheduler.policy.name,
            path=path,
        )
        self.trace.append(rec)
        self.num_steps += 1
        return rec
