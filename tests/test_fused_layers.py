"""The Triton RMSNorm and RoPE kernels inside the model (models/fused.py), as they run on CUDA.

Here the kernels run under the Triton interpreter with the CUDA switch forced on: a whole
model's logits must equal the plain PyTorch layers' (float32), and Gemma's 1 + w norms keep
the PyTorch path.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from minillm.models import fused  # noqa: E402
from minillm.models.layers import RMSNorm  # noqa: E402
from minillm.models.standalone import forward_logits  # noqa: E402
from tests.helpers.engine_utils import tiny_model  # noqa: E402


def test_model_with_fused_kernels_equals_plain_layers(monkeypatch):
    model = tiny_model(seed=6, vocab=47, layers=2)
    prompt = [3, 14, 15, 9, 26, 5, 35, 8]
    ref = forward_logits(model, prompt)
    calls = {"norm": 0, "rope": 0}
    norm, rope = fused.rms_norm, fused.rope

    def counted(name, fn):
        def call(*a):
            calls[name] += 1
            return fn(*a)
        return call

    monkeypatch.setattr(fused, "use_fused", lambda x: True)
    monkeypatch.setattr(fused, "rms_norm", counted("norm", norm))
    monkeypatch.setattr(fused, "rope", counted("rope", rope))
    out = forward_logits(model, prompt)
    assert calls["norm"] == 2 * 2 + 1 and calls["rope"] == 2  # two norms per layer and the final one; rope per layer
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_gemma_norms_keep_the_torch_path(monkeypatch):
    monkeypatch.setattr(fused, "use_fused", lambda x: True)
    monkeypatch.setattr(fused, "rms_norm", lambda *a: (_ for _ in ()).throw(AssertionError("kernel called")))
    norm = RMSNorm(16, 1e-6, unit_offset=True)
    assert norm(torch.randn(3, 16)).shape == (3, 16)
