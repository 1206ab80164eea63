"""A draft model whose LM head scores only the most frequent tokens (FR-Spec, Zhao et al. 2025).

A small draft spends much of each forward on its LM head: Qwen2.5-Coder-0.5B's
own Q8_0 151,936 x 896 head is 145 of the 391 MB a decode step reads. Most of
those rows are tokens the text almost never uses. Keeping the N most frequent
tokens, counted on a reference corpus, cuts that read by 1 - N/V, and the draft
proposes a rarer token only where it would have been wrong anyway.

Correctness does not depend on the choice: the target verifies every guess.
Greedy output is unchanged. Under sampling, the draft's distribution q is zero
outside the kept tokens, and the rejection rule's residual max(0, p - q) covers
them, so the target's distribution is kept exactly.

The corpus is offline everywhere: the Python standard library's own source
(the code workload) and `pydoc_data.topics` (English prose about Python). It is
read in sorted file order and capped, so the count depends only on the Python
version.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn

from minillm import envs
from minillm.engine.sampler import top_tokens

CORPUS_CHARS = 4_000_000  # counting them took 1.0 s at load (Qwen2.5-Coder's tokenizer, 2 cores)


def reference_corpus(max_chars: int = CORPUS_CHARS) -> list[str]:
    """Documents: the stdlib's top-level .py files (sorted), interleaved with pydoc topics, up to max_chars."""
    from pydoc_data.topics import topics

    code = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    prose = [topics[k] for k in sorted(topics)]

    def interleaved():
        for i in range(max(len(code), len(prose))):
            if i < len(code):
                yield code[i].read_text(errors="replace")
            if i < len(prose):
                yield prose[i]

    docs, total = [], 0
    for text in interleaved():
        docs.append(text[: max_chars - total])
        total += len(docs[-1])
        if total >= max_chars:
            break
    return docs


def token_counts(tokenizer, vocab_size: int, docs: list[str] | None = None) -> torch.Tensor:
    """How often each id occurs when the corpus is tokenized (int64 [vocab_size])."""
    docs = reference_corpus() if docs is None else docs
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    flat = torch.tensor([t for doc in ids for t in doc], dtype=torch.long)
    return torch.bincount(flat[flat < vocab_size], minlength=vocab_size)


