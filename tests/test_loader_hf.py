"""Hugging Face folder details: what the loader infers beyond config.json, and what it refuses."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minillm.loader import ModelLoadError, load_model
from tests.helpers.tiny_models import make_tiny_hf_model


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory):
    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "mistral")
    return folder


def _edit_json(path, **changes):
    d = json.loads(path.read_text())
    d.update(changes)
    path.write_text(json.dumps(d))


@pytest.fixture
def folder(tiny_mistral, tmp_path):
    return shutil.copytree(tiny_mistral, tmp_path / "model")


def test_no_lm_head_means_tied(folder):
    """A config can say untied (or leave it to a class default) while the file has no lm_head."""
    _edit_json(folder / "config.json", tie_word_embeddings=False)
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    loaded = load_model(str(folder))
    assert loaded.config.tie_word_embeddings
    assert loaded.model.lm_head.weight is loaded.model.embed_tokens.weight


def test_untied_lm_head_is_loaded(folder):
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, folder / "model.safetensors")
    _edit_json(folder / "config.json", tie_word_embeddings=False)
    loaded = load_model(str(folder))
    assert not loaded.config.tie_word_embeddings
    assert torch.equal(loaded.model.lm_head.weight, tensors["lm_head.weight"])


def test_sliding_window_caps_the_context(folder):
    """Windowed and full attention agree up to the window; past it we would be wrong, so stop there."""
    _edit_json(folder / "config.json", sliding_window=128, max_position_embeddings=256)
    assert load_model(str(folder)).config.max_position_embeddings == 128
    _edit_json(folder / "config.json", sliding_window=None)
    assert load_model(str(folder)).config.max_position_embeddings == 256


def test_eos_ids_are_the_union(folder):
    _edit_json(folder / "generation_config.json", eos_token_id=[7, 2])
    loaded = load_model(str(folder))
    assert loaded.eos_token_ids == [2, 7]  # config first, then generation_config, then tokenizer
    assert loaded.generation_config["eos_token_id"] == [7, 2]


def test_missing_generation_config_is_fine(folder):
    (folder / "generation_config.json").unlink()
    loaded = load_model(str(folder))
    assert loaded.generation_config == {} and loaded.eos_token_ids == [2]


def test_unsupported_rope_scaling(folder):
    _edit_json(folder / "config.json", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with pytest.raises(ModelLoadError, match="yarn") as err:
        load_model(str(folder))
    assert "config.json" in str(err.value)


@pytest.mark.parametrize("family", ["mistral", "qwen2"])  # transformers 5 gives Qwen2 an empty tokenizer
def test_missing_tokenizer(tmp_path, family):
    folder, _ = make_tiny_hf_model(tmp_path, family)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer.json") as err:
        load_model(str(folder))
    assert str(folder) in str(err.value)


def test_dtype_and_rope_tables(folder):
    loaded = load_model(str(folder), dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.model.rotary.cos.dtype == torch.float32
    assert not loaded.model.training and not any(p.requires_grad for p in loaded.model.parameters())
