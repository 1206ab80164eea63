"""Draft proposers built from the target itself: no download, no second KV pool.

Two drafts, both with the target's shapes, so they run on the target's block
tables and KV cache:

* model="int4" / "int8": a copy of the target with weight-only quantized
  linears (minillm.quant) and an int8 LM head. Its context K/V would differ a
  little from the target's; it reads the target's instead (the better
  values) and only computes the k lookahead positions itself.
* model="self": the target's first `num_layers` layers ("early exit"), then
  its final norm and LM head. Its context K/V are exactly the target's.

The draft writes its guesses' K/V into the lookahead slots; the target's
verify forward then rewrites every slot it reads, and rejected positions lie
past the accepted length, rewritten before anyone reads them. So the target's
cache ends each step exactly as it would without speculation, and the
draft's cache (the same tensors) is consistent with it by construction.

Why int4 is the default, measured on SmolLM2-135M (fp32 target, greedy,
teacher-forced next-token agreement on 6 chat answers of 48 tokens): the
target's first 8 / 16 / 20 / 24 of 30 layers agree on 1% / 7% / 16% / 31%
(layer-skip mixes of first and last layers did no better), at 27-80% of the
target's cost, so early exit never pays; the int4 (group 32) copy agrees on
~98-100% (int8: 98%, int4 group 64: 80%) at ~40% of the target's step time.
`minillm bench spec --proposers ngram,int4,self:24` shows acceptance and speed.
"""
from __future__ import annotations

import copy

import torch

from minillm.attention.metadata import AttentionMetadata
from minillm.engine.sampler import greedy_tokens
from minillm.engine.sequence import Sequence
from minillm.models.llama import LlamaForCausalLM
from minillm.spec_decode.proposal import Proposal
from minillm.spec_decode.proposer import Proposer
from minillm.spec_decode.rejection import target_probs

INT4_GROUP_SIZE = 32  # 64 agreed with the target on ~80% of next tokens, 32 on ~98%


@torch.no_grad()
def quantized_copy(target: LlamaForCausalLM, method: str) -> LlamaForCausalLM:
    """A copy of the target with int8 / int4 linears and an int8 LM head (the target is untouched)."""
    try:
        from minillm.quant import QuantLinear, quantize_model
    except ImportError as e:  # pragma: no cover - minillm.quant ships with minillm
        raise ValueError(f"speculative draft model={method!r} needs minillm.quant: {e}") from e
    draft = copy.deepcopy(target)
    quantize_model(draft, method, INT4_GROUP_SIZE if method == "int4" else None)
    head = QuantLinear.from_float(draft.lm_head.weight.float(), 8)
    if draft.embed_tokens.weight.device.type == "cpu":
        head.use_cpu_kernels()
    draft.lm_head = head  # the copy's embedding keeps the float weight it was tied to
    return draft.eval()


class DraftProposer(Proposer):
    def __init__(self, runner, draft: LlamaForCausalLM, layers: tuple[int, ...]) -> None:
        self.runner = runner  # the target's ModelRunner: its pool and backend
        self.draft = draft  # the target itself (early exit) or a quantized copy
        self.layers = layers  # indices into the draft's layers, in order

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        m = self.draft
        x = m.embed_tokens(ids)
        rope = m.rotary.lookup(positions)
        residual = None
        for i in self.layers:
            x, residual = m.layers[i](rope, x, residual, meta)
        x, _ = m.norm(x, residual)
        return m.compute_logits(x)

    @torch.inference_mode()
    def propose_tokens(self, wants: list[tuple[Sequence, int]]) -> list[Proposal]:
        """k draft steps, batched over the sequences that still want a token at that depth.

        The scheduler allocated k lookahead slots per sequence; the draft writes its
        guesses' K/V there (the target's verify forward rewrites them).
        """
        runner = self.runner
        runner.attach()
        if self.draft is not runner.model:
            runner.pool.bind(self.draft, runner.backend)  # a separate draft module uses the target's pool
        plan, dev = runner.plan, runner.device
        out = [Proposal([], [] if not s.params.greedy else None) for s, _ in wants]
        last = [s.token_ids[-1] for s, _ in wants]
        for depth in range(max((k for _, k in wants), default=0)):
            rows = [i for i, (_, k) in enumerate(wants) if k > depth]
            pos = [wants[i][0].num_tokens - 1 + depth for i in rows]
            meta = AttentionMetadata.build([1] * len(rows), [p + 1 for p in pos],
                                           [wants[i][0].block_table for i in rows], plan.block_size, dev)
            runner.backend.prepare(meta, plan.block_size, self.draft.config.num_key_value_heads, plan.quantized)
            logits = self._forward(torch.tensor([last[i] for i in rows], device=dev), torch.tensor(pos, device=dev), meta)
            greedy_tok = greedy_tokens(logits).tolist()
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
