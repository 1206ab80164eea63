"""SmoothQuant (Xiao et al. 2022): move activation outliers into the weights, then run W8A8.

LLM activations have a few input channels that are large in every token;
per-token int8 spends its whole range on them and rounds the rest to a few
levels. For y = x W^T any per-input-channel s > 0 gives the same product
(x / s)(W * s)^T, so dividing the loud channels by s and multiplying the
matching weight columns by s makes both operands easy to quantize. Per
channel j, on calibration activations:

    s_j = max|X_j|^alpha / max_n |W_nj|^(1 - alpha)       (alpha = 0.5 by default, configurable)

alpha = 0 leaves the activations alone, alpha = 1 flattens them completely
(all the difficulty moves to the weights). Where 1/s goes:

- qkv_proj: into input_layernorm's weight (the norm is per channel: free);
- gate_up_proj: into the norm before the MLP (post_attention_layernorm, or
  Gemma 3's pre_feedforward_layernorm);
- down_proj: into the `up` rows of gate_up_proj (its input is silu(gate) * up,
  per channel linear in up: free, as AWQ does here);
- o_proj: no per-channel op precedes it in a form that holds under GQA (the
  attention output's channels come from V, shared by several query heads), so
  1/s stays a runtime multiply, W8A8Linear.input_scale, applied in the same pass
  that finds each token's int8 scale.

The statistics are max|X_j| over the calibration tokens of the float model
(one pass, as the paper). Then every target linear becomes a W8A8Linear
(minillm.quant.w8a8); the embedding, the norms and the LM head stay float.
"""
from __future__ import annotations

import torch

from minillm.quant.targets import TARGETS, divide_norm, replace_module, target_linears

DEFAULT_ALPHA = 0.5  # calibration of quantization="w8a8": minillm.quant.apply.CALIBRATION


@torch.no_grad()
def activation_max(model, calibration: torch.Tensor) -> dict[str, torch.Tensor]:
    """max |x_j| per input channel of every target linear over the calibration windows (float model).

    One pass through the decoder layers (minillm.quant.layer_walk): no LM head, no logits."""
    from minillm.quant.layer_walk import LayerWalker

    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in target_linears(model).items():
        def hook(_m, args, name=name):
            m = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(0).float()
            amax[name] = m if name not in amax else torch.maximum(amax[name], m)
        hooks.append(mod.register_forward_pre_hook(hook))
    walker = LayerWalker(model, calibration)
    try:
        for layer in model.layers:
            walker.advance(layer)
    finally:
        walker.close()
        for h in hooks:
            h.remove()
    return amax


def smoothing_factors(x_max: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) for w [N, K]; channels never seen get s = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"SmoothQuant alpha must be in [0, 1], got {alpha}")
    w_max = w.abs().amax(0).float().clamp(min=1e-5)
    s = x_max.float().clamp(min=1e-5).pow(alpha) / w_max.pow(1.0 - alpha)
    return torch.where(x_max > 0, s, torch.ones_like(s)).clamp(min=1e-5)


@torch.no_grad()
def smooth_model(model, act_max: dict[str, torch.Tensor], alpha: float = DEFAULT_ALPHA) -> dict[str, torch.Tensor]:
    """Fold the smoothing into the model in place (still float: outputs unchanged up to rounding).

    Every target linear's weight is multiplied by its s; 1/s is folded as the module
    docstring says. Returns {name: s}; o_proj's x must be multiplied by 1/s at runtime
    (the caller: W8A8Linear.input_scale).
    """
    scales: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(model.layers):
        mlp = layer.mlp
        mlp_norm = getattr(layer, "pre_feedforward_layernorm", None) or layer.post_attention_layernorm
        # down_proj before gate_up_proj: its 1/s changes the `up` rows, whose max|W| gate_up's s then sees
        plan = [("mlp.down_proj", "up_rows"), ("mlp.gate_up_proj", mlp_norm),
                ("self_attn.qkv_proj", layer.input_layernorm), ("self_attn.o_proj", "runtime")]
        for target, fold in plan:
            name = f"layers.{i}.{target}"
            lin = layer.get_submodule(target)
            s = smoothing_factors(act_max[name].to(lin.weight.device), lin.weight, alpha)
            lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
            if fold == "up_rows":
                half = mlp.gate_up_proj.weight.shape[0] // 2
                mlp.gate_up_proj.weight[half:] /= s[:, None].to(mlp.gate_up_proj.weight.dtype)
            elif fold != "runtime":
                divide_norm(fold, s)
            scales[name] = s
    return scales


@torch.no_grad()
def smoothquant_model(model, calibration: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> dict[str, torch.Tensor]:
    """quantization="w8a8": smooth on `calibration` (token windows [n, len]), then W8A8 every target linear."""
    from minillm.quant.w8a8 import W8A8Linear

    scales = smooth_model(model, activation_max(model, calibration), alpha)
    for name, lin in target_linears(model).items():
        runtime = name.endswith("self_attn.o_proj")
        w = lin.weight.detach().float().contiguous()
        bias = lin.bias.detach() if lin.bias is not None else None
        replace_module(model, name, W8A8Linear.from_float(w, bias, 1.0 / scales[name] if runtime else None))
    assert len(scales) == len(TARGETS) * len(model.layers)
    return scales
