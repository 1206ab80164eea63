"""Load a Hugging Face model folder: config.json, safetensors (single or sharded), tokenizer, generation config."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from transformers import AutoTokenizer

from minillm.config import ModelConfig
from minillm.loader.base import (
    SUPPORTED_MODEL_TYPES,
    LoadedModel,
    ModelLoadError,
    check_runnable,
    empty_model,
    eos_union,
    fill_model,
)

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(str(path), f"cannot read JSON ({e})") from e


def _weight_files(folder: Path) -> tuple[list[Path], set[str]]:
    """The safetensors files to read, in order, and the tensor names they hold (from headers only)."""
    if (folder / INDEX).is_file():
        weight_map = _read_json(folder / INDEX).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(str(folder / INDEX), "has no 'weight_map'")
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.is_file():
                raise ModelLoadError(str(folder / INDEX), f"names shard {f.name}, which is missing")
        return files, set(weight_map)
    if (folder / SINGLE).is_file():
        try:
            with safe_open(folder / SINGLE, framework="pt") as fh:
                return [folder / SINGLE], set(fh.keys())
        except Exception as e:  # safetensors raises its own error type for corrupt headers
            raise ModelLoadError(str(folder / SINGLE), f"not a readable safetensors file ({e})") from e
    raise ModelLoadError(str(folder), f"no {SINGLE} or {INDEX} (only safetensors weights are supported)")


def _stream(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """One tensor at a time from memory-mapped files, so a model never sits in memory twice."""
    for f in files:
        try:
            with safe_open(f, framework="pt") as fh:
                for name in fh.keys():
                    yield name, fh.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(str(f), f"not a readable safetensors file ({e})") from e


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict, after checking it describes a family we implement."""
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(str(folder), "no config.json: not a Hugging Face model folder")
    d = _read_json(path)
    model_type = d.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            str(path), f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    return d


def config_from_dict(d: dict[str, Any], tensor_names: set[str], path: str) -> ModelConfig:
    d = dict(d)
    # A checkpoint without lm_head can only mean tied embeddings, whatever the (possibly
    # defaulted-away) config says.
    if "lm_head.weight" not in tensor_names:
        d["tie_word_embeddings"] = True
    # Sliding-window attention is not implemented: cap the context at the window, where
    # full attention and windowed attention still agree exactly.
    window = d.get("sliding_window")
    if window and d.get("use_sliding_window", d["model_type"] in ("mistral", "mixtral")):
        d["max_position_embeddings"] = min(d.get("max_position_embeddings", window), window)
    try:
        cfg = ModelConfig.from_hf_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(path, f"incomplete or inconsistent config ({e!r})") from e
    check_runnable(cfg, path)
    return cfg


def load_tokenizer(folder: Path):
    # Required up front: without it transformers 5 builds some families' tokenizer
    # classes (Qwen2) with an empty vocabulary instead of failing.
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(str(folder), "no tokenizer.json (a fast tokenizer file is required)")
    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise ModelLoadError(str(folder), f"cannot load the tokenizer ({e})") from e
    if not tok.is_fast:
        raise ModelLoadError(str(folder), "needs a fast tokenizer (tokenizer.json)")
    return tok


def load_hf_folder(folder: Path, dtype: torch.dtype, device: str | torch.device) -> LoadedModel:
    d = read_config(folder)
    files, names = _weight_files(folder)
    cfg = config_from_dict(d, names, str(folder / "config.json"))
    model = fill_model(empty_model(cfg, dtype, device), _stream(files), str(folder))
    tokenizer = load_tokenizer(folder)
    gen_path = folder / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.is_file() else {}
    eos = eos_union(cfg.eos_token_id, gen.get("eos_token_id"), tokenizer.eos_token_id)
    return LoadedModel(cfg, model, tokenizer, eos, gen, str(folder))
