"""Exact match after a stated normalization, and the chat prompts of the facts suite.

normalize(reply): strip surrounding whitespace; drop a surrounding ``` code fence (and its
language tag); strip quotes, backticks and asterisks around the reply; drop trailing
".", "!" and ";"; collapse runs of whitespace to one space; lower-case (not for kind="case").
Nothing else: "The capital is Paris." does not match "paris" -- the item asks for the answer
alone, and following that instruction is part of what is measured.
kind="json": the fence-stripped reply must parse as JSON equal to the answer's JSON.
"""
from __future__ import annotations

import json
import re

from minillm.eval.tasks.facts_data import SHOTS, SYSTEM, FactItem

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```$", re.S)


def strip_fence(reply: str) -> str:
    s = reply.strip()
    m = _FENCE.match(s)
    return m.group(1).strip() if m else s


def normalize(reply: str, fold_case: bool = True) -> str:
    s = strip_fence(reply)
    prev = None
    while prev != s:  # quotes inside bold, a period inside quotes: peel until nothing changes
        prev = s
        s = s.strip().strip("\"'`*").rstrip(".!;").strip()
    s = " ".join(s.split())
    return s.lower() if fold_case else s


def is_match(item: FactItem, reply: str) -> bool:
    if item.kind == "json":
        try:
            got = json.loads(strip_fence(reply))
        except ValueError:
            return False
        return any(got == json.loads(a) for a in item.answers)
    got = normalize(reply, fold_case=item.kind != "case")
    return got in {normalize(a, fold_case=item.kind != "case") for a in item.answers}


def messages(item: FactItem) -> list[dict[str, str]]:
    """The conversation a fact item is asked in: system line, the worked exchanges, the question."""
    conv = [{"role": "system", "content": SYSTEM}]
    for q, a in SHOTS:
        conv += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return conv + [{"role": "user", "content": item.question}]
