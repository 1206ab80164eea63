"""Weight-only quantization: int8 per output channel, int4 in groups (RTN, AWQ or GPTQ), packed storage.

    from minillm.quant import quantize_model
    quantize_model(model, "int4-awq", group_size=64, calibration=windows)
"""
import importlib

# each name from the module that defines it, imported on first use: an engine that quantizes nothing
# (or imports only quant.linear) does not load every method and its calibration code
_HOMES = {"METHODS": "methods", "TARGETS": "targets", "quantize_model": "apply", "quantized_layers": "apply",
          "resolve_group_size": "apply", "Int4Weight": "int4", "dequantize_int4": "int4", "pack_int4": "int4",
          "quantize_int4": "int4", "unpack_int4": "int4", "Int8Weight": "int8", "dequantize_int8": "int8",
          "quantize_int8": "int8", "QuantLinear": "linear"}

__all__ = [
    "METHODS", "TARGETS", "quantize_model", "quantized_layers", "resolve_group_size",
    "Int4Weight", "dequantize_int4", "pack_int4", "quantize_int4", "unpack_int4",
    "Int8Weight", "dequantize_int8", "quantize_int8", "QuantLinear",
]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'minillm.quant' has no attribute {name!r}")
    return getattr(importlib.import_module(f"minillm.quant.{_HOMES[name]}"), name)
