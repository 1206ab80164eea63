"""minillm: a compact, complete LLM inference engine to learn from."""
from minillm import envs, hub_kernels

hub_kernels.install()  # before transformers is imported: see minillm/hub_kernels.py

from minillm.engine.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine, RequestError
from minillm.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "RequestError", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
__version__ = "0.1.0"

if envs.get(envs.MINILLM_EXERCISES):  # the course's exercise switch (minillm/exercises.py)
    from minillm.exercises import use_from_env

    use_from_env()
