"""load_config: a model's shape from its metadata alone equals the config the full load builds."""
from __future__ import annotations

import dataclasses

from minillm.loader import load_config, load_model
from tests.helpers.tiny_models import make_tiny_hf_model


def test_folder_config_matches_the_loaded_model(tmp_path):
    folder, _ = make_tiny_hf_model(tmp_path, "llama", num_attention_heads=8, num_key_value_heads=2)
    assert dataclasses.asdict(load_config(folder)) == dataclasses.asdict(load_model(folder).config)


def test_default_gguf_config_matches_the_loaded_model():
    cfg = load_config()  # the default model's GGUF header only
    loaded = load_model().config
    assert dataclasses.asdict(cfg) == dataclasses.asdict(loaded)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
