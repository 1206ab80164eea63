"""Small random models and engine drivers for engine tests (no download, no transformers)."""
from __future__ import annotations

import random

import torch

from minillm.config import ModelConfig
from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.models.llama import LlamaForCausalLM
from minillm.models.standalone import forward_logits
from minillm.sampling_params import SamplingParams


def tiny_model(seed: int = 0, vocab: int = 97, layers: int = 2, heads: int = 4, kv_heads: int = 2,
               head_dim: int = 16, max_pos: int = 512, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=max_pos, tie_word_embeddings=True, eos_token_id=[])
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # larger weights than the default init make the logits less flat (fewer near-ties)
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    return model


def make_engine(model: LlamaForCausalLM, num_blocks: int = 256, block_size: int = 4, max_num_seqs: int = 16,
                max_num_batched_tokens: int = 64, prefix_caching: bool = True, chunked: bool = True,
                backend: str = "torch", fast_path: str | None = None) -> LLMEngine:
    """fast_path None: EngineConfig's default (MINILLM_FAST_PATH, else "auto")."""
    return LLMEngine(
        model, None, [],
        EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, enable_prefix_caching=prefix_caching,
                     max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                     enable_chunked_prefill=chunked, attention_backend=backend,
                     **({} if fast_path is None else {"fast_path": fast_path})),
    )


def run_to_completion(engine: LLMEngine, check_invariants: bool = True) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        if check_invariants:
            engine.block_manager.check_invariants(engine.live_sequences())
    return done


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def dense_greedy(model: LlamaForCausalLM, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation by recomputing the whole sequence each token (no paging, no reuse)."""
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(forward_logits(model, ids, block_size=512)[-1].argmax())
        out.append(t)
        ids.append(t)
    return out


def serve_growing_prompts(model: LlamaForCausalLM, num: int = 7, fast_path: str | None = None) -> dict[str, list[int]]:
    """Greedy tokens of `num` prompts of 3, 8, 13, ... tokens through a small engine whose 32-token budget
    splits the longer ones into chunks (whole prompts, chunked prefills and decode batches in one run):
    the run the CPU kernels' on/off tests compare."""
    engine = make_engine(model, num_blocks=60, block_size=4, max_num_seqs=5, max_num_batched_tokens=32,
                         fast_path=fast_path)
    for i in range(num):
        engine.add_request(str(i), [5 + i + j % 7 for j in range(3 + 5 * i)], greedy(8))
    return run_to_completion(engine)

