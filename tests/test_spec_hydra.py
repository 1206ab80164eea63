"""Hydra heads: Medusa heads that also read the tokens guessed before them (spec_decode/hydra*.py).

Tiny random models (fast): greedy with Hydra guesses (chain and tree) equals plain greedy, with
preemption; each guess is the one the heads give when run by hand on the kept hidden state and the
newest token; a tree's children depend on their parent; the file says its kind, and the wrong kind
is a clear error. Training on the default model is in test_spec_medusa.py; the shipped heads on the
default model in test_spec_greedy.py.
"""
from __future__ import annotations

import pytest
import torch

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.spec_decode.hydra_heads import HydraHeads, load_heads
from minillm.spec_decode.medusa_heads import MedusaHeads
from tests.helpers.engine_utils import tiny_model
from tests.test_spec_medusa import VOCAB, generate, random_heads


def random_hydra(model, k=3, layers=1) -> HydraHeads:
    return random_heads(model, k, kind=HydraHeads, layers=layers)


@pytest.mark.parametrize("num_blocks", [256, 14])
@pytest.mark.parametrize("spec", [{"num_tokens": 3}, {"num_tokens": 1}, {"tree": [2, 2, 1]}])
def test_greedy_with_hydra_guesses_equals_greedy(num_blocks, spec):
    ref, _ = generate(None)
    model = tiny_model(seed=1, vocab=VOCAB)
    for heads in (HydraHeads(model.config.hidden_size, 3), random_hydra(model)):  # untrained, random
        out, e = generate({"method": "hydra", "heads": heads, **spec}, num_blocks)
        assert out == ref
        recs = [r for s in e.trace for r in s.spec]
        assert sum(r.num_proposed for r in recs) > 0
        assert e.executor.logit_extras is None  # the heads need the chosen token: no shared LM-head pass
        assert not e.proposer.hidden  # nothing kept for finished sequences
        if num_blocks < 256:
            assert any(s.preemptions for s in e.trace)


@pytest.mark.parametrize("layers", [1, 2])
def test_each_guess_is_the_heads_run_by_hand_on_the_newest_token(layers):
    """The proposer's chain equals running head 1 on (kept hidden state, newest token), taking the LM head's
    argmax, then head 2 on (that state, that guess), ...; a Hydra tree's children depend on their parent.
    With two layers per head, the second is part of every guess."""
    model = tiny_model(seed=1, vocab=VOCAB)
    heads = random_hydra(model, layers=layers)
    seen = []

    def record(e):
        propose = e.proposer.propose_tokens

        def wrapped(wants):
            out = propose(wants)
            for (seq, _), prop in zip(wants, out):
                if prop.token_ids:
                    seen.append((e.proposer.hidden[seq.seq_id][1].clone(), seq.token_ids[-1], prop))
            return out
        e.proposer.propose_tokens = wrapped

    generate({"method": "hydra", "heads": heads, "tree": [2, 2]}, tweak=record)
    assert seen
    m = tiny_model(seed=1, vocab=VOCAB)
    differ = 0
    with torch.no_grad():
        for h, newest, prop in seen:
            z1 = heads.step(0, h[None], m.embed_tokens(torch.tensor([newest])))
            top1 = m.compute_logits(z1).topk(2, dim=-1).indices[0].tolist()
            n = len(prop.token_ids)  # a short budget takes a prefix of the tree
            assert prop.token_ids[:2] == top1[:n]  # paths (0,), (1,)
            if n < 6:
                continue
            under = []
            for parent in top1:  # paths (p, 0), (p, 1) under each depth-1 guess
                z2 = heads.step(1, z1, m.embed_tokens(torch.tensor([parent])))
                under.append(m.compute_logits(z2).topk(2, dim=-1).indices[0].tolist())
            assert prop.token_ids[2:6] == under[0] + under[1]
            differ += under[0] != under[1]
    assert differ > 0  # Medusa's heads would guess the same children under every parent


def test_heads_files_say_their_kind_and_the_wrong_kind_is_a_clear_error(tmp_path):
    model = tiny_model(seed=1, vocab=VOCAB)
    heads = random_hydra(model, 2)
    path = tmp_path / "h.safetensors"
    heads.save(path, base_model="tiny")
    back = load_heads(path, model.config.hidden_size)
    assert isinstance(back, HydraHeads) and back.metadata["kind"] == "hydra"
    h, e = torch.randn(5, model.config.hidden_size), torch.randn(2, 5, model.config.hidden_size)
    torch.testing.assert_close(back(h, e), heads(h, e), rtol=0, atol=0)
    medusa = MedusaHeads(model.config.hidden_size, 2)
    for spec, match in [({"method": "hydra", "heads": medusa, "num_tokens": 1}, "needs hydra heads, got medusa"),
                        ({"method": "medusa", "heads": heads, "num_tokens": 1}, "needs medusa heads, got hydra"),
                        ({"method": "hydra", "heads": heads, "num_tokens": 3}, "exceeds the 2 Hydra heads")]:
        with pytest.raises(ValueError, match=match):
            LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, speculative=spec))
    # a file whose metadata says hydra but whose tensors are Medusa's: caught at load, not at the first step
    medusa.save(tmp_path / "m.safetensors")
    from safetensors.torch import load_file, save_file

    save_file(load_file(str(tmp_path / "m.safetensors")), str(tmp_path / "lie.safetensors"),
              metadata={"num_heads": "2", "hidden_size": str(model.config.hidden_size), "kind": "hydra"})
    with pytest.raises(ValueError, match="do not fit hydra heads"):
        load_heads(tmp_path / "lie.safetensors")


@pytest.mark.parametrize("kind", [MedusaHeads, HydraHeads])
def test_deeper_heads_start_as_the_identity_and_keep_their_depth_in_the_file(kind, tmp_path):
    model = tiny_model(seed=1, vocab=VOCAB)
    hid = model.config.hidden_size
    h, emb = torch.randn(5, hid), torch.randn(2, 5, hid)
    args = (h, emb) if kind is HydraHeads else (h,)
    # the extra layers start at zero, the identity: a fresh two-layer head guesses what a fresh one-layer head does
    torch.testing.assert_close(kind(hid, 2, layers=2)(*args), kind(hid, 2)(*args), rtol=0, atol=0)
    # one-layer heads keep the tensor names of the files shipped before deeper heads existed
    assert not any(".extra." in name for name in kind(hid, 2).state_dict())
    deep = random_heads(model, 2, kind=kind, layers=3)
    shallow = kind(hid, 2)  # deep's first layers only
    shallow.load_state_dict({k: v for k, v in deep.state_dict().items() if ".extra." not in k})
    assert not torch.allclose(deep(*args), shallow(*args))  # the extra layers take part
    deep.save(tmp_path / "deep.safetensors")
    back = load_heads(tmp_path / "deep.safetensors", hid)
    assert type(back) is kind and back.layers == 3 and back.metadata["head_layers"] == "3"
    torch.testing.assert_close(back(*args), deep(*args), rtol=0, atol=0)
    with torch.no_grad():
        for name, p in back.named_parameters():
            if ".extra." in name:
                p.zero_()
    torch.testing.assert_close(back(*args), shallow(*args), rtol=0, atol=0)  # and nothing else changed
    with pytest.raises(ValueError, match="at least one layer"):
        kind(hid, 2, layers=0)
    ref, _ = generate(None)
    out, _ = generate({"method": kind.kind, "heads": deep, "num_tokens": 2})
    assert out == ref
