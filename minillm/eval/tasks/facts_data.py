"""Short factual and format questions for a small chat model, scored by exact match.

Chosen for SmolLM2-135M-Instruct: capitals, one-step arithmetic, everyday facts, a sequence
to continue, words to transform and replies in a given JSON shape -- things a 135M model gets
partly right, so a quantization that hurts it has room to show. Every question goes through
the model's chat template after a system line and three worked exchanges (SHOTS) that show
the expected reply: the answer alone. `answers` lists every accepted reply after
normalization (facts_check.normalize); `kind="case"` keeps letter case, `kind="json"` items
are compared as parsed JSON.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FactItem:
    item_id: str
    question: str
    answers: tuple[str, ...]  # accepted replies, already normalized (or JSON text for kind="json")
    kind: str = "text"  # "text" | "case" (case kept) | "json"


SYSTEM = ("Answer with only the answer: one word, one number or the exact text asked for. "
          "No sentence, no explanation.")
SHOTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of Italy?", "Rome"),
    ("What is 3 + 4?", "7"),
    ('Reply in JSON with key "name" and the value "Ann".', '{"name": "Ann"}'),
)


def _f(item_id: str, question: str, *answers: str, kind: str = "text") -> FactItem:
    return FactItem(item_id, question, tuple(answers), kind)


FACT_ITEMS: list[FactItem] = [
    # capitals
    _f("capital/france", "What is the capital of France?", "paris"),
    _f("capital/japan", "What is the capital of Japan?", "tokyo"),
    _f("capital/germany", "What is the capital of Germany?", "berlin"),
    _f("capital/spain", "What is the capital of Spain?", "madrid"),
    _f("capital/uk", "What is the capital of the United Kingdom?", "london"),
    _f("capital/egypt", "What is the capital of Egypt?", "cairo"),
    _f("capital/canada", "What is the capital of Canada?", "ottawa"),
    _f("capital/russia", "What is the capital of Russia?", "moscow"),
    # arithmetic
    _f("math/add", "What is 7 + 5?", "12", "twelve"),
    _f("math/sub", "What is 10 - 3?", "7", "seven"),
    _f("math/mul", "What is 6 times 2?", "12", "twelve"),
    _f("math/add_small", "What is 2 + 2?", "4", "four"),
    _f("math/div", "What is 20 divided by 4?", "5", "five"),
    _f("math/sqrt", "What is the square root of 9?", "3", "three"),
    # everyday facts
    _f("fact/week", "How many days are in a week?", "7", "seven"),
    _f("fact/day_hours", "How many hours are in a day?", "24", "twenty-four"),
    _f("fact/dog_legs", "How many legs does a dog have?", "4", "four"),
    _f("fact/planet", "Which planet do we live on?", "earth"),
    _f("fact/sky", "What color is the sky on a clear day?", "blue"),
    _f("fact/ocean", "What is the largest ocean on Earth?", "pacific", "pacific ocean"),
    _f("fact/boil", "At how many degrees Celsius does water boil at sea level?", "100", "100°c"),
    _f("fact/water_symbol", "What is the chemical formula of water?", "h2o"),
    _f("fact/moo", "Which farm animal says moo?", "cow", "a cow"),
    _f("fact/shakespeare", "Who wrote Romeo and Juliet?", "shakespeare", "william shakespeare"),
    _f("fact/mix", "What color do you get by mixing blue and yellow?", "green"),
    # sequences
    _f("seq/even", "What number comes next: 2, 4, 6, 8, ?", "10", "ten"),
    _f("seq/letters", "What letter comes next: A, B, C, D, ?", "e"),
    _f("seq/weekday", "Which day comes after Monday?", "tuesday"),
    _f("seq/month", "Which month comes after March?", "april"),
    _f("seq/tens", "What number comes next: 10, 20, 30, 40, ?", "50", "fifty"),
    # words
    _f("word/opposite_hot", "What is the opposite of hot?", "cold"),
    _f("word/plural_cat", "What is the plural of cat?", "cats"),
    _f("word/upper", "Write the word apple in capital letters.", "APPLE", kind="case"),
    _f("word/first_letter", "What is the first letter of the English alphabet?", "a"),
    # format: JSON
    _f("json/color", 'Reply in JSON with key "color" and the value "blue".', '{"color": "blue"}', kind="json"),
    _f("json/x", 'Reply in JSON with key "x" and the value 3.', '{"x": 3}', kind="json"),
    _f("json/city", 'Reply in JSON with key "city" and the value "Paris".', '{"city": "Paris"}', kind="json"),
    _f("json/ok", 'Reply in JSON with key "ok" and the value true.', '{"ok": true}', kind="json"),
]
