"""Task suites beyond perplexity: code completion checked by unit tests, short facts by exact match."""
from minillm.eval.tasks.code_check import CheckResult, check_all, check_completion, extract_body
from minillm.eval.tasks.code_data import CODE_TASKS, CodeTask

__all__ = ["CODE_TASKS", "CodeTask", "CheckResult", "check_all", "check_completion", "extract_body"]
