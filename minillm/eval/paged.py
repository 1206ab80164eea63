"""Teacher-forced scoring through the engine's paged path.

The text is cut into windows of ``context_len`` tokens; all windows are fed
together, ``chunk_size`` tokens per window per step, exactly as chunked
prefill feeds a prompt: every chunk writes its K/V into the paged pool and
attends to the earlier chunks *through the pool*. So a quantized KV cache
(kv_cache_dtype="int8"/"fp8") changes what later chunks see, as it does
in serving -- one dense forward would never read the cache back.

Every position's logits are scored on the spot (negative log-likelihood of the
next token, and the top-1 token) so the [tokens, vocab] logits never pile up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from minillm.engine.batch import StepBatch
from minillm.engine.config import EngineConfig
from minillm.engine.model_runner import ModelRunner
from minillm.models.llama import LlamaForCausalLM


@dataclass
class TokenScores:
    nll: torch.Tensor  # float64 [windows, context_len - 1]: -log p(next token)
    top1: torch.Tensor  # int64 [windows, context_len - 1]: argmax of the logits before each next token

    @property
    def num_tokens(self) -> int:
        return self.nll.numel()

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll.mean().item())


def engine_config(block_size: int, num_blocks: int, kv_cache_dtype: str = "auto") -> EngineConfig:
    """The pool of the scoring runner: a fixed number of blocks, the requested KV dtype, no prefix cache."""
    return EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, enable_prefix_caching=False,
                        kv_cache_dtype=kv_cache_dtype, attention_backend="torch")


def windows(token_ids: list[int], context_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows [n, context_len] from the start of the token list."""
    n = len(token_ids) // context_len
    if max_windows is not None:
        n = min(n, max_windows)
    if n < 1:
        raise ValueError(f"need at least {context_len} tokens for one window, got {len(token_ids)}")
    return torch.tensor(token_ids[: n * context_len], dtype=torch.long).view(n, context_len)


def score_windows(
    model: LlamaForCausalLM,
    wins: torch.Tensor,
    chunk_size: int = 32,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    on_logits: Callable[[torch.Tensor], None] | None = None,
) -> TokenScores:
    """Teacher-forced NLL and top-1 of every window, chunked through the paged KV cache."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n, ctx = wins.shape
    per_seq = -(-ctx // block_size)
    # built outside inference mode: the runner may re-lay the model's weights (K-major on CPU), and
    # inference-mode tensors could not be updated in place later (AWQ folds its scales into them)
    runner = ModelRunner(model, engine_config(block_size, n * per_seq, kv_cache_dtype))
    with torch.inference_mode():
        return _score(model, runner, wins, chunk_size, per_seq, on_logits)


def _score(model, runner: ModelRunner, wins, chunk_size, per_seq, on_logits) -> TokenScores:
    n, ctx = wins.shape
    device = model.embed_tokens.weight.device
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(n)]
    rows = wins.tolist()
    nll = torch.empty(n, ctx - 1, dtype=torch.float64)
    top1 = torch.empty(n, ctx - 1, dtype=torch.long)
    for start in range(0, ctx, chunk_size):
        end = min(ctx, start + chunk_size)
        m = end - start
        # every window advances by the same chunk; logits at every row (teacher forcing)
        batch = StepBatch(
            token_ids=[t for r in rows for t in r[start:end]],
            positions=list(range(start, end)) * n,
            query_lens=[m] * n,
            seq_lens=[end] * n,
            block_tables=tables,
            logit_rows=list(range(n * m)),
            chunk_logits=[(i * m, m) for i in range(n)],
        )
        logits = runner.execute(batch).view(n, m, -1)
        if on_logits is not None:
            on_logits(logits)
        # position t predicts token t + 1; the window's last position has no target
        stop = m if end < ctx else m - 1
        targets = wins[:, start + 1 : start + 1 + stop].to(device)
        logp = torch.log_softmax(logits[:, :stop], dim=-1)  # float32 logits: exact enough, 3x cheaper than float64
        nll[:, start : start + stop] = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).double().cpu()
        top1[:, start : start + stop] = logits[:, :stop].argmax(-1).cpu()
    return TokenScores(nll, top1)
