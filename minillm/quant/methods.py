"""The quantization methods by name, and the check of the LLM options that choose one.

Below every quantizer: EngineConfig.validate and SpeculativeConfig run check_llm_options before
any model loads, without importing the methods themselves (minillm.quant.apply runs them).
"""
from __future__ import annotations

METHODS = ("int8", "int4", "int4-awq", "gptq", "w8a8", "fp8")
GROUPED = ("int4", "int4-awq", "gptq")  # the int4-group methods: quantization_group_size applies
LLM_METHODS = METHODS + ("gguf",)  # "gguf": keep the file's Q4_0/Q4_1/Q4_K codes (minillm.quant.gguf)


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unsupported quantization {method!r}; choose one of {METHODS} (or None)")


def check_llm_options(method: str | None, group_size: int | None, calibration: str = "prose") -> None:
    """LLM(quantization=..., quantization_group_size=..., quantization_calibration=...) checks that need
    no model (run before the load)."""
    from minillm.eval.text import DOMAINS
    from minillm.quant.int4 import SUPPORTED_GROUP_SIZES

    if calibration not in DOMAINS:
        raise ValueError(f"quantization_calibration must be one of {DOMAINS}, got {calibration!r}")
    if method is None:
        if group_size is not None:
            raise ValueError("quantization_group_size given without quantization")
        return
    if method not in LLM_METHODS:
        raise ValueError(f"unsupported quantization {method!r}; choose one of {LLM_METHODS} (or None)")
    if group_size is not None and method not in GROUPED:
        raise ValueError(f"quantization_group_size applies to {', '.join(GROUPED)} only, not {method!r}")
    if group_size is not None and group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {SUPPORTED_GROUP_SIZES}, got {group_size}")
