"""load_model("org/name"): Hugging Face Hub repo ids through huggingface_hub's cache, offline.

The tests lay out a Hub cache themselves (models--org--name/{blobs,snapshots/<commit>,refs/main},
snapshot files as symlinks to content-addressed blobs, as huggingface_hub writes it) under a tmp
HF_HUB_CACHE, with HF_HUB_OFFLINE=1: nothing here touches the network.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import AutoTokenizer

from minillm.loader import ModelLoadError, load_model
from minillm.loader import hub
from minillm.models.standalone import forward_logits
from tests.helpers.tiny_gguf import write_tiny_gguf
from tests.helpers.tiny_models import make_tiny_hf_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
IDS = list(range(3, 40))


def put_in_hub_cache(cache: Path, repo_id: str, files: Path | list[Path], commit: str = COMMIT) -> Path:
    """Copy a folder's files (or the listed files) into a Hub-layout cache; returns the snapshot folder."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    if isinstance(files, Path):
        pairs = [(f, f.relative_to(files)) for f in sorted(files.rglob("*")) if f.is_file()]
    else:
        pairs = [(f, Path(f.name)) for f in files]
    for src, rel in pairs:
        data = src.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder, _ = make_tiny_hf_model(tmp_path_factory.mktemp("tiny"), "llama")
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline mode on, and a working directory where "org/..." is no path."""
    cache = tmp_path / "hf_home" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # huggingface_hub read the env at import
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)

    real = huggingface_hub.snapshot_download

    def no_downloads(*args, **kwargs):
        assert kwargs.get("local_files_only"), "a download was attempted in offline mode"
        return real(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_downloads)
    return cache


def _logits(loaded) -> torch.Tensor:
    return forward_logits(loaded.model, IDS)


def test_looks_like_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for s in ["org/name", "HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B", "org/name:model-Q8_0.gguf",
              "org/name:sub/dir/m.gguf"]:
        assert hub.looks_like_repo_id(s), s
    for s in ["name", "a/b/c", "./org/name", "../org/name", "/org/name", "~/org/name", "org/", "/name",
              "org/na me", "org/name:file.bin", "org/..name", "C:/models/x", "model.gguf", "org/-name", "org/name.",
              "org/a--b", "org/a..b"]:
        assert not hub.looks_like_repo_id(s), s
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not hub.looks_like_repo_id("org/name")  # an existing local path is a path


def test_repo_id_loads_from_the_cache_like_the_folder(tiny, cache):
    snapshot = put_in_hub_cache(cache, "org/tiny", tiny)
    assert (snapshot / "model.safetensors").is_symlink()
    loaded = load_model("org/tiny")
    assert Path(loaded.source) == snapshot.resolve() or Path(loaded.source) == snapshot
    direct = load_model(str(tiny))
    assert loaded.config == direct.config and loaded.eos_token_ids == direct.eos_token_ids
    assert loaded.generation_config == direct.generation_config
    assert loaded.tokenizer.encode("hello world") == direct.tokenizer.encode("hello world")
    assert torch.equal(_logits(loaded), _logits(direct))


def test_cache_dir_is_read_when_called(tiny, cache, monkeypatch):
    """HF_HOME/hub is used when HF_HUB_CACHE is unset, whatever huggingface_hub saw at import."""
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache.parent / "elsewhere"))
    put_in_hub_cache(cache, "org/tiny", tiny)
    assert hub.resolve_hub_model("org/tiny") == cache.resolve() / "models--org--tiny" / "snapshots" / COMMIT


def test_offline_and_not_cached_is_a_clear_error(cache):
    with pytest.raises(FileNotFoundError) as err:
        load_model("org/not-downloaded")
    msg = str(err.value)
    assert "org/not-downloaded" in msg and str(cache) in msg
    assert "HF_HUB_OFFLINE" in msg and "download" in msg


def test_env_offline_is_respected_even_if_hub_was_imported_online(cache, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    assert hub.hub_offline()
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        load_model("org/not-downloaded")


def test_an_existing_local_folder_wins(tiny, cache, tmp_path):
    """"org/tiny" names a folder under the working directory: that folder loads, not the cached repo."""
    other, _ = make_tiny_hf_model(tmp_path / "other", "llama", seed=1)
    put_in_hub_cache(cache, "org/tiny", tiny)
    shutil.copytree(other, Path.cwd() / "org" / "tiny")
    loaded = load_model("org/tiny")
    assert Path(loaded.source) == (Path.cwd() / "org" / "tiny").resolve()
    assert torch.equal(_logits(loaded), _logits(load_model(str(other))))
    assert not torch.equal(_logits(loaded), _logits(load_model(str(tiny))))


def test_online_cache_miss_downloads_only_what_the_loader_reads(tiny, cache, monkeypatch):
    """Not offline and not cached: snapshot_download(local_files_only=False) with the loader's files.
    (The download itself is faked: the fake puts the folder into the cache.)"""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    calls = []

    def fake(repo_id, *, revision=None, cache_dir=None, allow_patterns=None, local_files_only=False, **kw):
        calls.append((repo_id, revision, cache_dir, allow_patterns, local_files_only))
        if local_files_only:
            raise huggingface_hub.utils.LocalEntryNotFoundError("not cached")
        return str(put_in_hub_cache(Path(cache_dir), repo_id, tiny))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    loaded = load_model("org/tiny")
    assert [c[-1] for c in calls] == [True, False]
    assert all(c[0] == "org/tiny" and Path(c[2]) == cache for c in calls)
    patterns = calls[1][3]
    for needed in ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                   "tokenizer.json", "tokenizer_config.json"]:
        assert needed in patterns
    assert "*" not in patterns and "*.bin" not in patterns
    assert torch.equal(_logits(loaded), _logits(load_model(str(tiny))))


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf")
    folder, hf_model = make_tiny_hf_model(tmp, "mistral")
    return write_tiny_gguf(tmp / "tiny-f32.gguf", hf_model, AutoTokenizer.from_pretrained(folder), "F32")


def test_gguf_repo_single_file_and_named_file(tiny_gguf, cache):
    put_in_hub_cache(cache, "org/tiny-GGUF", [tiny_gguf])
    direct = _logits(load_model(str(tiny_gguf)))
    for name in ["org/tiny-GGUF", "org/tiny-GGUF:tiny-f32.gguf"]:
        loaded = load_model(name)
        assert loaded.source.endswith("tiny-f32.gguf"), loaded.source
        assert torch.equal(_logits(loaded), direct)


def test_gguf_repo_with_several_files_needs_a_name(tiny_gguf, cache, tmp_path):
    second = tmp_path / "tiny-copy.gguf"
    shutil.copy(tiny_gguf, second)
    second.write_bytes(second.read_bytes() + b"\0" * 32)  # another blob
    put_in_hub_cache(cache, "org/tiny-GGUF", [tiny_gguf, second])
    with pytest.raises(ModelLoadError, match="tiny-copy.gguf.*tiny-f32.gguf.*org/tiny-GGUF:FILE.gguf"):
        load_model("org/tiny-GGUF")
    assert load_model("org/tiny-GGUF:tiny-f32.gguf").source.endswith("tiny-f32.gguf")
    with pytest.raises(FileNotFoundError, match="no-such.gguf"):
        load_model("org/tiny-GGUF:no-such.gguf")
