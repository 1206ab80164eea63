"""A separate, smaller model proposes: its own weights, its own paged KV pool, its own block tables.

    LLM("qwen2.5-coder-1.5b", speculative={"method": "draft", "model": "qwen2.5-coder-0.5b", "num_tokens": 5})

The draft is a second model of the same tokenizer (checked at load). It keeps
K/V for every sequence it proposes for, in a pool of its own that the
target's scheduler never sees, run by a ModelRunner of its own (so
`compile=True` compiles its decode steps too). Per step and sequence:

    catch up   one forward over the tokens it has not cached yet (the prompt the
               first time; afterwards the target's correction or bonus token and
               any accepted drafts it did not write) -> draft token 1
    k - 1      decode forwards, each feeding the previous guess -> draft tokens 2..k

Every sequence of the step shares each forward (catch-up chunks packed like a
prefill batch, then batched decodes). After verification the target accepted
a of the k guesses: the draft's K/V of the first min(a, k - 1) guesses are
exactly what it would compute for those tokens, so they are kept; the slots of
rejected guesses are rolled back (BlockManager.trim) before the next catch-up.

When the draft pool is full, the states of sequences not proposing this step
are evicted first (least recently used; they catch up again later); if that
is not enough the sequence gets no proposal this step and decodes plainly. A
finished or aborted sequence's draft blocks are freed at once (`release`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from minillm.engine.batch import StepBatch
from minillm.engine.block_manager import BlockManager
from minillm.engine.config import EngineConfig
from minillm.engine.cost import model_costs, step_cost
from minillm.engine.model_runner import ModelRunner
from minillm.engine.sampler import greedy_tokens
from minillm.engine.sequence import Sequence
from minillm.engine.trace import DraftRecord
from minillm.models.llama import LlamaForCausalLM
from minillm.quant.footprint import bytes_per_weight
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer
from minillm.spec_decode.rejection import target_probs


MAX_CATCH_UP_DECODE_ROWS = 4  # a catch-up this short runs as decode rows (see DraftModelProposer._forward)


@dataclass
class DraftSeqState:
    """The draft pool's view of one target sequence (BlockManager reads the first three fields)."""

    seq_id: int
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # leading tokens of the sequence whose draft K/V are valid
    block_hashes: list = field(default_factory=list)  # stays empty: the draft pool caches no prefix
    written: list[int] = field(default_factory=list)  # guesses whose K/V sit right after those tokens
    last_step: int = 0  # for least-recently-used eviction


@dataclass
class _StepTally:
    """What the draft did since the last trace record."""

    forwards: int = 0
    tokens: int = 0  # rows computed: catch-up tokens plus guesses fed back
    catch_up_tokens: int = 0
    duration_s: float = 0.0
    flops: float = 0.0
    bytes_moved: float = 0.0
    evicted_seqs: list[int] = field(default_factory=list)
    starved_seqs: list[int] = field(default_factory=list)  # wanted a proposal, no draft block left


