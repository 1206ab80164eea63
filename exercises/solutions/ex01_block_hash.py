"""A worked answer to exercise 01 (exercises/ex01_block_hash.py)."""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, Sequence

# the engine's marker (block_manager.ROOT_HASH), so these digests equal the engine's byte for byte
NO_PARENT = hashlib.sha256(b"minillm prefix cache: no parent block").digest()  # 32 bytes, like any digest


def chain_block_hash(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    # fixed-width fields (32-byte parent, int64 count, int64 ids): no two messages read alike
    n = len(token_ids)
    message = (NO_PARENT if parent is None else parent) + struct.pack(f"<q{n}q", n, *token_ids)
    return hashlib.sha256(message).digest()


def cached_prefix_blocks(token_ids: Sequence[int], block_size: int,
                         hash_fn: Callable[[bytes | None, tuple[int, ...]], bytes],
                         lookup: Callable[[bytes, tuple[int, ...]], int | None]) -> list[int]:
    found: list[int] = []
    parent = None
    num_blocks = (len(token_ids) - 1) // block_size  # full blocks before the last token
    for i in range(num_blocks):
        tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
        digest = hash_fn(parent, tokens)
        block = lookup(digest, tokens)
        if block is None:  # the chain breaks here: later blocks cannot be reused either
            break
        found.append(block)
        parent = digest
    return found
