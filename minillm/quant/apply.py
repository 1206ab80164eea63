"""quantize_model: swap a Llama-family model's linear layers for QuantLinear.

Quantized: every decoder layer's qkv_proj, o_proj, gate_up_proj, down_proj
(~80% of the default model's parameters and all of its per-layer matmuls).
Kept in the model dtype: the embedding and the LM head (the default model
ties them: one 49152 x 576 table that is both a gather and the last matmul,
and the logits are the most quantization-sensitive matmul), the norms.
"""
from __future__ import annotations

import torch
from torch import nn

from minillm import envs
from minillm.models.llama import LlamaForCausalLM
from minillm.quant.awq import search_scale
from minillm.quant.gptq import CALIB_LEN as GPTQ_CALIB_LEN, CALIB_WINDOWS as GPTQ_CALIB_WINDOWS
from minillm.quant.int4 import check_group_size
from minillm.quant.linear import QuantLinear
from minillm.quant.methods import GROUPED, check_llm_options, check_method
from minillm.quant.targets import divide_norm, replace_module, target_linears

DEFAULT_GROUP_SIZE = 32
# methods that calibrate: (windows, tokens per window) of the "calib" split of pydoc_data.topics
# (w8a8: SmoothQuant's per-channel activation maxima)
CALIBRATION = {"int4-awq": (4, 64), "gptq": (GPTQ_CALIB_WINDOWS, GPTQ_CALIB_LEN), "w8a8": (16, 128)}
CPU_ROUTED = ("int8", "int4", "awq", "gptq")  # QuantLinear methods: bf16 kernels or GGUF blocks by CPU (cpu_route.py)


def quantize_loaded(loaded, method: str | None, group_size: int | None = None, lm_head: bool = False,
                    calib_windows: int | None = None, calib_len: int | None = None,
                    calibration: str = "prose") -> dict[str, str]:
    """Quantize a LoadedModel in place for LLM(quantization=method, quantize_lm_head=lm_head).

    Returns {layer: what was done}. The calibrating methods read `calib_windows` x `calib_len`
    tokens (default: CALIBRATION[method]) of the calibration split of the `calibration` domain's
    text (minillm.eval.text: "prose", pydoc_data.topics, or "code", the standard library's
    modules; never the split `minillm eval ppl` scores).
    """
    check_llm_options(method, group_size, calibration)
    report: dict[str, str] = {}
    if method == "gguf":
        if not str(loaded.source).lower().endswith(".gguf"):
            raise ValueError(f"quantization='gguf' needs a .gguf model, got {loaded.source!r}")
        report = keep_gguf(loaded.model, loaded.source)
    elif method is not None:
        if method in CALIBRATION:
            from minillm.eval import corpus_tokens, windows

            n, length = CALIBRATION[method]
            length = calib_len or length
            if calib_windows:
                n = calib_windows
            elif method == "gptq":
                from minillm.quant.gptq import calibration_windows

                n = calibration_windows(loaded.model, length)  # wide linears need more tokens than columns
            ids = corpus_tokens(loaded.tokenizer, "calib", n * length, domain=calibration)
            report["calibration"] = f"{n} x {length} tokens of the {calibration} text's calib split"
            calib_ids = windows(ids, length, n)
        else:
            calib_ids = None
        quantize_model(loaded.model, method, group_size, calib_ids)
        report |= {name: repr(m) for name, m in target_linears(loaded.model).items()}
        if method in CPU_ROUTED and loaded.model.embed_tokens.weight.device.type == "cpu":
            from minillm.quant.cpu_route import quant_cpu_route

            route, why = quant_cpu_route()
            report["kernels"] = f"{route}: {why}"
        if method == "w8a8" and loaded.model.embed_tokens.weight.device.type == "cpu":
            from minillm.quant.w8a8 import int8_gemm_kernel

            report["kernels"] = f"int8 GEMM: {int8_gemm_kernel()} (int_mm where the CPU has int8 dot products)"
    if lm_head:
        if method == "gguf" and report.get("lm_head", "").endswith("blocks"):
            report["lm_head"] += " (already the file's own blocks: quantize_lm_head has nothing to do)"
        else:
            report["lm_head"] = repr(quantize_lm_head(loaded.model))
    return report