class DraftModelProposer(Proposer):
    def __init__(self, draft: LlamaForCausalLM, config: EngineConfig, num_blocks: int,
                 compile: bool | None = None) -> None:
        """compile: torch.compile the draft's decode forwards (None: as the engine's config says)."""
        # draft_loading.load_draft has checked that its vocabulary is the target's
        self.config = config.replace(num_kv_blocks=num_blocks, speculative=None, enable_prefix_caching=False,
                                     compile=config.compile if compile is None else compile)
        self.runner = ModelRunner(draft, self.config)  # its own pool, backend and compiled decode
        self.model = draft
        self.bm = BlockManager(num_blocks, config.block_size, enable_prefix_caching=False)
        self.states: dict[int, DraftSeqState] = {}
        self._step = 0
        self._tally = _StepTally()
        cfg = draft.config
        plan = self.runner.plan
        self._bytes_per_weight = bytes_per_weight(draft)
        self._bytes_per_kv_elem = plan.bytes_per_token / (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim)
        self._model_costs = model_costs(cfg, self._bytes_per_weight)

    # ----- the proposer's contract ----------------------------------------------------------
    @torch.inference_mode()
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        t0 = time.perf_counter()
        self._step += 1
        out = [Proposal([], None if s.params.greedy else []) for s, _ in wants]
        proposing = {s.seq_id for s, _ in wants}
        ready: list[int] = []  # indices into wants that got their draft blocks
        for i, (seq, k) in enumerate(wants):
            st = self.states.get(seq.seq_id)
            if st is None:
                st = self.states[seq.seq_id] = DraftSeqState(seq.seq_id)
            self._roll_forward(st, seq)
            st.last_step = self._step
            # K/V slots up to the last guess fed back: the sequence's tokens plus k - 1 guesses
            if self._reserve(st, seq.num_tokens + k - 1 - st.num_computed_tokens, proposing):
                ready.append(i)
            else:
                self._tally.starved_seqs.append(seq.seq_id)
        if ready:
            self._draft(wants, ready, out)
        self._tally.duration_s += time.perf_counter() - t0
        return out

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            st = self.states.pop(seq.seq_id, None)
            if st is not None:
                self.bm.free(st)

    def trace_record(self) -> DraftRecord:
        t, self._tally = self._tally, _StepTally()
        ev = self.bm.take_events()
        return DraftRecord(
            num_blocks=self.bm.num_blocks, num_used_blocks=self.bm.num_used_blocks,
            block_tables=tuple((sid, tuple(st.block_table)) for sid, st in self.states.items() if st.block_table),
            cached_tokens=tuple((sid, st.num_computed_tokens) for sid, st in self.states.items()),
            blocks_allocated=tuple(ev.allocated), blocks_freed=tuple(ev.freed),
            num_forwards=t.forwards, num_tokens=t.tokens, num_catch_up_tokens=t.catch_up_tokens,
            duration_s=t.duration_s, flops=t.flops, bytes_moved=t.bytes_moved,
            evicted_seqs=tuple(t.evicted_seqs), starved_seqs=tuple(t.starved_seqs),
        )

    # ----- bookkeeping ------------------------------------------------------------------------
    def _roll_forward(self, st: DraftSeqState, seq: Sequence) -> None:
        """Keep the written guesses the target accepted; roll back the slots of the rest."""
        n, kept = st.num_computed_tokens, 0
        for tok in st.written:
            # at least one token stays uncached: the catch-up forward needs an input
            if n + kept >= seq.num_tokens - 1 or seq.token_ids[n + kept] != tok:
                break
            kept += 1
        st.num_computed_tokens = min(n + kept, seq.num_tokens - 1)
        st.written = []
        self.bm.trim(st)

    def _reserve(self, st: DraftSeqState, num_new: int, proposing: set[int]) -> bool:
        """Draft blocks for num_new more tokens; evict idle sequences' states if the pool is short."""
        while not self.bm.can_allocate(st, num_new):
            idle = [s for s in self.states.values() if s.seq_id not in proposing and s.block_table]
            if not idle:
                return False
            victim = min(idle, key=lambda s: s.last_step)
            self.bm.free(victim)
            del self.states[victim.seq_id]
            self._tally.evicted_seqs.append(victim.seq_id)
        self.bm.allocate(st, num_new)
        return True

    # ----- the draft's forwards -----------------------------------------------------------------
    def _draft(self, wants: list[tuple[Sequence, int]], ready: list[int], out: list[Proposal]) -> None:
        states = [self.states[wants[i][0].seq_id] for i in ready]
        # depth 0: every ready sequence catches up in one packed forward and guesses its first token
        items = []
        for i, st in zip(ready, states):
            seq = wants[i][0]
            items.append((seq.token_ids[st.num_computed_tokens:], st.num_computed_tokens, st.block_table))
            self._tally.catch_up_tokens += seq.num_tokens - st.num_computed_tokens
        logits = self._forward(items)
        for j, (i, st) in enumerate(zip(ready, states)):
            st.num_computed_tokens = wants[i][0].num_tokens
            self._choose(wants[i][0], logits[j], out[i])
        # depths 1 .. k-1: batched single-token decodes over those still wanting a guess
        depth = 1
        while True:
            rows = [(i, st) for i, st in zip(ready, states) if wants[i][1] > depth]
            if not rows:
                break
            items = [([out[i].token_ids[-1]], wants[i][0].num_tokens - 1 + depth, st.block_table) for i, st in rows]
            logits = self._forward(items)
            for j, (i, st) in enumerate(rows):
                st.written.append(out[i].token_ids[-1])  # its K/V were just written
                self._choose(wants[i][0], logits[j], out[i])
            depth += 1

    def _forward(self, items: list[tuple[list[int], int, list[int]]]) -> torch.Tensor:
        """items: (token ids, first position, block table) per sequence -> logits at each last token.

        A short catch-up (the last guess and the target's bonus token, after a full acceptance) runs as
        decode rows, one per token, sharing the sequence's block table: every row's K/V is stored before
        any row attends, and row i reads the keys up to its own position, which is the causal mask. So
        the whole forward stays decode-only -- the shape a compiled draft serves (a 2-token chunk would
        fall back to the eager prefill path) -- and each row attends with the decode kernel."""
        # decode rows first, then longer catch-ups (a prompt) as chunks: the packing rule
        order = sorted(range(len(items)), key=lambda j: len(items[j][0]) > MAX_CATCH_UP_DECODE_ROWS)
        b = StepBatch([], [], [], [], [], [], [])
        last_row = [0] * len(items)
        for j in order:
            toks, start, table = items[j]
            b.token_ids.extend(toks)
            b.positions.extend(range(start, start + len(toks)))
            if len(toks) > MAX_CATCH_UP_DECODE_ROWS:
                b.query_lens.append(len(toks))
                b.seq_lens.append(start + len(toks))
                b.block_tables.append(table)
            else:  # one packed "sequence" per token, each seeing the keys up to its own position
                b.query_lens.extend([1] * len(toks))
                b.seq_lens.extend(range(start + 1, start + len(toks) + 1))
                b.block_tables.extend([table] * len(toks))
            last_row[j] = len(b.token_ids) - 1
        b.logit_rows = last_row
        b.chunk_logits = [(j, 1) for j in range(len(items))]
        logits = self.runner.execute(b)
        t = self._tally
        t.forwards += 1
        t.tokens += len(b.token_ids)
        cost = step_cost(self.model.config, list(zip(b.query_lens, b.seq_lens)), len(items),
                         self._bytes_per_weight, self._bytes_per_kv_elem, self._model_costs)
        t.flops += cost.flops
        t.bytes_moved += cost.bytes_moved
        return logits

    def _choose(self, seq: Sequence, logits: torch.Tensor, prop: Proposal) -> None:
        if seq.params.greedy:
            prop.token_ids.append(int(greedy_tokens(logits)))
            return
        q = target_probs(logits[None].float(), seq.params)[0]
        prop.token_ids.append(int(torch.multinomial(q, 1, generator=seq.generator)))
        prop.probs.append(q)
