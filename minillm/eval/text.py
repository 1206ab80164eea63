"""Human-written text for perplexity and calibration: Python's own reference
manual, shipped with every Python as ``pydoc_data.topics``.

Topics are taken in sorted-name order and joined; the evaluation slice comes
from the first topics, the calibration slice (AWQ) from the last ones, so the
two never share text.
"""
from __future__ import annotations

SPLITS = ("eval", "calib")


def corpus_text(split: str = "eval") -> str:
    """The topics of one split, joined by blank lines (eval: first half of the topics, calib: second half)."""
    from pydoc_data.topics import topics

    if split not in SPLITS:
        raise ValueError(f"unknown text split {split!r}; choose one of {SPLITS}")
    names = sorted(topics)
    half = len(names) // 2
    chosen = names[:half] if split == "eval" else names[half:]
    return "\n\n".join(topics[n].strip() for n in chosen)


def corpus_tokens(tokenizer, split: str = "eval", max_tokens: int | None = None) -> list[int]:
    ids = tokenizer.encode(corpus_text(split), add_special_tokens=False)
    return ids[:max_tokens] if max_tokens is not None else ids