def keep_gguf(model: LlamaForCausalLM, path) -> dict[str, str]:
    """quantization="gguf": compute on the file's own blocks where this CPU can build the kernels.

    On CPU with a working compiler: every linear and the LM head become GGUFLinear
    (minillm.quant.gguf_linear; all six block types the files use). Otherwise (a GPU,
    no compiler): the 4-bit types map onto our int4 groups (minillm.quant.gguf) and the
    rest stays float; report["kernels"] says which and why. MINILLM_GGUF_KERNELS=int4
    chooses the int4 mapping on CPU too.
    """
    from minillm.cpu.kernels.gguf_cpu import available
    from minillm.quant.gguf import keep_gguf_quantized

    if envs.gguf_int4():  # compare with, or test, the portable mapping
        why = f"{envs.MINILLM_GGUF_KERNELS}=int4"
    elif model.embed_tokens.weight.device.type == "cpu":
        ok, why = available()
        if ok:
            from minillm.quant.gguf_linear import keep_gguf_blocks

            return keep_gguf_blocks(model, path)
    else:
        why = "not a CPU model"
    report = keep_gguf_quantized(model, path)
    report["kernels"] = f"int4 mapping (the GGUF block kernels are unavailable: {why})"
    return report


def resolve_group_size(model: LlamaForCausalLM, group_size: int | None) -> int:
    """None: DEFAULT_GROUP_SIZE (32), checked against every quantized layer's input size.

    Why 32 and not the larger groups: a bf16 scale + zero per 32 weights (the CPU kernel's
    layout) costs 1 bit per weight, 0.75 more than group 128, but measured far better perplexity (SmolLM2-135M: int4 RTN
    g32 -0.1%, g64 +33%; its GGUF weights are themselves Q4_1 with groups of 32, and g32
    min/max rounding lands back on that grid). 128 does not divide the default model's 576.
    """
    group_size = DEFAULT_GROUP_SIZE if group_size is None else group_size
    for name, m in target_linears(model).items():
        check_group_size(m.in_features, group_size, name)
    return group_size