def frequent_tokens(tokenizer, vocab_size: int, n: int, docs: list[str] | None = None) -> torch.Tensor:
    """The tokenizer's special ids and the n most frequent others (ties: lower id first), topped up with
    the next most frequent to a multiple of 8 rows (the GGUF kernels' interleaved layouts); ascending."""
    if not 1 <= n <= vocab_size:
        raise ValueError(f"draft_vocab must be in [1, {vocab_size}], got {n}")
    counts = token_counts(tokenizer, vocab_size, docs)
    special = torch.tensor(sorted({i for i in getattr(tokenizer, "all_special_ids", []) if 0 <= i < vocab_size}),
                           dtype=torch.long)
    order = torch.sort(-counts, stable=True).indices  # stable: equal counts keep ascending ids
    order = order[~torch.isin(order, special)]
    total = min(vocab_size, -(-(special.numel() + n) // 8) * 8)
    return torch.sort(torch.cat([special, order[: total - special.numel()]])).values


def kept_tokens(tokenizer, vocab_size: int, n: int) -> torch.Tensor:
    """The ids a `draft_vocab=n` head keeps (frequent_tokens, n capped at the vocabulary)."""
    if tokenizer is None:
        raise ValueError("draft_vocab counts tokens on a reference corpus and needs the target's tokenizer")
    return frequent_tokens(tokenizer, vocab_size, min(n, vocab_size))


class RestrictedLMHead(nn.Module):
    """Scores only `token_ids`; every other id gets -inf (never proposed, probability 0 when sampling)."""

    def __init__(self, head: nn.Module, token_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.head = head
        self.vocab_size = vocab_size
        self.register_buffer("token_ids", token_ids.long().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.head(x)
        out = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.token_ids.to(scores.device), scores)

    def top_tokens(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """The `width` best ids per row [rows, width], ranked on the kept rows alone: the same tokens
        as top_tokens(self(x)) (the ids ascend, so the first maximum is the same one), without writing
        a vocabulary-wide row of -inf and ranking it. On SmolLM2 (4,104 kept of 49,152), one row:
        top 2 of the kept scores 9 us, against 73 us for the full row's fill, copy and topk."""
        return self.token_ids.to(x.device)[top_tokens(self.head(x).float(), width)]

    def extra_repr(self) -> str:
        return f"keeps {self.token_ids.numel()} of {self.vocab_size} tokens"


def restrict_lm_head(model, token_ids: torch.Tensor) -> RestrictedLMHead:
    """Swap `model.lm_head` for one that reads only the rows of `token_ids` (a GGUF or float head)."""
    head = model.lm_head
    ids = token_ids.long().cpu()
    if isinstance(head, RestrictedLMHead):  # a loaded draft passed in again (a second engine): in place already
        if torch.equal(head.token_ids.cpu(), ids):
            return head
        raise ValueError(f"the draft's LM head already keeps {head.token_ids.numel()} other tokens")
    model.lm_head = restricted_head(head, ids, model.config.vocab_size)
    return model.lm_head


RANKING_HEAD_ENV = envs.MINILLM_RANKING_HEAD  # "float" keeps a float target's cut ranking head in float


def q8_0_ranking_head(head: nn.Module) -> bool:
    """Whether the cut head that ranks a trained draft's guesses (Medusa, Hydra, EAGLE with draft_vocab)
    is stored as Q8_0 blocks: for a float32 CPU head where the GGUF kernels load, unless
    MINILLM_RANKING_HEAD=float. It only ranks guesses, which the target verifies at full precision, so
    output is unchanged; it is read every proposal step from memory the verify step has just flushed:
    SmolLM2's 4,104 kept rows are 9.4 MB in float32 and 2.5 MB as Q8_0. 2-vCPU Zen 5, two threads, one
    row, the cache flushed before each call: 371 -> 140 us. Hydra's tree `0/1/0-0@4096` on the chat
    prompts, one process, three alternated rounds: a proposal 1.08-1.13 -> 0.81-0.88 ms, the same
    1.527 tokens per verify, and x1.23-1.40 -> x1.28-1.50 over plain decode."""
    from minillm.cpu.kernels import gguf_cpu

    return (envs.ranking_head_q8_0() and isinstance(head, nn.Linear)
            and head.weight.dtype == torch.float32 and head.weight.device.type == "cpu"
            and head.in_features % 32 == 0 and gguf_cpu.available()[0])


def restricted_head(head: nn.Module, token_ids: torch.Tensor, vocab_size: int,
                    q8_0: bool = False) -> RestrictedLMHead:
    """A RestrictedLMHead over copies of `head`'s rows for `token_ids` (`head` itself is left whole: the
    target keeps its own head when only its Medusa guesses are ranked on the kept rows). q8_0: a float
    head's copied rows stored as Q8_0 blocks (q8_0_ranking_head says when)."""
    from minillm.quant.cpu_route import float_as_q8_0
    from minillm.quant.gguf_linear import GGUFLinear

    ids = token_ids.long().cpu()
    if q8_0 and isinstance(head, nn.Linear):
        rows = head.weight.detach()[ids.to(head.weight.device)]
        bias = None if head.bias is None else head.bias.detach()[ids.to(head.bias.device)].float().clone()
        sub: nn.Module = GGUFLinear(head.in_features, [("Q8_0", float_as_q8_0(rows))], bias)
    elif isinstance(head, GGUFLinear):
        sub = head.select_rows(ids)
    elif isinstance(head, nn.Linear):  # or a subclass that keeps its [out, in] weight (SkinnyLinear)
        # the same class: a SkinnyLinear's few-row kernel reads SmolLM2's 8,192 kept rows in ~0.6 ms, MKL in 1.5
        sub = type(head)(head.in_features, ids.numel(), bias=head.bias is not None,
                         device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            # a copy, so a tied embedding table stays whole for the input gather
            sub.weight.copy_(head.weight[ids.to(head.weight.device)])
            if head.bias is not None:
                sub.bias.copy_(head.bias[ids.to(head.bias.device)])
    else:
        raise ValueError(f"draft_vocab needs a float or GGUF LM head, not {type(head).__name__} "
                         "(load the model unquantized or from a GGUF file)")
    return RestrictedLMHead(sub, ids, vocab_size)
