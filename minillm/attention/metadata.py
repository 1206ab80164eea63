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
* A sequence verifying a tree of drafts (spec_decode/tree.py) has
  ``tree_mask``: its query ``i`` sees the keys before the chunk and those of
  the chunk's own keys ``j`` with ``tree_mask[row, j]`` (the root, its
  ancestors, itself). Its real position is ``seq_len - query_len +
  tree_depth[row]`` (the window counts from there); without a tree the mask
  row is causal and the depth is ``i``, so every packed row reads the same way.
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
    # per-step state a backend's prepare() derives for its own layers (a fast path's subclass keeps
    # its kernel's row layout here); opaque to the model and to every other backend
    backend_state: object | None = None
    # tree verification (None when no sequence of the step verifies a tree): per packed row, which of its
    # chunk's own keys it sees (bool [num_tokens, max_query_len]) and its offset in positions (int32 [num_tokens])
    tree_mask: torch.Tensor | None = None
    tree_depth: torch.Tensor | None = None
    tree_seqs: list[bool] | None = None  # which packed sequences carry a tree
    # a decode-only step whose shapes come from its tensors alone (a captured CUDA graph replays it with
    # other values in the same buffers): backends then read no Python list and derive no per-step state
    static_shapes: bool = False

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
        tree_parents: list[list[int] | None] | None = None,
    ) -> "AttentionMetadata":
        """Build from plain lists (decode sequences must already come first).

        tree_parents: per sequence, the parents of the draft tree filling its last rows, or None."""
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
        tree = tree_tensors(query_lens, tree_parents, device) if tree_parents is not None else (None, None)
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
            tree_mask=tree[0],
            tree_depth=tree[1],
            tree_seqs=None if tree_parents is None else [t is not None for t in tree_parents],
        )


def tree_tensors(query_lens: list[int], tree_parents: list[list[int] | None],
                 device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed (tree_mask, tree_depth) of a step (see the module docstring)."""
    from minillm.spec_decode.tree import ancestor_mask, node_depths

    width = max(query_lens, default=1) or 1
    rows = []
    depths = []
    for lq, parents in zip(query_lens, tree_parents):
        m = torch.ones((lq, lq), dtype=torch.bool).tril()
        d = list(range(lq))
        if parents is not None:  # the last 1 + N rows: the root, then the nodes
            n = len(parents)
            base = lq - 1 - n
            m[base:, base:] = ancestor_mask(parents)
            d[base + 1:] = [base + x for x in node_depths(parents)]
        rows.append(torch.nn.functional.pad(m, (0, width - lq)))
        depths.extend(d)
    mask = torch.cat(rows) if rows else torch.zeros((0, width), dtype=torch.bool)
    return mask.to(device), torch.tensor(depths, dtype=torch.int32, device=device)
