"""Self-draft: a subset of the target's own layers, then its final norm and LM head.

It needs no download and no second KV pool: it runs on the target's block
tables and cache. Each kept layer reads the target's K/V of the context
(exactly its own for the first N layers, a good stand-in for later ones) and
writes its guesses at the lookahead slots; the target's verify forward then
overwrites every slot it reads with its own values, and rejected positions
lie past the accepted length, overwritten before anyone reads them. So the
target's cache is exactly what it would be without speculation.

Which layers: the first N ("early exit") or every other one ("layer skip",
Zhang et al. 2023, Draft & Verify); see minillm/bench/spec.py for the
measured acceptance.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.engine.sequence import Sequence
from minillm.spec.proposal import Proposal
from minillm.spec.rejection import target_probs


@dataclass
class SelfDraftProposer:
    model: torch.nn.Module  # LlamaForCausalLM (the target)
    layers: tuple[int, ...]  # indices into the target's layers, in order
    block_size: int

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        m = self.model
        x = m.embed_tokens(ids)
        rope = m.rotary.lookup(positions)
        residual = None
        for i in self.layers:
            x, residual = m.layers[i](rope, x, residual, meta)
        x, _ = m.norm(x, residual)
        return m.compute_logits(x)

    @torch.inference_mode()
    def propose(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        """k draft steps, batched over the sequences that still want a token at that depth.

        The caller has attached the pool and allocated k + 1 lookahead slots per sequence.
        """
        out = [Proposal([], [] if not s.params.greedy else None) for s, _ in wants]
        last = [s.token_ids[-1] for s, _ in wants]
        dev = self.model.embed_tokens.weight.device
        for depth in range(max((k for _, k in wants), default=0)):
            rows = [i for i, (_, k) in enumerate(wants) if k > depth]
            pos = [wants[i][0].num_tokens - 1 + depth for i in rows]
            meta = AttentionMetadata.build([1] * len(rows), [p + 1 for p in pos],
                                           [wants[i][0].block_table for i in rows], self.block_size, dev)
            logits = self._forward(torch.tensor([last[i] for i in rows], device=dev), torch.tensor(pos, device=dev), meta)
            greedy_tok = logits.argmax(-1).tolist()
            for j, i in enumerate(rows):
                seq = wants[i][0]
                if seq.params.greedy:
                    tok = greedy_tok[j]
                else:
                    q = target_probs(logits[j : j + 1], seq.params)[0]
                    tok = int(torch.multinomial(q, 1, generator=seq.generator))
                    out[i].probs.append(q)
                out[i].token_ids.append(tok)
                last[i] = tok
        return out
