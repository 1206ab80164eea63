"""An OpenAI-compatible HTTP server over one LLMEngine (needs the `server` extra).

    from minillm.server import create_app
    app = create_app(engine, model_name="my-model")

Files, one concept each: protocol.py (request/response models), async_engine.py
(the one thread that owns the engine), streams.py (fan-in, aborts, SSE),
deltas.py (text deltas, logprobs), sampling.py / prompts.py (request -> engine
input), completions.py / chat.py (the two endpoints), app.py (routes, errors),
cli.py (`minillm serve`).
"""
from minillm.server.app import create_app
from minillm.server.async_engine import AsyncEngine, EngineDeadError

__all__ = ["AsyncEngine", "EngineDeadError", "create_app"]
