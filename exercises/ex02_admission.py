"""Exercise 02 -- the scheduler's token-budget admission rule (notebooks 05 / 07, and 14_exercises).

Each engine step has a budget of max_num_batched_tokens tokens and max_num_seqs seats. Running
sequences are served first (a decode costs one token); what is left goes to waiting sequences, in
order, one after another. For each one the scheduler (minillm/engine/scheduler.py,
Scheduler.schedule) asks this function how many of its remaining prompt tokens to schedule now.

admit_within_budget(num_remaining, budget_left, seats_left, chunked_prefill) -> int
  * no seat left, or no budget left: 0 (admit nothing);
  * the remaining tokens fit the budget: all of them;
  * they do not fit: with chunked prefill, as many as the budget has left (the rest comes in
    later steps); without it, 0 -- the prompt waits for a step with room for all of it.
A 0 stops admission for this step (strict order: nobody jumps the queue).

Predict before you measure (notebook 14): a 300-token prompt, budget 64, three sequences decoding
-- how many steps until its first token?

Check: python -m exercises admission
"""
from __future__ import annotations


def admit_within_budget(num_remaining: int, budget_left: int, seats_left: int, chunked_prefill: bool) -> int:
    raise NotImplementedError("exercise 02: admit_within_budget (exercises/ex02_admission.py)")
