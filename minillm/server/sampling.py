"""From an API request to the engine's SamplingParams, refusing what the engine cannot do.

SamplingParams validates every value; its ValueError becomes an HTTP 400
naming the parameter. Knobs the engine does not implement (penalties,
logit_bias, echo, suffix) are refused when set to a value that would change
the output, rather than silently ignored.

Structured outputs come in three spellings (OpenAI's response_format, vLLM's
structured_outputs, vLLM's older guided_*); one request may use one of them,
and its errors name the field the client used.
"""
from __future__ import annotations

from minillm.sampling_params import SamplingParams
from minillm.server.errors import bad_request
from minillm.server.protocol import SamplingFields
from minillm.structured_outputs import StructuredOutputs

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


_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs_of(req: SamplingFields) -> tuple[StructuredOutputs | None, str | None, str]:
    """The request's constraint, the field it came in (the error's param) and that field's path for
    messages; (None, None, "") when unconstrained. Two fields set at once, or one with ignore_eos or
    min_tokens, is a 400 here; SamplingParams validates the spec itself."""
    given: list[tuple[str, str, dict]] = []
    rf = req.response_format
    if rf is not None and rf.type == "json_schema":
        given.append(("response_format", "response_format.json_schema.schema", {"json": rf.json_schema.schema_}))
    elif rf is not None and rf.type == "json_object":
        given.append(("response_format", "response_format", {"json_object": True}))
    if req.structured_outputs is not None:
        spec = req.structured_outputs.model_dump(by_alias=True, exclude_none=True)
        given.append(("structured_outputs", "", {k: v for k, v in spec.items() if v is not False}))
    for name, kind in _GUIDED.items():
        if getattr(req, name) is not None:
            given.append((name, name, {kind: getattr(req, name)}))
    if not given:
        return None, None, ""
    if len(given) > 1:
        names = [f"response_format ({rf.type})" if name == "response_format" else name for name, _, _ in given]
        raise bad_request(f"a request takes one structured output (response_format, structured_outputs or "
                          f"guided_*); got {' and '.join(names)}", given[1][0])
    param, where, spec = given[0]
    if req.ignore_eos or req.min_tokens:
        raise bad_request(f"{param} cannot be combined with ignore_eos or min_tokens: a structured output "
                          "ends where its grammar ends", param)
    try:
        return StructuredOutputs(**spec), param, where
    except ValueError as e:  # a schema given as text that is not JSON
        raise bad_request(_renamed(str(e), where), param) from e


def _renamed(message: str, where: str) -> str:
    """'structured_outputs.json was refused ...' in the words of the field the client used."""
    if not where:  # the client wrote structured_outputs: its words already
        return message
    for kind in ("json_object", "json", "regex", "choice", "grammar"):
        if f"structured_outputs.{kind}" in message:
            return message.replace(f"structured_outputs.{kind}", where, 1)
    return message.replace("structured_outputs", where, 1)


def to_sampling_params(req: SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    refuse_unsupported(req)
    constraint, constraint_param, where = structured_outputs_of(req)
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
            structured_outputs=constraint,
        )
    except ValueError as e:
        message, param = str(e), _param_of(str(e))
        if constraint_param is not None and (param == "structured_outputs" or message.startswith("structured_outputs")):
            # where: "" for structured_outputs itself (the message's own words), else the client's field
            message, param = _renamed(message, where), constraint_param
        raise bad_request(message, param) from e
