"""What an engine picks on each device when not told: bf16 and the Triton kernels on CUDA, float32 and torch on CPU."""
import pytest
import torch

from minillm.engine.config import EngineConfig


def test_auto_dtype_and_backend_follow_the_device():
    cuda, cpu = EngineConfig(device="cuda"), EngineConfig(device="cpu")
    assert cuda.torch_dtype == torch.bfloat16 and cuda.backend_for(torch.device("cuda")) == "triton"
    assert cpu.torch_dtype == torch.float32 and cpu.backend_for(torch.device("cpu")) == "torch"
    # torch.compile is written for the torch backend: auto keeps it there on CUDA too
    assert EngineConfig(device="cuda", compile=True).backend_for(torch.device("cuda")) == "torch"
    # an explicit choice is kept
    assert EngineConfig(device="cuda", dtype="float32", attention_backend="torch").torch_dtype == torch.float32
    assert EngineConfig(attention_backend="torch").backend_for(torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match="unknown attention_backend"):
        EngineConfig(attention_backend="flash")
    with pytest.raises(ValueError, match="compile=True is implemented for the torch"):
        EngineConfig(compile=True, attention_backend="triton")
