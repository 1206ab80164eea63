"""What an attention backend needs to know about one engine step.

Layout conventions shared by every backend and by the Triton kernels:

* Tokens of all scheduled sequences are packed along one axis (no padding).
  Decode sequences (exactly one new token) come first, then every sequence
  with more than one new token (prefill chunks, speculative verification).
* The KV cache of one layer is two tensors, ``k_cache`` and ``v_cache``, each
  ``[num_blocks, block_size, num_kv_heads, head_dim]``. Token ``t`` of a
  sequence lives in block ``block_tables[seq, t // block_size]`` at offset
  ``t % block_size``; its flat slot is ``block * block_size + offset``.
* New K/V are written to their slots first (``slot_mapping``), then attention
  reads every key of the sequence -- cached prefix and the new chunk alike --
  through the block table. Query ``i`` of a chunk sits at absolute position
  ``seq_lens[s] - query_len[s] + i`` and sees keys ``0 .. that position``
  (a sliding-window layer: only the last ``window`` of them, see base.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    num_seqs: int
    num_decode_seqs: int  # the first num_decode_seqs sequences have one query token
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1], offsets into the packed tokens
    seq_lens: torch.Tensor  # int32 [num_seqs], keys per sequence after this step
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], padded with 0
    slot_mapping: torch.Tensor  # int64 [num_tokens], where each new K/V goes
    max_query_len: int
    max_seq_len: int
    # Python copies of the small vectors, so the torch path never syncs on .tolist()
    query_lens_list: list[int]
    seq_lens_list: list[int]
    # filled by the backend's prepare() before the forward (eager steps), reused by every layer:
    decode_slots: torch.Tensor | None = None  # int64 [num_decode_seqs * L] flat pool slot of every decode key
    decode_rows: torch.Tensor | None = None  # the same keys as rows of a cache seen as [-1, head_dim]
    decode_mask: torch.Tensor | None = None  # bool [num_decode_seqs, 1, 1, L]; None when all lengths are equal
    # the same three for the sliding-window layers, per window: derived by the first such layer, shared after
    decode_windowed: dict[int, tuple] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> "AttentionMetadata":
        """Build from plain lists (decode sequences must already come first)."""
        num_seqs = len(query_lens)
        num_decode = 0
        while num_decode < num_seqs and query_lens[num_decode] == 1:
            num_decode += 1
        slots: list[int] = []
        for qlen, slen, table in zip(query_lens, seq_lens, block_tables):
            for pos in range(slen - qlen, slen):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        max_blocks = max((len(t) for t in block_tables), default=1) or 1
        bt = torch.zeros((num_seqs, max_blocks), dtype=torch.int32)
        for i, table in enumerate(block_tables):
            if table:
                bt[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        cu = [0]
        for q in query_lens:
            cu.append(cu[-1] + q)
        return cls(
            num_seqs=num_seqs,
            num_decode_seqs=num_decode,
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=bt.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            max_query_len=max(query_lens, default=0),
            max_seq_len=max(seq_lens, default=0),
            query_lens_list=list(query_lens),
            seq_lens_list=list(seq_lens),
        )
