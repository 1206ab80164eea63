"""Tree verification (spec_decode/tree.py): the tree mask in both backends, the walk, the K/V moves.

The outside reference for the mask is the model run densely on each root-to-node path
by itself (models/standalone.forward_logits): one verify step over the whole tree must
give every node the logits its own path gives. The kernels are checked against the plain
PyTorch reference with a tree mask, and the reference against an explicit per-path loop.
Greedy engine runs with a tree equal plain greedy (real model and heads in
test_spec_greedy.py; sampling keeps the target's distribution in test_spec_distribution.py).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from minillm.attention.metadata import AttentionMetadata  # noqa: E402
from minillm.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from minillm.engine.batch import StepBatch  # noqa: E402
from minillm.engine.config import EngineConfig  # noqa: E402
from minillm.engine.model_runner import ModelRunner  # noqa: E402
from minillm.kernels.prefill import prefill_attention, prefill_attention_ref  # noqa: E402
from minillm.kernels.testing import make_paged_workload  # noqa: E402
from minillm.models.standalone import forward_logits  # noqa: E402
from minillm.sampling_params import SamplingParams  # noqa: E402
from minillm.spec_decode.rejection import verify_tree  # noqa: E402
from minillm.spec_decode.tree import (  # noqa: E402
    TreeTemplate, ancestor_mask, chain_parents, node_depths, path_kv_moves,
)
from tests.helpers.engine_utils import tiny_model  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TREE = [-1, -1, -1, 0, 0, 1, 3, 3]  # 3 children of the root; depth up to 3; node 6, 7 under node 3


def path_to(parents, node):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


# ----- the template and the mask ---------------------------------------------------------
def test_template_from_widths_and_paths():
    t = TreeTemplate.from_spec([3, 2, 1])
    assert t.num_nodes == 3 + 6 + 6 and t.depth == 3 and t.topk_per_head() == [3, 2, 1]
    parents = t.parents()
    assert all(-1 <= p < j for j, p in enumerate(parents))  # parents come before their children
    assert node_depths(parents) == [1] * 3 + [2] * 6 + [3] * 6
    # a prefix of the node list is a tree too (a short budget takes one)
    assert all(-1 <= p < j for j, p in enumerate(t.parents(5)))
    explicit = TreeTemplate.from_spec([[1, 0], [0], [1], [0, 0]])
    assert explicit.paths == ((0,), (1,), (0, 0), (1, 0))  # sorted parents first
    assert explicit.parents() == [-1, -1, 0, 1]
    assert explicit.tokens([[10, 11], [20]]) == [10, 11, 20, 20]  # one head ranks for every parent
    chain = TreeTemplate.from_spec([1, 1, 1])
    assert chain.parents() == chain_parents(3)


@pytest.mark.parametrize("bad", [[[0, 1]], [[0], [0]], [0, 2], [], "3x2", [[0], [-1]]])
def test_bad_tree_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="tree"):
        TreeTemplate.from_spec(bad)


def test_ancestor_mask():
    m = ancestor_mask(TREE)
    for j in range(len(TREE)):
        seen = {0} | {1 + a for a in path_to(TREE, j)}
        assert {c for c in range(len(TREE) + 1) if m[1 + j, c]} == seen
    assert m[0].tolist() == [True] + [False] * len(TREE)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_path_moves_are_safe_in_place(data):
    """Copying the listed pairs one by one leaves the path's values at root + 1, root + 2, ..."""
    n = data.draw(st.integers(1, 12))
    parents = [data.draw(st.integers(-1, j - 1)) for j in range(n)]
    leaf = data.draw(st.integers(0, n - 1))
    path = path_to(parents, leaf)
    root, bs = data.draw(st.integers(0, 9)), data.draw(st.sampled_from([1, 2, 4, 16]))
    nblocks = -(-(root + 2 + n) // bs)
    table = data.draw(st.permutations(list(range(nblocks))))
    pool = {}
    for pos in range(root + 1 + n):
        pool[table[pos // bs] * bs + pos % bs] = ("node", pos - root - 1) if pos > root else ("cached", pos)
    for src, dst in path_kv_moves(table, bs, root, path):
        pool[dst] = pool[src]
    for d, node in enumerate(path, start=1):
        assert pool[table[(root + d) // bs] * bs + (root + d) % bs] == ("node", node)
    for pos in range(root + 1):
        assert pool[table[pos // bs] * bs + pos % bs] == ("cached", pos)


# ----- kernels and backends against the references ----------------------------------------
def tree_workload(window=None, quant=None):
    """Three sequences in one launch: a tree verify after 37 cached keys, a plain prefill chunk, a decode-like row."""
    h, kvh, d, bs = 4, 2, 16, 8
    ctx = 37
    n = len(TREE)
    qlens, lens = [1 + n, 20, 3], [ctx + 1 + n, 45, 9]
    w = make_paged_workload(qlens, lens, h, kvh, d, bs, torch.float32, seed=5, device=DEV)
    meta = AttentionMetadata.build(qlens, lens, w.block_tables_list, bs, DEV, [TREE, None, None])
    return w, meta, qlens, lens


def tree_reference_by_path(w, qlens, lens, scale, window=None):
    """Every tree row attends to the cached keys plus its own path only: an explicit loop."""
    h, kvh = w.q.shape[1], w.k_cache.shape[2]
    bs = w.k_cache.shape[1]
    n = lens[0]
    pos = torch.arange(n)
    blocks = torch.tensor(w.block_tables_list[0])[pos // bs]
    k = w.k_cache[blocks.to(w.k_cache.device), pos % bs].repeat_interleave(h // kvh, 1).float()
    v = w.v_cache[blocks.to(w.k_cache.device), pos % bs].repeat_interleave(h // kvh, 1).float()
    ctx = n - qlens[0]
    out = torch.empty(qlens[0], h, w.q.shape[2])
    depths = [0] + node_depths(TREE)
    for row in range(qlens[0]):
        keys = list(range(ctx)) + [ctx] + ([ctx + 1 + a for a in path_to(TREE, row - 1)] if row else [])
        if window is not None:
            keys = [kk for kk in keys if (kk if kk < ctx else ctx + depths[kk - ctx]) > ctx + depths[row] - window]
        s = torch.einsum("hd,khd->hk", w.q[row].float().cpu(), k[keys].cpu()) * scale
        out[row] = torch.einsum("hk,khd->hd", s.softmax(-1), v[keys].cpu())
    return out


@pytest.mark.parametrize("window", [None, 30, 5])
def test_tree_reference_is_the_per_path_loop(window):
    w, meta, qlens, lens = tree_workload()
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                                window=window, tree_mask=meta.tree_mask, tree_depth=meta.tree_depth)
    torch.testing.assert_close(ref[: qlens[0]].cpu().float(), tree_reference_by_path(w, qlens, lens, 0.3, window),
                               atol=1e-5, rtol=1e-5)
    causal = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                                   window=window)
    assert (ref[: qlens[0]] - causal[: qlens[0]]).abs().max() > 1e-2  # the mask changes the tree rows
    torch.testing.assert_close(ref[qlens[0]:], causal[qlens[0]:])  # and nothing else


@pytest.mark.parametrize("window", [None, 5])
def test_triton_prefill_with_tree_mask(window):
    w, meta, qlens, lens = tree_workload()
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                                window=window, tree_mask=meta.tree_mask, tree_depth=meta.tree_depth)
    out = prefill_attention(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                            window=window, tree_mask=meta.tree_mask, tree_depth=meta.tree_depth)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_torch_backend_with_tree_mask(window):
    w, meta, qlens, lens = tree_workload()
    ref = prefill_attention_ref(w.q, w.k_cache, w.v_cache, w.cu_seqlens_q, w.seq_lens, w.block_tables, 0.3,
                                window=window, tree_mask=meta.tree_mask, tree_depth=meta.tree_depth)
    # the backend stores this step's K/V itself: hand it the rows the workload already holds
    new = [r for s in range(3) for r in range(int(w.cu_seqlens_q[s]), int(w.cu_seqlens_q[s + 1]))]
    kvh, d = w.k_cache.shape[2], w.k_cache.shape[3]
    k_new = w.k_cache.view(-1, kvh, d)[meta.slot_mapping].clone()
    v_new = w.v_cache.view(-1, kvh, d)[meta.slot_mapping].clone()
    assert len(new) == k_new.shape[0]
    out = TorchAttentionBackend().forward(w.q, k_new, v_new, w.k_cache, w.v_cache, meta, 0.3, window=window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# ----- the model: one tree step == each path by itself -------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tree_step_logits_equal_each_path_alone(backend):
    model = tiny_model(seed=2, vocab=53, layers=2)
    bs = 4
    runner = ModelRunner(model, EngineConfig(block_size=bs, num_kv_blocks=32, attention_backend=backend))
    prompt = [5, 9, 2, 44, 17, 3, 8, 30, 12, 7, 21]
    nodes = [13, 40, 2, 6, 6, 19, 33, 1]  # node 3 and 4 share a token under different parents
    table = list(range(1, 1 + -(-(len(prompt) + len(nodes)) // bs)))
    n0 = len(prompt) - 1
    # the prompt but its last token (the root) is cached
    runner.execute(StepBatch(prompt[:n0], list(range(n0)), [n0], [n0], [table], [], [], [None]))
    depths = node_depths(TREE)
    step = StepBatch([prompt[-1]] + nodes, [n0] + [n0 + dd for dd in depths], [1 + len(nodes)],
                     [len(prompt) + len(nodes)], [table], list(range(1 + len(nodes))), [(0, 1 + len(nodes))],
                     [TREE])
    logits = runner.execute(step)
    torch.testing.assert_close(logits[0], forward_logits(model, prompt)[-1], atol=2e-4, rtol=1e-4)
    for j in range(len(TREE)):
        alone = forward_logits(model, prompt + [nodes[a] for a in path_to(TREE, j)])[-1]
        torch.testing.assert_close(logits[1 + j], alone, atol=2e-4, rtol=1e-4)
    # the same step without its tree (a chain over the same rows) disagrees on nodes off the first branch
    chain = runner.execute(StepBatch(step.token_ids, step.positions, step.query_lens, step.seq_lens, [table],
                                     step.logit_rows, step.chunk_logits, [None]))
    assert (chain[4] - logits[4]).abs().max() > 1e-3


def test_moved_kv_equals_decoding_the_path():
    """After the moves, the pool holds the accepted path's K/V where plain decoding would put them."""
    model = tiny_model(seed=2, vocab=53, layers=2)
    bs = 4
    prompt = [5, 9, 2, 44, 17, 3, 8]
    nodes = [13, 40, 2, 6, 6, 19, 33, 1]
    path = path_to(TREE, 7)  # root -> 0 -> 3 -> 7
    n0 = len(prompt) - 1
    table = list(range(1, 1 + -(-(len(prompt) + len(nodes)) // bs)))
    runners = [ModelRunner(model, EngineConfig(block_size=bs, num_kv_blocks=32)) for _ in range(2)]
    for r in runners:
        r.execute(StepBatch(prompt[:n0], list(range(n0)), [n0], [n0], [table], [], [], [None]))
    tree, plain = runners
    tree.execute(StepBatch([prompt[-1]] + nodes, [n0] + [n0 + d for d in node_depths(TREE)], [1 + len(nodes)],
                           [len(prompt) + len(nodes)], [table], [], [], [TREE]))
    tree.move_kv(path_kv_moves(table, bs, n0, path))
    toks = [prompt[-1]] + [nodes[a] for a in path]
    plain.execute(StepBatch(toks, list(range(n0, n0 + len(toks))), [len(toks)], [n0 + len(toks)], [table], [], [],
                            [None]))
    slots = [table[p // bs] * bs + p % bs for p in range(n0 + len(toks))]
    for a, b in zip(tree.pool.tensors(), plain.pool.tensors()):
        flat_a, flat_b = a.view(-1, a.shape[-2] * a.shape[-1]), b.view(-1, b.shape[-2] * b.shape[-1])
        torch.testing.assert_close(flat_a[slots], flat_b[slots], atol=1e-5, rtol=1e-5)


# ----- the walk -------------------------------------------------------------------------
def one_hot_rows(targets, vocab=10):
    rows = torch.full((len(targets), vocab), -5.0)
    for i, t in enumerate(targets):
        rows[i, t] = 5.0
    return rows


def test_greedy_walk_takes_the_matching_child_at_every_depth():
    tokens = [4, 5, 6, 7, 8, 1, 2, 3]  # node j's token
    # the target wants 5 after the root (node 1), then 1 (node 5, a leaf), then 9 (the bonus)
    rows = one_hot_rows([5, 0, 1, 0, 0, 0, 9, 0, 0])
    emitted, path = verify_tree(rows, tokens, TREE, SamplingParams(temperature=0))
    assert path == [1, 5] and emitted == [5, 1, 9]
    # no child matches: only the target's token
    emitted, path = verify_tree(one_hot_rows([3] * 9), tokens, TREE, SamplingParams(temperature=0))
    assert path == [] and emitted == [3]
    # node 0 -> node 3 (token 7) -> node 7 (token 3) -> bonus
    rows = one_hot_rows([4, 7, 0, 0, 3, 0, 0, 0, 2])
    assert verify_tree(rows, tokens, TREE, SamplingParams(temperature=0)) == ([4, 7, 3, 2], [0, 3, 7])


def test_sampled_walk_emits_from_p_at_the_first_position():
    """With several deterministic children at the root, the first emitted token is still drawn from p."""
    torch.manual_seed(0)
    vocab = 6
    logits = torch.randn(1 + len(TREE), vocab)
    tokens = [2, 0, 4, 1, 3, 5, 2, 0]
    p = logits[0].softmax(-1)
    g = torch.Generator().manual_seed(1)
    n = 20000
    counts = torch.zeros(vocab)
    for _ in range(n):
        emitted, _ = verify_tree(logits, tokens, TREE, SamplingParams(temperature=1.0), g)
        counts[emitted[0]] += 1
    assert (counts / n - p).abs().max() < 0.015
