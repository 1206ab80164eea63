"""Human-written text for perplexity and calibration, offline on every machine with Python.

Two domains, each split into a disjoint "eval" and "calib" half:

- prose: Python's own reference manual, shipped as ``pydoc_data.topics`` (English prose about a
  language). Topics in sorted-name order; eval from the first half, calib from the second.
- code: the Python standard library's own top-level modules (``Lib/*.py``, human-written Python),
  sorted by file name; eval from the first half, calib from the second. Each module contributes one
  excerpt (from its first top-level def/class, so licence headers, docstrings and import lists do
  not dominate), so a window of tokens spans many modules rather than one long file.

The code domain exists for the calibration-domain pitfall (issue 17): calibrate a quantizer on one
domain, evaluate on the other.
"""
from __future__ import annotations

import os
import sysconfig

SPLITS = ("eval", "calib")
DOMAINS = ("prose", "code")
CODE_EXCERPT_CHARS = 3000  # per module; ~75 modules per split -> ~200k characters, ~60k tokens
_CODE_START = ("def ", "class ", "@")


def corpus_text(split: str = "eval", domain: str = "prose") -> str:
    """One split of one domain's text (see the module docstring), joined by blank lines."""
    if split not in SPLITS:
        raise ValueError(f"unknown text split {split!r}; choose one of {SPLITS}")
    if domain not in DOMAINS:
        raise ValueError(f"unknown text domain {domain!r}; choose one of {DOMAINS}")
    if domain == "code":
        return _code_text(split)
    from pydoc_data.topics import topics

    names = sorted(topics)
    half = len(names) // 2
    chosen = names[:half] if split == "eval" else names[half:]
    return "\n\n".join(topics[n].strip() for n in chosen)


def code_modules(split: str) -> list[str]:
    """The standard-library files of one split: Lib/*.py without the private (_x.py) ones, by name."""
    lib = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in os.listdir(lib) if f.endswith(".py") and not f.startswith("_"))
    if len(files) < 20:
        raise RuntimeError(f"found only {len(files)} standard-library modules in {lib}: the code text needs them")
    half = len(files) // 2
    return [os.path.join(lib, f) for f in (files[:half] if split == "eval" else files[half:])]


def code_excerpt(source: str, max_chars: int = CODE_EXCERPT_CHARS) -> str:
    """From the first top-level def/class/decorator line up to max_chars, cut at a line end."""
    lines = source.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.startswith(_CODE_START)), 0)
    out, n = [], 0
    for line in lines[start:]:
        if n + len(line) > max_chars and out:
            break
        out.append(line)
        n += len(line)
    return "".join(out).strip()


def _code_text(split: str) -> str:
    parts = []
    for path in code_modules(split):
        with open(path, encoding="utf-8", errors="replace") as f:
            excerpt = code_excerpt(f.read())
        if excerpt:
            parts.append(excerpt)
    return "\n\n".join(parts)


def corpus_tokens(tokenizer, split: str = "eval", max_tokens: int | None = None, domain: str = "prose") -> list[int]:
    ids = tokenizer.encode(corpus_text(split, domain), add_special_tokens=False)
    return ids[:max_tokens] if max_tokens is not None else ids
