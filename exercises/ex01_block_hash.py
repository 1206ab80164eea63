"""Exercise 01 -- the prefix cache's hash chain (notebooks 03 / 06, and 14_exercises).

The paged KV pool names every FULL block by a digest chained over all tokens up to it, so a new
prompt that starts like an old one finds the old one's blocks and skips their prefill. Write the
two functions the engine calls (minillm/engine/block_manager.py: BlockManager builds with
`chain_block_hash`; `find_cached_prefix` calls `cached_prefix_blocks`).

1. chain_block_hash(parent, token_ids) -> bytes
   The digest of one full block given its parent block's digest (None for a sequence's first
   block). Contract: deterministic; a list and a tuple of the same ids hash alike; the digest
   changes when any token changes or when the parent changes (the same block after a different
   prefix is a different block); splitting tokens differently between blocks must not collide;
   return bytes from a cryptographic hash (a crafted prompt must not be able to collide with
   another user's prefix and be served its KV).
   Hints: hashlib.sha256; feed the parent (a fixed marker for None), the token count and each id
   as fixed-width bytes (struct.pack("<q", t) or int.to_bytes(8, "little", signed=True)).

2. cached_prefix_blocks(token_ids, block_size, hash_fn, lookup) -> list[int]
   Walk the chain over the prompt's leading full blocks: hash block i with hash_fn(parent, tokens)
   (tokens a tuple), ask lookup(digest, tokens) for the physical block id (None: not cached), and
   stop at the first miss. Return the block ids found, first block first.
   The catch: never cover the LAST token of the prompt, even when the whole prompt is cached --
   the step must compute at least one token to get the logits for the next one.

Check: python -m exercises block_hash
"""
from __future__ import annotations

from typing import Callable, Sequence


def chain_block_hash(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    raise NotImplementedError("exercise 01: chain_block_hash (exercises/ex01_block_hash.py)")


def cached_prefix_blocks(token_ids: Sequence[int], block_size: int,
                         hash_fn: Callable[[bytes | None, tuple[int, ...]], bytes],
                         lookup: Callable[[bytes, tuple[int, ...]], int | None]) -> list[int]:
    raise NotImplementedError("exercise 01: cached_prefix_blocks (exercises/ex01_block_hash.py)")
