"""The EAGLE proposer: a one-layer draft that reads the context, run on the target's own features (eagle_layer.py).

    minillm train-eagle --out eagle.safetensors                 # ~15 min on 2 cores for the default model
    LLM(speculative={"method": "eagle", "heads": "eagle.safetensors", "num_tokens": 1, "draft_vocab": 4096})

No layer ships with minillm: trained on the same hour-scale budget as the shipped
Hydra heads, it guessed no better than they do on the benchmarks (README).

After every step the engine hands the proposer the final hidden state of every
row the target ran (`ModelRunner.keep_all_hidden`). For each sequence, the
rows the sequence kept (a prefill chunk; a decode and its accepted guesses) go
through the layer with the tokens that followed them, and their K/V join the
layer's cache for that sequence (a dense tensor per sequence, EagleCache): the
cache then holds the target's true features for every position up to the
newest token's. The last row's output ĥ predicts the feature of the newest
token, and LM_head(ĥ) is the first guess: no layer pass is left for it.

Each further guess is one layer pass over one row per sequence, reading the
layer's own ĥ and the guessed token, writing K/V past the cache's true part;
the next observe forgets those positions (EagleCache.keep_until) and writes
the target's features in their place. So a proposal costs k - 1 layer passes
and k LM-head passes (a cut head, draft_vocab, makes those small), and a step
one more layer pass over the kept rows.

The guesses are deterministic (top-1), so verification treats q as one-hot and
stays exact for sampled requests too (spec_decode/rejection.py). A prefix-cache
hit skips positions whose features the target never computed: the cache starts
after them (the guesses read less context; the output is unchanged).
"""
from __future__ import annotations

import torch

from minillm.engine.sampler import greedy_tokens
from minillm.engine.sequence import Sequence
from minillm.cpu.skinny_linear import SkinnyLinear, use_skinny_linears
from minillm.spec_decode.eagle_layer import EagleCache, EagleLayer
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer


class EagleProposer(Proposer):
    def __init__(self, runner, layer: EagleLayer, lm_head: torch.nn.Module | None = None) -> None:
        """lm_head: what ranks the guesses (default: the target's own LM head; a RestrictedLMHead with
        draft_vocab reads fewer rows; the target verifies every guess, so the output is unchanged)."""
        model = runner.model
        self.runner = runner
        self.lm_head = lm_head
        self.layer = layer.to(device=runner.device, dtype=model.embed_tokens.weight.dtype).eval()
        if any(isinstance(m, SkinnyLinear) for m in model.modules()):  # the target's few-row products: the layer's too
            use_skinny_linears(self.layer)
        self.embed = model.embed_tokens
        self.rotary = model.rotary
        self.caches: dict[int, EagleCache] = {}  # seq_id -> the layer's K/V for that sequence
        self.feature: dict[int, tuple[int, torch.Tensor]] = {}  # seq_id -> (its token count then, ĥ of the newest token)
        runner.keep_all_hidden = True

    def release(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.caches.pop(s.seq_id, None)
            self.feature.pop(s.seq_id, None)

    def _extend(self, seq_ids: list[int], h: torch.Tensor, tokens: list[int], positions: list[int],
                counts: list[int]) -> torch.Tensor:
        """Rows of several sequences (counts[i] consecutive rows of seq_ids[i], at those positions) through
        the layer: one product per weight, attention per sequence against its own cache."""
        dev = h.device
        pos = torch.tensor(positions, device=dev)
        x = self.layer.inputs(h.to(self.layer.fc.weight.dtype), self.embed(torch.tensor(tokens, device=dev)))
        q, k, v = self.layer.project_qkv(x, self.rotary.lookup(pos))
        out, first = [], 0
        for sid, n in zip(seq_ids, counts):
            sl = slice(first, first + n)
            out.append(self.layer.attend(q[sl], k[sl], v[sl], self.caches[sid]))
            first += n
        return self.layer.finish(x, torch.cat(out))

    @torch.inference_mode()
    def observe(self, batch, step, chosen, hidden) -> None:
        every = self.runner.last_all_hidden
        if every is None:
            return
        seq_ids, rows, tokens, positions, counts, newest = [], [], [], [], [], []
        for i, (c, picked) in enumerate(zip(batch.chunks, chosen)):
            seq = c.seq
            if seq.is_finished:
                self.release([seq])
                continue
            kept = c.num_new_tokens + (picked.num_accepted if picked is not None else 0)
            start = c.num_computed_before
            kept = min(kept, seq.num_tokens - 1 - start)  # each row needs the token after it
            if kept <= 0:
                continue
            cache = self.caches.get(seq.seq_id)
            if cache is None:
                cache = self.caches[seq.seq_id] = self.layer.new_cache()
            cache.keep_until(start)  # forget last step's guesses (and anything a recompute redoes)
            first = step.chunk_first_row[i]
            seq_ids.append(seq.seq_id)
            rows.extend(range(first, first + kept))
            tokens.extend(seq.token_ids[start + 1 : start + kept + 1])
            positions.extend(range(start, start + kept))
            counts.append(kept)
            # the last row's ĥ is the newest token's feature when the chunk ran up to the newest token
            newest.append(seq.num_tokens if picked is not None and start + kept == seq.num_tokens - 1 else None)
        if not seq_ids:
            return
        out = self._extend(seq_ids, every[torch.tensor(rows, device=every.device)], tokens, positions, counts)
        last = -1
        for sid, n, num_tokens in zip(seq_ids, counts, newest):
            last += n
            if num_tokens is not None:  # the first guess reads it while the sequence still has this many tokens
                self.feature[sid] = (num_tokens, out[last].clone())

    def head_guesses(self, x: torch.Tensor) -> list[int]:
        """Each row's greedy guess, on the target's LM head or on the cut one's kept rows (draft_vocab)."""
        if self.lm_head is None:
            return greedy_tokens(self.runner.model.compute_logits(x)).tolist()
        return self.lm_head.top_tokens(x, 1)[:, 0].tolist()

    @torch.inference_mode()
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        out = [Proposal([], None) for _ in wants]
        # sequences whose newest token's feature is here (not e.g. one being recomputed after preemption)
        ready = [i for i, (s, k) in enumerate(wants) if self.feature.get(s.seq_id, (-1,))[0] == s.num_tokens]
        if not ready:
            return out
        z = torch.stack([self.feature[wants[i][0].seq_id][1] for i in ready])
        for depth in range(max(wants[i][1] for i in ready)):
            guesses = self.head_guesses(z)
            for i, g in zip(ready, guesses):
                out[i].token_ids.append(g)
            ready_next = [j for j, i in enumerate(ready) if wants[i][1] > depth + 1]
            if not ready_next:
                break
            ready = [ready[j] for j in ready_next]
            seqs = [wants[i][0] for i in ready]
            # the guess's own position: the newest token's, plus the guesses before it
            positions = [s.num_tokens - 1 + depth for s in seqs]
            z = self._extend([s.seq_id for s in seqs], z[ready_next], [guesses[j] for j in ready_next], positions,
                             [1] * len(seqs))
        return out
