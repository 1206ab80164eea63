"""The FastAPI app: OpenAI-compatible routes over one engine loop, plus /metrics and /health.

    app = create_app(engine, model_name="tiny")   # an LLMEngine you built (tests), or:
    app = create_app(LLM().engine)                # the default model; `minillm serve` does this
    uvicorn.run(app, host="127.0.0.1", port=8000)

Errors always have OpenAI's shape `{"error": {"message", "type", "param", "code"}}`:
bad input is a 400 (never a 422 or a 500), a missing or wrong API key 401, an
unknown model 404, a body over the limit 413, a full queue 429, a server warming
up, draining or without its engine 503; a 500 carries no internal text (the
server's log has it). Limits: server/limits.py; keys: server/auth.py; warm-up,
draining and failure: server/lifecycle.py.
"""
from __future__ import annotations

import asyncio
import copy
import logging
from contextlib import asynccontextmanager
from typing import Any, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from minillm.engine.llm_engine import LLMEngine
from minillm.metrics.prometheus import TraceMetrics
from minillm.server.async_engine import AsyncEngine, EngineDeadError
from minillm.server.auth import ApiKeyCheck
from minillm.server.chat import create_chat_completion
from minillm.server.completions import create_completion
from minillm.server.errors import APIError, bad_request, engine_error, internal_error
from minillm.server.lifecycle import pool_report, warm_up
from minillm.server.limits import BodySizeLimit, ServerLimits, longest_token_bytes
from minillm.server.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from minillm.server.state import DRAINING, READY, WARMING_UP, ServerState

log = logging.getLogger("minillm.server")


def _own_copy(tokenizer: Any | None) -> Any | None:
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # not copyable: share it (fine for tokenizers that are thread-safe)
        return tokenizer


def validation_error(errors: Sequence[Any]) -> APIError:
    """Pydantic's errors -> one 400 naming the top-level field (OpenAI's `param`)."""
    if not errors:
        return bad_request("invalid request body")
    if errors[0].get("type") == "json_invalid":
        return bad_request(f"the body is not valid JSON: {errors[0].get('ctx', {}).get('error', '')}".rstrip(": "))
    locs = [[str(x) for x in err.get("loc", ()) if x != "body"] for err in errors]
    param = locs[0][0] if locs[0] else None
    if param is None:
        return bad_request(str(errors[0].get("msg", "invalid request body")))
    same = [loc for loc in locs if loc[:1] == [param]]
    bounded = [err for err, loc in zip(errors, locs) if loc[:1] == [param] and not str(err.get("type")).endswith("_type")]
    if len(same) > 1 and bounded:  # a union field whose right form broke a bound (too many, too long)
        where = ".".join(x for x in [str(x) for x in bounded[0].get("loc", ()) if x != "body"] if not x.startswith(("list[", "constrained")))
        return bad_request(f"{where}: {bounded[0].get('msg', 'invalid value')}", param)
    if len(same) > 1:  # a union field: every accepted form failed
        forms = list(dict.fromkeys(loc[1].replace("constrained-str", "str") for loc in same if len(loc) > 1))
        return bad_request(f"{param}: invalid value; accepted forms: {', '.join(forms)}", param)
    return bad_request(f"{'.'.join(locs[0])}: {errors[0].get('msg', 'invalid value')}", param)


def create_app(engine: LLMEngine, tokenizer: Any | None = None, model_name: str = "minillm",
               max_queue_len: int = 1024, trace_window: int | None = 1024, limits: ServerLimits | None = None,
               api_key: str | None = None, protect_all_routes: bool = False, warmup: bool = True) -> FastAPI:
    """tokenizer: for prompts, the chat template and logprob token strings (default: the engine's).

    The engine itself must have a tokenizer to return text; without one, send token ids and read
    token ids (completions only). limits: default n at most the engine's max_num_seqs. api_key: required
    as `Bearer` on /v1/* (and on /health, /metrics with protect_all_routes). warmup: run the warm-up
    requests at start and report ready after them (False: ready at once).
    """
    tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
    metrics = TraceMetrics(model_name)
    async_engine = AsyncEngine(engine, [metrics.observe], trace_window)
    state = ServerState(async_engine, _own_copy(tokenizer), model_name, engine.max_model_len, max_queue_len, metrics,
                        limits or ServerLimits(max_n=engine.config.max_num_seqs), _own_copy(tokenizer),
                        longest_token_bytes(tokenizer), WARMING_UP if warmup else READY)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        warming = asyncio.create_task(warm_up(state))
        try:
            yield
        finally:
            warming.cancel()
            state.phase = DRAINING
            async_engine.shutdown()
            state.prompt_thread.shutdown(wait=False, cancel_futures=True)
            log.info("engine stopped: %s", pool_report(state))

    app = FastAPI(title="minillm", lifespan=lifespan)
    app.state.server = state
    # the last added runs first: the key is checked before a byte of the body is read
    app.add_middleware(BodySizeLimit, max_bytes=state.limits.max_request_bytes)
    if api_key:
        app.add_middleware(ApiKeyCheck, api_key=api_key, protect_all=protect_all_routes)

    # ----- errors -----------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e.errors()).response()

    @app.exception_handler(EngineDeadError)
    async def dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return engine_error(e).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return APIError(e.status_code, str(e.detail), kind).response()

    @app.exception_handler(Exception)
    async def internal(_: Request, e: Exception) -> JSONResponse:
        log.error("unhandled error", exc_info=e)
        return internal_error().response()

    # ----- routes ----------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        return await create_completion(req, raw, state)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(req, raw, state)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model_name, root=model_name, max_model_len=state.max_model_len)])

    @app.get("/health")
    async def health() -> Response:
        """200 once warmed up and while the engine runs; 503 while warming up, draining or failed."""
        if async_engine.error is not None:
            return APIError(503, "the engine failed; the server is stopping", "service_unavailable",
                            code="engine_failed").response()
        if not async_engine.is_healthy:
            raise EngineDeadError("the engine is not running")
        if state.phase != READY:
            state.check_admitting()
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
