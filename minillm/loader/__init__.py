"""Model loading: a Hugging Face folder or a GGUF file -> LoadedModel (model, tokenizer, config).

    load_model()                      the default model (SmolLM2-135M-Instruct GGUF)
    load_model("path/to/folder")      config.json + safetensors + tokenizer.json
    load_model("path/to/model.gguf")  llama.cpp's format, dequantized
    load_model("org/name")            a Hugging Face Hub repo (cache first; HF_HUB_OFFLINE=1 respected)
    load_model("qwen2.5-coder-0.5b")  a name from `minillm models` (minillm/loader/registry.py)
    load_config(...)                  the same names, only the model's shape (no weights read)
"""
from __future__ import annotations

from pathlib import Path

import torch

from minillm.loader.base import SUPPORTED_MODEL_TYPES, LoadedModel, ModelLoadError
from minillm.loader.default import default_model_path

__all__ = ["LoadedModel", "ModelLoadError", "SUPPORTED_MODEL_TYPES", "default_model_path", "load_config",
           "load_model", "resolve_model_path"]


def resolve_model_path(path: str | Path | None = None) -> Path:
    """Where the model named `path` lives: a folder, a GGUF file, a Hub repo id or a registered name."""
    p = Path(path if path is not None else default_model_path()).expanduser().resolve()
    if p.exists() or path is None:
        return p
    from minillm.loader import hub, registry

    if hub.looks_like_repo_id(str(path)):
        p = hub.resolve_hub_model(str(path))  # "org/name": the Hub cache, or a download (minillm/loader/hub.py)
    if not p.exists() and registry.is_registered(path):  # short names from `minillm models` (loader/registry.py)
        p = registry.resolve_registered(str(path))  # the GGUF assembled from its PyPI chunk wheels, verified
    if not p.exists():
        raise FileNotFoundError(f"no model at {p}")
    return p


def load_config(path: str | Path | None = None):
    """The ModelConfig of a model (layers, heads, KV heads, windows, ...) from its metadata alone:
    config.json, or a GGUF file's header (its tensors are mapped, not read)."""
    import json

    from minillm.config import ModelConfig

    p = resolve_model_path(path)
    if p.is_dir():
        return ModelConfig.from_hf_dict(json.loads((p / "config.json").read_text()))
    if p.suffix.lower() != ".gguf":
        raise ModelLoadError(str(p), "expected a Hugging Face model folder or a .gguf file")
    from minillm.loader.gguf import open_gguf

    return open_gguf(p)[2]


def load_model(
    path: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    fast_path: str = "auto",
) -> LoadedModel:
    """Load a model for inference: eval mode, weights in dtype on device.

    Raises FileNotFoundError if path does not exist and ModelLoadError (a
    ValueError naming the file and the problem) if it cannot be used.
    """
    p = resolve_model_path(path)
    if p.is_dir():
        from minillm.loader.hf import load_hf_folder

        return load_hf_folder(p, dtype, device)
    if p.suffix.lower() == ".gguf":
        from minillm.loader.gguf import load_gguf

        return load_gguf(p, dtype, device, fast_path)  # a big file: the fast path may dequantize it
    raise ModelLoadError(str(p), "expected a Hugging Face model folder or a .gguf file")
