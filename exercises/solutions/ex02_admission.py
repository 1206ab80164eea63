"""A worked answer to exercise 02 (exercises/ex02_admission.py)."""
from __future__ import annotations


def admit_within_budget(num_remaining: int, budget_left: int, seats_left: int, chunked_prefill: bool) -> int:
    if seats_left <= 0 or budget_left <= 0:
        return 0
    if num_remaining <= budget_left:
        return num_remaining  # fits whole
    if chunked_prefill:
        return budget_left  # a chunk now, the rest in later steps
    return 0  # waits for a step with room for all of it
