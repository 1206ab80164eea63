"""From an API request to the engine's SamplingParams, refusing what the engine cannot do.

SamplingParams validates every value; its ValueError becomes an HTTP 400
naming the parameter. Knobs the engine does not implement (penalties,
logit_bias, echo, suffix) are refused when set to a value that would change
the output, rather than silently ignored.
"""
from __future__ import annotations

from minillm.sampling_params import SamplingParams
from minillm.server.errors import bad_request
from minillm.server.protocol import SamplingFields

_PREFIX = "invalid sampling parameter:"


def _param_of(message: str) -> str | None:
    """'invalid sampling parameter: top_p must be ...' -> 'top_p'."""
    if not message.startswith(_PREFIX):
        return None
    word = message[len(_PREFIX):].strip().split(" ", 1)[0]
    return word if word.isidentifier() else None


def refuse_unsupported(req: SamplingFields) -> None:
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise bad_request(f"{name} is not supported by this server (only 0)", name)
    if req.repetition_penalty not in (None, 1, 1.0):
        raise bad_request("repetition_penalty is not supported by this server (only 1.0)", "repetition_penalty")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported by this server", "logit_bias")


def to_sampling_params(req: SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    refuse_unsupported(req)
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids or [],
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            add_special_tokens=req.add_special_tokens,
        )
    except ValueError as e:
        raise bad_request(str(e), _param_of(str(e))) from e