@torch.no_grad()
def quantize_model(
    model: LlamaForCausalLM,
    method: str,
    group_size: int | None = None,
    calibration: torch.Tensor | None = None,
    awq_grid: int = 11,
    awq_max_rows: int = 256,
    use_cpu_kernels: bool = True,
    smooth_alpha: float = 0.5,
) -> LlamaForCausalLM:
    """Quantize in place and return the model.

    method: "int8" (per output channel), "int4" (groups, round-to-nearest),
    "int4-awq" (groups, activation-aware scales searched on ``calibration``,
    token windows [n, len]), "gptq" (groups, error-compensated on ``calibration``:
    minillm.quant.gptq), "w8a8" (SmoothQuant with ``smooth_alpha``, int8 x int8
    GEMMs: minillm.quant.smoothquant) or "fp8" (e4m3 per output channel:
    minillm.quant.fp8). group_size: the int4 methods only; None =
    DEFAULT_GROUP_SIZE (32). use_cpu_kernels: on CPU, lay weights
    out for torch's int8/int4 matmul kernels (else the dequantize reference path).
    """
    from minillm.quant.footprint import PACKED

    check_method(method)
    if any(isinstance(m, PACKED) for m in model.modules()):
        raise ValueError("this model is already quantized")
    bits = 8 if method == "int8" else 4
    g = resolve_group_size(model, group_size) if method in GROUPED else None
    if method not in GROUPED and group_size is not None:
        raise ValueError(f"group_size applies to int4 methods only, not {method!r}")
    if method == "gptq":
        if calibration is None:
            raise ValueError("gptq needs calibration token windows (minillm.eval.corpus_tokens(tok, 'calib'))")
        from minillm.quant.gptq import gptq_quantize_model

        gptq_quantize_model(model, calibration, g, use_cpu_kernels=use_cpu_kernels)
        return model
    if method == "w8a8":
        if calibration is None:
            raise ValueError("w8a8 needs calibration token windows (minillm.eval.corpus_tokens(tok, 'calib'))")
        from minillm.quant.smoothquant import smoothquant_model

        smoothquant_model(model, calibration, smooth_alpha)
        return model
    if method == "fp8":
        from minillm.quant.fp8 import fp8_quantize_model

        fp8_quantize_model(model)
        return model
    inputs: dict[str, torch.Tensor] = {}
    if method == "int4-awq":
        if calibration is None:
            raise ValueError("int4-awq needs calibration token windows (minillm.eval.corpus_tokens(tok, 'calib'))")
        inputs = capture_inputs(model, calibration, awq_max_rows)
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        # the norm right before the MLP: Gemma 3's pre_feedforward_layernorm (its post_attention one
        # norms the attention output), else post_attention_layernorm
        mlp_norm = getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm
        plan = [  # (name, module, where 1/s goes) -- down_proj before gate_up_proj: its 1/s lands in `up` rows
            (f"layers.{i}.mlp.down_proj", mlp.down_proj, "up_rows"),
            (f"layers.{i}.mlp.gate_up_proj", mlp.gate_up_proj, mlp_norm),
            (f"layers.{i}.self_attn.qkv_proj", attn.qkv_proj, layer.input_layernorm),
            (f"layers.{i}.self_attn.o_proj", attn.o_proj, "runtime"),
        ]
        for name, lin, fold in plan:
            w = lin.weight.detach().float().contiguous()  # row-major: the runner may have made it K-major
            bias = lin.bias.detach() if lin.bias is not None else None
            input_scale = None
            if method == "int4-awq":
                s = search_scale(w, inputs.pop(name), g, awq_grid).scale
                w = w * s
                if fold == "up_rows":
                    half = mlp.gate_up_proj.weight.shape[0] // 2
                    mlp.gate_up_proj.weight[half:] /= s[:, None].to(mlp.gate_up_proj.weight.dtype)
                elif fold == "runtime":
                    input_scale = 1.0 / s
                else:
                    divide_norm(fold, s)
            q = QuantLinear.from_float(w, bits, g, bias=bias, input_scale=input_scale).to(w.device)
            if use_cpu_kernels and w.device.type == "cpu":
                q.use_cpu_kernels()
            replace_module(model, name, q)
    return model


@torch.no_grad()
def capture_inputs(model: LlamaForCausalLM, calibration: torch.Tensor, max_rows: int) -> dict[str, torch.Tensor]:
    """Inputs of every target linear on the calibration windows (float model), at most max_rows rows each."""
    from minillm.eval.paged import score_windows

    rows: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, mod in target_linears(model).items():
        def hook(_m, args, name=name):
            rows.setdefault(name, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu())
        hooks.append(mod.register_forward_pre_hook(hook))
    try:
        score_windows(model, calibration)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for name, parts in rows.items():
        x = torch.cat(parts)
        if x.shape[0] > max_rows:  # an even spread of positions, deterministic
            x = x[torch.linspace(0, x.shape[0] - 1, max_rows).long()]
        out[name] = x.to(model.embed_tokens.weight.device)
    return out


@torch.no_grad()
def quantize_lm_head(model: LlamaForCausalLM, use_cpu_kernels: bool = True) -> QuantLinear:
    """The LM head as int8 per row (the embedding stays float: a gather reads one row per token).

    With tied embeddings the float table stays for the gather, so memory grows by the int8 copy
    (+25% of the table), but a decode step reads 1 byte per head weight instead of 4.
    """
    if isinstance(model.lm_head, QuantLinear):
        raise ValueError("the LM head is already quantized")
    w = model.lm_head.weight.detach().float().contiguous()
    q = QuantLinear.from_float(w, 8).to(w.device)
    if use_cpu_kernels and w.device.type == "cpu":
        q.use_cpu_kernels()
    model.lm_head = q
    return q


def quantized_layers(model: nn.Module) -> list[QuantLinear]:
    return [m for m in model.modules() if isinstance(m, QuantLinear)]
