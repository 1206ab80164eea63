"""Triton kernels, each beside its plain-PyTorch reference (imported as ``minillm.kernels``).

kv_store      store_kv_cache             new K/V -> paged cache slots
paged_decode  paged_decode_attention     one query per sequence, GQA group per program;
              paged_decode_attention_split  flash-decoding split-K + combine
prefill       prefill_attention          FlashAttention-2 varlen causal forward over the paged cache
rmsnorm       rms_norm                   fused residual add + RMSNorm
rope          apply_rope                 rotate-half rotary embedding
bench         main                       GPU check + timing vs measured roofs and SDPA
compile_check main                       compile everything for sm80/sm90 without a GPU

Importing a kernel module on a machine without CUDA selects the Triton
interpreter (TRITON_INTERPRET=1) unless the variable is already set.
"""
import os as _os

import torch as _torch

# Choose the interpreter before anything imports triton: triton.jit decides at
# decoration time, and so do triton.language's own helpers (tl.cdiv ...). This is
# the one place it is chosen: Python runs this file before any minillm.kernels
# submodule (_common, every kernel), and it does not import triton itself, so
# minillm.kernels.testing / bench / compile_check stay triton-free until used.
# An explicit TRITON_INTERPRET (=0 for the GPU compile check) is respected.
if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"
