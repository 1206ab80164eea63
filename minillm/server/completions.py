"""POST /v1/completions: one or several prompts, n completions each, streamed or whole."""
from __future__ import annotations

import time
import uuid

from fastapi import Request
from fastapi.responses import Response

from minillm.engine.outputs import RequestOutput
from minillm.server import prompts
from minillm.server.deltas import Cursor, completion_logprobs
from minillm.server.errors import bad_request
from minillm.server.protocol import (CompletionChoice, CompletionChunk, CompletionRequest, CompletionResponse,
                                     UsageInfo)
from minillm.server.sampling import to_sampling_params
from minillm.server.state import ServerState
from minillm.server.streams import SSEResponse, Submitted, sse, sse_error, unless_disconnected


def _prompt_list(req: CompletionRequest) -> list[str | list[int]]:
    p = req.prompt
    if isinstance(p, str) or (p and isinstance(p[0], int)):
        return [p]  # type: ignore[list-item]
    if not p:
        raise bad_request("the prompt is empty", "prompt")
    return list(p)  # type: ignore[arg-type]


async def create_completion(req: CompletionRequest, raw: Request, state: ServerState) -> Response:
    state.check_admitting()
    state.check_model(req.model)
    if req.echo:
        raise bad_request("echo is not supported by this server", "echo")
    if req.suffix:
        raise bad_request("suffix is not supported by this server", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported by this server (only best_of == n)", "best_of")
    state.limits.check_n(req.n)
    prompts.check_max_tokens(state, req.max_tokens)
    params = to_sampling_params(req, req.max_tokens, req.logprobs)
    prompt_list = _prompt_list(req)
    state.check_capacity(len(prompt_list) * params.n)  # before any tokenizing: the cheap refusal first
    ids_list = await prompts.encode_all(state, prompt_list, add_special_tokens=params.add_special_tokens)
    for ids in ids_list:
        prompts.check_context(state, ids, params.max_tokens)
    state.check_capacity(len(ids_list) * params.n)

    rid = f"cmpl-{uuid.uuid4().hex}"
    sub = Submitted(state.engine)
    try:
        for i, ids in enumerate(ids_list):
            await sub.add(f"{rid}-{i}", ids, params, req.priority)
    except BaseException:
        sub.close()
        raise
    n, k = params.n, req.logprobs
    cursors = [Cursor() for _ in range(len(ids_list) * n)]
    created = int(time.time())
    usage = UsageInfo(prompt_tokens=sum(len(ids) for ids in ids_list))

    def logprobs(cur: Cursor, ids: list[int], lps: list[dict[int, float]]):
        return completion_logprobs(state.tokenizer, ids, lps, k, cur) if k is not None else None

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        async def events():
            try:
                async for p, out in sub.outputs():
                    choices = []
                    for c in out.outputs:
                        cur = cursors[p * n + c.index]
                        d = cur.advance(c, with_tokens=k is not None)
                        if d is None:
                            continue
                        if d.finish_reason is not None:
                            usage.completion_tokens += len(c.token_ids)
                        choices.append(CompletionChoice(index=p * n + c.index, text=d.text,
                                                        logprobs=logprobs(cur, d.token_ids, d.logprobs),
                                                        finish_reason=d.finish_reason, stop_reason=d.stop_reason))
                    if choices:
                        yield sse(CompletionChunk(id=rid, created=created, model=state.model_name, choices=choices))
                if include_usage:
                    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
                    yield sse(CompletionChunk(id=rid, created=created, model=state.model_name, choices=[], usage=usage))
            except Exception as e:  # the engine stopped mid-stream: tell the client, then end the stream
                yield sse_error(e)
            finally:
                sub.close()
            yield sse("[DONE]")

        return SSEResponse(events(), on_close=sub.close)

    async def collect() -> CompletionResponse:
        final: dict[int, RequestOutput] = {}
        try:
            async for p, out in sub.outputs():
                if out.finished:
                    final[p] = out
        finally:
            sub.close()
        choices = []
        for p in range(len(ids_list)):
            for c in final[p].outputs:
                cur = cursors[p * n + c.index]
                ids, lps = cur.new_tokens(c)
                choices.append(CompletionChoice(index=p * n + c.index, text=c.text, logprobs=logprobs(cur, ids, lps),
                                                finish_reason=c.finish_reason, stop_reason=c.stop_reason))
                usage.completion_tokens += len(c.token_ids)
        usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
        return CompletionResponse(id=rid, created=created, model=state.model_name, choices=choices, usage=usage)

    result = await unless_disconnected(raw, collect())
    if result is None:
        return Response(status_code=499)  # the client left; nobody reads this
    return Response(result.model_dump_json(), media_type="application/json")
