"""Quality evaluation: perplexity and top-1 agreement through the paged engine path."""
from minillm.eval.paged import TokenScores, score_windows, windows
from minillm.eval.text import corpus_text, corpus_tokens

__all__ = ["TokenScores", "score_windows", "windows", "corpus_text", "corpus_tokens"]
