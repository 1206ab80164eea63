"""Weight-only quantization: int8 per output channel, int4 in groups (RTN, AWQ or GPTQ), packed storage.

    from minillm.quant import quantize_model
    quantize_model(model, "int4-awq", group_size=64, calibration=windows)
"""
from minillm.quant.apply import METHODS, TARGETS, quantize_model, quantized_layers, resolve_group_size
from minillm.quant.int4 import Int4Weight, dequantize_int4, pack_int4, quantize_int4, unpack_int4
from minillm.quant.int8 import Int8Weight, dequantize_int8, quantize_int8
from minillm.quant.linear import QuantLinear

__all__ = [
    "METHODS", "TARGETS", "quantize_model", "quantized_layers", "resolve_group_size",
    "Int4Weight", "dequantize_int4", "pack_int4", "quantize_int4", "unpack_int4",
    "Int8Weight", "dequantize_int8", "quantize_int8", "QuantLinear",
]
