"""The code-completion tasks, written for minillm (not taken from HumanEval or MBPP).

Each task is a function signature + docstring (the prompt, which the model continues with
the body), a reference body, and assert lines that call the function. The tests compare
with values that are never None and never falsy-only, so a body of `return None` fails
every task (tests/test_eval_tasks.py checks it, and that every reference passes).
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class CodeTask:
    task_id: str
    entry_point: str  # the function the tests call
    prompt: str  # imports + signature + docstring, ending in a newline: the model writes the body
    reference: str  # a body (indented) that passes the tests
    tests: str  # top-level assert statements


def _task(task_id: str, entry: str, prompt: str, reference: str, tests: str) -> CodeTask:
    return CodeTask(task_id, entry, textwrap.dedent(prompt).lstrip("\n"),
                    textwrap.indent(textwrap.dedent(reference).strip("\n"), "    ") + "\n",
                    textwrap.dedent(tests).strip("\n") + "\n")


CODE_TASKS: list[CodeTask] = [
    # ---- strings -----------------------------------------------------------------------------
    _task("str/count_vowels", "count_vowels", '''
        def count_vowels(text: str) -> int:
            """Return how many characters of `text` are vowels (a, e, i, o, u), ignoring case."""
        ''', '''
        return sum(1 for c in text.lower() if c in "aeiou")
        ''', '''
        assert count_vowels("Hello World") == 3
        assert count_vowels("AEIOU xyz") == 5
        assert count_vowels("rhythm") == 0
        assert count_vowels("") == 0
        '''),
    _task("str/reverse_words", "reverse_words", '''
        def reverse_words(sentence: str) -> str:
            """Return the words of `sentence` in reverse order, joined by single spaces.

            Runs of spaces count as one separator; leading and trailing spaces are dropped.
            """
        ''', '''
        return " ".join(reversed(sentence.split()))
        ''', '''
        assert reverse_words("the quick brown fox") == "fox brown quick the"
        assert reverse_words("  two   spaces ") == "spaces two"
        assert reverse_words("one") == "one"
        assert reverse_words("") == ""
        '''),
    _task("str/is_palindrome", "is_palindrome", '''
        def is_palindrome(text: str) -> bool:
            """True if `text` reads the same backwards, looking only at letters and digits, ignoring case."""
        ''', '''
        s = [c.lower() for c in text if c.isalnum()]
        return s == s[::-1]
        ''', '''
        assert is_palindrome("Never odd or even!") is True
        assert is_palindrome("No 'x' in Nixon") is True
        assert is_palindrome("minillm") is False
        assert is_palindrome("12a21") is True
        assert is_palindrome("ab") is False
        '''),
    _task("str/rle_encode", "rle_encode", '''
        def rle_encode(text: str) -> str:
            """Run-length encode: each run of one character becomes the character then the run length.

            rle_encode("aaabcc") == "a3b1c2"
            """
        ''', '''
        out = []
        i = 0
        while i < len(text):
            j = i
            while j < len(text) and text[j] == text[i]:
                j += 1
            out.append(f"{text[i]}{j - i}")
            i = j
        return "".join(out)
        ''', '''
        assert rle_encode("aaabcc") == "a3b1c2"
        assert rle_encode("z") == "z1"
        assert rle_encode("") == ""
        assert rle_encode("aaaaaaaaaaaab") == "a12b1"
        assert rle_encode("abab") == "a1b1a1b1"
        '''),
    _task("str/rle_decode", "rle_decode", '''
        def rle_decode(code: str) -> str:
            """Invert run-length encoding: a letter followed by a decimal count (which may have
            several digits) becomes that many copies of the letter. rle_decode("a3b1c2") == "aaabcc"."""
        ''', '''
        out = []
        i = 0
        while i < len(code):
            ch = code[i]
            j = i + 1
            while j < len(code) and code[j].isdigit():
                j += 1
            out.append(ch * int(code[i + 1:j]))
            i = j
        return "".join(out)
        ''', '''
        assert rle_decode("a3b1c2") == "aaabcc"
        assert rle_decode("x12") == "x" * 12
        assert rle_decode("q1") == "q"
        assert rle_decode("") == ""
        '''),
    _task("str/caesar_shift", "caesar_shift", '''
        def caesar_shift(text: str, k: int) -> str:
            """Shift every ASCII letter of `text` k places forward in the alphabet, wrapping around
            and keeping its case; other characters stay as they are. k may be negative or large."""
        ''', '''
        out = []
        for c in text:
            if "a" <= c <= "z":
                out.append(chr((ord(c) - 97 + k) % 26 + 97))
            elif "A" <= c <= "Z":
                out.append(chr((ord(c) - 65 + k) % 26 + 65))
            else:
                out.append(c)
        return "".join(out)
        ''', '''
        assert caesar_shift("abc", 1) == "bcd"
        assert caesar_shift("Hello, World!", 3) == "Khoor, Zruog!"
        assert caesar_shift("xyz", 3) == "abc"
        assert caesar_shift("abc", -1) == "zab"
        assert caesar_shift("Zz", 52) == "Zz"
        '''),
    _task("str/capitalize_words", "capitalize_words", '''
        def capitalize_words(text: str) -> str:
            """Make the first letter of every space-separated word upper case and the rest lower case.
            Spaces are kept exactly as they are."""
        ''', '''
        return " ".join(w[:1].upper() + w[1:].lower() for w in text.split(" "))
        ''', '''
        assert capitalize_words("hello wORLD") == "Hello World"
        assert capitalize_words("a  b") == "A  B"
        assert capitalize_words("PYTHON") == "Python"
        assert capitalize_words("") == ""
        '''),
    _task("str/longest_common_prefix", "longest_common_prefix", '''
        def longest_common_prefix(words: list[str]) -> str:
            """The longest string that every word in `words` starts with ("" for an empty list)."""
        ''', '''
        if not words:
            return ""
        prefix = words[0]
        for w in words[1:]:
            while not w.startswith(prefix):
                prefix = prefix[:-1]
        return prefix
        ''', '''
        assert longest_common_prefix(["interview", "internet", "interval"]) == "inter"
        assert longest_common_prefix(["dog", "cat"]) == ""
        assert longest_common_prefix(["same", "same"]) == "same"
        assert longest_common_prefix([]) == ""
        assert longest_common_prefix(["ab", "a"]) == "a"
        '''),
    _task("str/snake_to_camel", "snake_to_camel", '''
        def snake_to_camel(name: str) -> str:
            """Convert a snake_case name to camelCase: snake_to_camel("max_num_seqs") == "maxNumSeqs"."""
        ''', '''
        first, *rest = name.split("_")
        return first + "".join(p[:1].upper() + p[1:] for p in rest)
        ''', '''
        assert snake_to_camel("max_num_seqs") == "maxNumSeqs"
        assert snake_to_camel("token") == "token"
        assert snake_to_camel("block_size") == "blockSize"
        assert snake_to_camel("a_b_c") == "aBC"
        '''),
    _task("str/camel_to_snake", "camel_to_snake", '''
        def camel_to_snake(name: str) -> str:
            """Convert camelCase to snake_case: put "_" before every upper-case letter and lower it.
            camel_to_snake("blockSize") == "block_size"."""
        ''', '''
        return "".join("_" + c.lower() if c.isupper() else c for c in name)
        ''', '''
        assert camel_to_snake("blockSize") == "block_size"
        assert camel_to_snake("maxNumSeqs") == "max_num_seqs"
        assert camel_to_snake("plain") == "plain"
        assert camel_to_snake("aBC") == "a_b_c"
        '''),
    _task("str/char_histogram", "most_common_char", '''
        def most_common_char(text: str) -> str:
            """The character that occurs most often in `text`, ignoring spaces; on a tie, the one that
            appears first. Return "" if there is no such character."""
        ''', '''
        counts: dict[str, int] = {}
        for c in text:
            if c != " ":
                counts[c] = counts.get(c, 0) + 1
        best = ""
        for c, n in counts.items():
            if best == "" or n > counts[best]:
                best = c
        return best
        ''', '''
        assert most_common_char("hello world") == "l"
        assert most_common_char("abcabc") == "a"
        assert most_common_char("   ") == ""
        assert most_common_char("zzy y") == "z"
        '''),
    # ---- lists -------------------------------------------------------------------------------
    _task("list/chunk", "chunk", '''
        def chunk(items: list, size: int) -> list[list]:
            """Split `items` into consecutive pieces of `size` elements; the last piece may be shorter."""
        ''', '''
        return [items[i:i + size] for i in range(0, len(items), size)]
        ''', '''
        assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
        assert chunk([1, 2, 3], 3) == [[1, 2, 3]]
        assert chunk([], 4) == []
        assert chunk(list("abcd"), 1) == [["a"], ["b"], ["c"], ["d"]]
        '''),
    _task("list/flatten", "flatten", '''
        def flatten(nested: list) -> list:
            """Flatten arbitrarily deep nested lists into one list, keeping the order of the leaves."""
        ''', '''
        out = []
        for x in nested:
            if isinstance(x, list):
                out.extend(flatten(x))
            else:
                out.append(x)
        return out
        ''', '''
        assert flatten([1, [2, [3, [4]], 5]]) == [1, 2, 3, 4, 5]
        assert flatten([[], [[]], 7]) == [7]
        assert flatten([]) == []
        assert flatten(["a", ["b", "c"]]) == ["a", "b", "c"]
        '''),
    _task("list/rotate_right", "rotate_right", '''
        def rotate_right(items: list, k: int) -> list:
            """Return a new list with the elements moved k places to the right, wrapping around.
            k may be larger than the length; an empty list stays empty."""
        ''', '''
        if not items:
            return []
        k %= len(items)
        return items[-k:] + items[:-k] if k else list(items)
        ''', '''
        assert rotate_right([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]
        assert rotate_right([1, 2, 3], 3) == [1, 2, 3]
        assert rotate_right([1, 2, 3], 4) == [3, 1, 2]
        assert rotate_right([], 5) == []
        '''),
    _task("list/second_largest", "second_largest", '''
        def second_largest(nums: list[int]) -> int | None:
            """The second largest distinct value in `nums`, or None if there are fewer than two distinct values."""
        ''', '''
        vals = sorted(set(nums))
        return vals[-2] if len(vals) >= 2 else None
        ''', '''
        assert second_largest([3, 1, 4, 1, 5, 9]) == 5
        assert second_largest([7, 7, 7]) is None
        assert second_largest([-2, -5]) == -5
        assert second_largest([10, 10, 9]) == 9
        '''),
    _task("list/moving_average", "moving_average", '''
        def moving_average(values: list[float], window: int) -> list[float]:
            """The mean of every run of `window` consecutive values, in order (empty if there are fewer values)."""
        ''', '''
        return [sum(values[i:i + window]) / window for i in range(len(values) - window + 1)]
        ''', '''
        assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
        assert moving_average([5, 5, 5], 3) == [5.0]
        assert moving_average([1, 2], 3) == []
        assert moving_average([2, 4, 6, 8], 1) == [2, 4, 6, 8]
        '''),
    _task("list/dedupe", "dedupe", '''
        def dedupe(items: list) -> list:
            """Remove repeated elements, keeping the first occurrence of each and the original order."""
        ''', '''
        seen = set()
        out = []
        for x in items:
            if x not in seen:
                seen.add(x)
                out.append(x)
        return out
        ''', '''
        assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]
        assert dedupe(["b", "a", "b"]) == ["b", "a"]
        assert dedupe([]) == []
        assert dedupe([1, 1, 1]) == [1]
        '''),
    _task("list/merge_sorted", "merge_sorted", '''
        def merge_sorted(a: list[int], b: list[int]) -> list[int]:
            """Merge two ascending lists into one ascending list (duplicates kept)."""
        ''', '''
        i = j = 0
        out = []
        while i < len(a) and j < len(b):
            if a[i] <= b[j]:
                out.append(a[i])
                i += 1
            else:
                out.append(b[j])
                j += 1
        return out + a[i:] + b[j:]
        ''', '''
        assert merge_sorted([1, 4, 9], [2, 3, 10]) == [1, 2, 3, 4, 9, 10]
        assert merge_sorted([], [1, 2]) == [1, 2]
        assert merge_sorted([5], []) == [5]
        assert merge_sorted([1, 1], [1]) == [1, 1, 1]
        '''),
    _task("list/pairs_with_sum", "pairs_with_sum", '''
        def pairs_with_sum(nums: list[int], target: int) -> list[tuple[int, int]]:
            """All distinct value pairs (a, b) with a <= b, a + b == target, a and b taken from different
            positions of `nums`; sorted ascending."""
        ''', '''
        found = set()
        for i in range(len(nums)):
            for j in range(i + 1, len(nums)):
                if nums[i] + nums[j] == target:
                    found.add((min(nums[i], nums[j]), max(nums[i], nums[j])))
        return sorted(found)
        ''', '''
        assert pairs_with_sum([1, 2, 3, 4, 5], 6) == [(1, 5), (2, 4)]
        assert pairs_with_sum([3, 3], 6) == [(3, 3)]
        assert pairs_with_sum([3], 6) == []
        assert pairs_with_sum([0, -1, 1, 2, -2], 0) == [(-2, 2), (-1, 1)]
        '''),
    _task("list/interval_merge", "merge_intervals", '''
        def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
            """Merge overlapping closed intervals [start, end] (touching ones too) and return them
            sorted by start."""
        ''', '''
        out: list[list[int]] = []
        for s, e in sorted(intervals):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
        ''', '''
        assert merge_intervals([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]
        assert merge_intervals([[5, 7], [1, 5]]) == [[1, 7]]
        assert merge_intervals([]) == []
        assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]
        '''),
    _task("list/max_subarray", "max_subarray_sum", '''
        def max_subarray_sum(nums: list[int]) -> int:
            """The largest sum of a non-empty run of consecutive elements of `nums` (non-empty list)."""
        ''', '''
        best = cur = nums[0]
        for x in nums[1:]:
            cur = max(x, cur + x)
            best = max(best, cur)
        return best
        ''', '''
        assert max_subarray_sum([2, -3, 4, -1, 2, -5, 3]) == 5
        assert max_subarray_sum([-4, -2, -7]) == -2
        assert max_subarray_sum([1, 2, 3]) == 6
        assert max_subarray_sum([5]) == 5
        '''),
    # ---- dicts -------------------------------------------------------------------------------
    _task("dict/word_counts", "word_counts", '''
        def word_counts(text: str) -> dict[str, int]:
            """Count the words of `text`: split on whitespace, lower-case each word and strip the
            punctuation characters .,!? from its ends; empty results are skipped."""
        ''', '''
        counts: dict[str, int] = {}
        for w in text.split():
            w = w.lower().strip(".,!?")
            if w:
                counts[w] = counts.get(w, 0) + 1
        return counts
        ''', '''
        assert word_counts("The cat. the CAT! a dog?") == {"the": 2, "cat": 2, "a": 1, "dog": 1}
        assert word_counts("") == {}
        assert word_counts("!!! ok") == {"ok": 1}
        '''),
    _task("dict/invert", "invert", '''
        def invert(mapping: dict[str, int]) -> dict[int, list[str]]:
            """Map every value to the sorted list of the keys that have it."""
        ''', '''
        out: dict[int, list[str]] = {}
        for k, v in mapping.items():
            out.setdefault(v, []).append(k)
        return {v: sorted(ks) for v, ks in out.items()}
        ''', '''
        assert invert({"b": 1, "a": 1, "c": 2}) == {1: ["a", "b"], 2: ["c"]}
        assert invert({}) == {}
        assert invert({"x": 0}) == {0: ["x"]}
        '''),
    _task("dict/sum_merge", "sum_merge", '''
        def sum_merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
            """A new dict with every key of a and b; where both have a key, its values are added."""
        ''', '''
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + v
        return out
        ''', '''
        assert sum_merge({"x": 1, "y": 2}, {"y": 3, "z": 4}) == {"x": 1, "y": 5, "z": 4}
        assert sum_merge({}, {"a": 1}) == {"a": 1}
        assert sum_merge({"a": 1}, {}) == {"a": 1}
        a = {"k": 1}
        sum_merge(a, {"k": 1})
        assert a == {"k": 1}
        '''),
    _task("dict/group_by_length", "group_by_length", '''
        def group_by_length(words: list[str]) -> dict[int, list[str]]:
            """Group words by their length, keeping the words of each group in their original order."""
        ''', '''
        out: dict[int, list[str]] = {}
        for w in words:
            out.setdefault(len(w), []).append(w)
        return out
        ''', '''
        assert group_by_length(["hi", "cat", "no", "dog", "a"]) == {2: ["hi", "no"], 3: ["cat", "dog"], 1: ["a"]}
        assert group_by_length([]) == {}
        assert group_by_length(["", "x"]) == {0: [""], 1: ["x"]}
        '''),
    _task("dict/deep_get", "deep_get", '''
        def deep_get(data: dict, path: str, default=None):
            """Follow a dotted key path through nested dicts: deep_get({"a": {"b": 1}}, "a.b") == 1.
            Return `default` if any key is missing or a value on the way is not a dict."""
        ''', '''
        cur = data
        for key in path.split("."):
            if not isinstance(cur, dict) or key not in cur:
                return default
            cur = cur[key]
        return cur
        ''', '''
        assert deep_get({"a": {"b": {"c": 42}}}, "a.b.c") == 42
        assert deep_get({"a": {"b": 1}}, "a.x", "missing") == "missing"
        assert deep_get({"a": 5}, "a.b", -1) == -1
        assert deep_get({"a": {"b": [1, 2]}}, "a.b") == [1, 2]
        '''),
    _task("dict/top_k_frequent", "top_k_frequent", '''
        def top_k_frequent(items: list[str], k: int) -> list[str]:
            """The k most frequent items, most frequent first; ties go to the item seen first."""
        ''', '''
        counts: dict[str, int] = {}
        for x in items:
            counts[x] = counts.get(x, 0) + 1
        order = {x: i for i, x in reversed(list(enumerate(items)))}
        return sorted(counts, key=lambda x: (-counts[x], order[x]))[:k]
        ''', '''
        assert top_k_frequent(["a", "b", "a", "c", "b", "a"], 2) == ["a", "b"]
        assert top_k_frequent(["x", "y", "z", "y", "x"], 2) == ["x", "y"]
        assert top_k_frequent(["q"], 3) == ["q"]
        assert top_k_frequent(["m", "n", "n"], 1) == ["n"]
        '''),
    # ---- math --------------------------------------------------------------------------------
    _task("math/gcd", "gcd", '''
        def gcd(a: int, b: int) -> int:
            """The greatest common divisor of two non-negative integers (gcd(0, 0) == 0)."""
        ''', '''
        while b:
            a, b = b, a % b
        return a
        ''', '''
        assert gcd(12, 18) == 6
        assert gcd(17, 5) == 1
        assert gcd(0, 9) == 9
        assert gcd(0, 0) == 0
        '''),
    _task("math/is_prime", "is_prime", '''
        def is_prime(n: int) -> bool:
            """True if n is a prime number (n may be any integer)."""
        ''', '''
        if n < 2:
            return False
        d = 2
        while d * d <= n:
            if n % d == 0:
                return False
            d += 1
        return True
        ''', '''
        assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]
        assert is_prime(7919) is True
        assert is_prime(-7) is False
        assert is_prime(7917) is False
        '''),
    _task("math/prime_factors", "prime_factors", '''
        def prime_factors(n: int) -> list[int]:
            """The prime factors of n >= 2 in ascending order, repeated as often as they divide n."""
        ''', '''
        out = []
        d = 2
        while d * d <= n:
            while n % d == 0:
                out.append(d)
                n //= d
            d += 1
        if n > 1:
            out.append(n)
        return out
        ''', '''
        assert prime_factors(360) == [2, 2, 2, 3, 3, 5]
        assert prime_factors(97) == [97]
        assert prime_factors(2) == [2]
        assert prime_factors(1001) == [7, 11, 13]
        '''),
    _task("math/digital_root", "digital_root", '''
        def digital_root(n: int) -> int:
            """Sum the decimal digits of a non-negative n, again and again, until one digit is left."""
        ''', '''
        while n >= 10:
            n = sum(int(d) for d in str(n))
        return n
        ''', '''
        assert digital_root(942) == 6
        assert digital_root(7) == 7
        assert digital_root(999999999999) == 9
        assert digital_root(10) == 1
        '''),
    _task("math/from_binary", "from_binary", '''
        def from_binary(bits: str) -> int:
            """The value of a string of 0s and 1s read as an unsigned binary number ("" is 0)."""
        ''', '''
        value = 0
        for b in bits:
            value = value * 2 + (b == "1")
        return value
        ''', '''
        assert from_binary("1011") == 11
        assert from_binary("0") == 0
        assert from_binary("") == 0
        assert from_binary("100000000") == 256
        '''),
    _task("math/to_roman", "to_roman", '''
        def to_roman(n: int) -> str:
            """Write 1 <= n <= 3999 in Roman numerals with subtractive pairs: to_roman(14) == "XIV"."""
        ''', '''
        table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
                 (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
        out = []
        for value, sym in table:
            while n >= value:
                out.append(sym)
                n -= value
        return "".join(out)
        ''', '''
        assert to_roman(14) == "XIV"
        assert to_roman(1994) == "MCMXCIV"
        assert to_roman(3999) == "MMMCMXCIX"
        assert to_roman(40) == "XL"
        '''),
    _task("math/from_roman", "from_roman", '''
        def from_roman(numeral: str) -> int:
            """The value of a valid Roman numeral such as "MCMXCIV" (a smaller symbol before a larger
            one is subtracted)."""
        ''', '''
        values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
        total = 0
        for i, c in enumerate(numeral):
            v = values[c]
            if i + 1 < len(numeral) and values[numeral[i + 1]] > v:
                total -= v
            else:
                total += v
        return total
        ''', '''
        assert from_roman("MCMXCIV") == 1994
        assert from_roman("XIV") == 14
        assert from_roman("III") == 3
        assert from_roman("CDXLIV") == 444
        '''),
    _task("math/collatz_steps", "collatz_steps", '''
        def collatz_steps(n: int) -> int:
            """How many steps n >= 1 takes to reach 1, where a step halves an even number and
            maps an odd number x to 3 * x + 1."""
        ''', '''
        steps = 0
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps
        ''', '''
        assert collatz_steps(1) == 0
        assert collatz_steps(6) == 8
        assert collatz_steps(27) == 111
        assert collatz_steps(16) == 4
        '''),
    _task("math/pascal_row", "pascal_row", '''
        def pascal_row(n: int) -> list[int]:
            """Row n of Pascal's triangle (row 0 is [1], row 2 is [1, 2, 1])."""
        ''', '''
        row = [1]
        for _ in range(n):
            row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]
        return row
        ''', '''
        assert pascal_row(0) == [1]
        assert pascal_row(2) == [1, 2, 1]
        assert pascal_row(5) == [1, 5, 10, 10, 5, 1]
        assert sum(pascal_row(10)) == 1024
        '''),
    _task("math/mean_median", "median", '''
        def median(values: list[float]) -> float:
            """The median of a non-empty list: the middle value after sorting, or the mean of the two
            middle values when the length is even."""
        ''', '''
        s = sorted(values)
        m = len(s) // 2
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
        ''', '''
        assert median([3, 1, 2]) == 2
        assert median([4, 1, 3, 2]) == 2.5
        assert median([7]) == 7
        assert median([-1, -1, 5, 100]) == 2
        '''),
    # ---- parsing -----------------------------------------------------------------------------
    _task("parse/key_values", "parse_key_values", '''
        def parse_key_values(text: str) -> dict[str, str]:
            """Parse "key=value" pairs separated by ";" into a dict. Spaces around keys and values are
            stripped; empty parts are skipped; a value may itself contain "="."""
        ''', '''
        out = {}
        for part in text.split(";"):
            if part.strip():
                key, _, value = part.partition("=")
                out[key.strip()] = value.strip()
        return out
        ''', '''
        assert parse_key_values("a=1; b = two ;") == {"a": "1", "b": "two"}
        assert parse_key_values("") == {}
        assert parse_key_values("expr=x=y") == {"expr": "x=y"}
        assert parse_key_values(" ; k=v") == {"k": "v"}
        '''),
    _task("parse/duration", "parse_duration", '''
        def parse_duration(text: str) -> int:
            """The number of seconds in a duration written like "1h30m15s", "45s" or "2m": each unit
            h, m, s appears at most once, in that order, after a whole number."""
        ''', '''
        import re
        total = 0
        for num, unit in re.findall(r"(\\d+)([hms])", text):
            total += int(num) * {"h": 3600, "m": 60, "s": 1}[unit]
        return total
        ''', '''
        assert parse_duration("1h30m15s") == 5415
        assert parse_duration("45s") == 45
        assert parse_duration("2m") == 120
        assert parse_duration("10h") == 36000
        '''),
    _task("parse/csv_line", "split_csv_line", '''
        def split_csv_line(line: str) -> list[str]:
            """Split one CSV line on commas. A field in double quotes may contain commas, and "" inside
            quotes stands for one double quote; the quotes around a field are not part of it."""
        ''', '''
        fields, cur, quoted, i = [], [], False, 0
        while i < len(line):
            c = line[i]
            if quoted:
                if c == '"' and i + 1 < len(line) and line[i + 1] == '"':
                    cur.append('"')
                    i += 1
                elif c == '"':
                    quoted = False
                else:
                    cur.append(c)
            elif c == '"':
                quoted = True
            elif c == ",":
                fields.append("".join(cur))
                cur = []
            else:
                cur.append(c)
            i += 1
        fields.append("".join(cur))
        return fields
        ''', '''
        assert split_csv_line("a,b,c") == ["a", "b", "c"]
        assert split_csv_line('x,"y, z",w') == ["x", "y, z", "w"]
        assert split_csv_line('"say ""hi""",2') == ['say "hi"', "2"]
        assert split_csv_line("a,,b") == ["a", "", "b"]
        assert split_csv_line("") == [""]
        '''),
    _task("parse/ipv4", "is_ipv4", '''
        def is_ipv4(text: str) -> bool:
            """True if text is a dotted IPv4 address: four decimal numbers 0-255 with no sign, no
            spaces and no leading zeros (except the number 0 itself)."""
        ''', '''
        parts = text.split(".")
        if len(parts) != 4:
            return False
        for p in parts:
            if not p.isdigit() or not p.isascii() or (len(p) > 1 and p[0] == "0") or int(p) > 255:
                return False
        return True
        ''', '''
        assert is_ipv4("192.168.0.1") is True
        assert is_ipv4("255.255.255.255") is True
        assert is_ipv4("256.1.1.1") is False
        assert is_ipv4("1.2.3") is False
        assert is_ipv4("01.2.3.4") is False
        assert is_ipv4("1.2.3.-4") is False
        assert is_ipv4("0.0.0.0") is True
        '''),
    _task("parse/rpn", "eval_rpn", '''
        def eval_rpn(tokens: list[str]) -> int:
            """Evaluate integers and the operators +, -, * written in reverse Polish notation:
            eval_rpn(["2", "3", "+", "4", "*"]) == 20. Numbers may be negative, like "-5"."""
        ''', '''
        stack: list[int] = []
        for t in tokens:
            if t in ("+", "-", "*"):
                b, a = stack.pop(), stack.pop()
                stack.append(a + b if t == "+" else a - b if t == "-" else a * b)
            else:
                stack.append(int(t))
        return stack[-1]
        ''', '''
        assert eval_rpn(["2", "3", "+", "4", "*"]) == 20
        assert eval_rpn(["10", "4", "-"]) == 6
        assert eval_rpn(["-5", "2", "*", "1", "+"]) == -9
        assert eval_rpn(["7"]) == 7
        '''),
    _task("parse/brackets", "brackets_balanced", '''
        def brackets_balanced(text: str) -> bool:
            """True if the brackets (), [] and {} in text are balanced and properly nested; other
            characters are ignored."""
        ''', '''
        pairs = {")": "(", "]": "[", "}": "{"}
        stack = []
        for c in text:
            if c in "([{":
                stack.append(c)
            elif c in pairs:
                if not stack or stack.pop() != pairs[c]:
                    return False
        return not stack
        ''', '''
        assert brackets_balanced("f(a[1], {b: 2})") is True
        assert brackets_balanced("(]") is False
        assert brackets_balanced("((") is False
        assert brackets_balanced("") is True
        assert brackets_balanced("}{") is False
        '''),
    _task("parse/version_compare", "compare_versions", '''
        def compare_versions(a: str, b: str) -> int:
            """Compare dotted version strings like "1.10.2" number by number: -1 if a < b, 0 if equal,
            1 if a > b. Missing trailing numbers count as 0, so "1.2" equals "1.2.0"."""
        ''', '''
        pa = [int(x) for x in a.split(".")]
        pb = [int(x) for x in b.split(".")]
        n = max(len(pa), len(pb))
        pa += [0] * (n - len(pa))
        pb += [0] * (n - len(pb))
        return (pa > pb) - (pa < pb)
        ''', '''
        assert compare_versions("1.10.2", "1.9.9") == 1
        assert compare_versions("1.2", "1.2.0") == 0
        assert compare_versions("0.9", "1.0") == -1
        assert compare_versions("2.0.1", "2.0.10") == -1
        '''),
    # ---- recursion / search --------------------------------------------------------------------
    _task("rec/permutations", "unique_permutations", '''
        def unique_permutations(text: str) -> list[str]:
            """Every distinct ordering of the characters of text, sorted alphabetically."""
        ''', '''
        if len(text) <= 1:
            return [text]
        out = set()
        for i, c in enumerate(text):
            for rest in unique_permutations(text[:i] + text[i + 1:]):
                out.add(c + rest)
        return sorted(out)
        ''', '''
        assert unique_permutations("abc") == ["abc", "acb", "bac", "bca", "cab", "cba"]
        assert unique_permutations("aab") == ["aab", "aba", "baa"]
        assert unique_permutations("z") == ["z"]
        '''),
    _task("rec/subset_sums", "count_subsets", '''
        def count_subsets(nums: list[int], target: int) -> int:
            """How many subsets of the positions of nums have elements that add up to target
            (the empty subset sums to 0)."""
        ''', '''
        if not nums:
            return 1 if target == 0 else 0
        return count_subsets(nums[1:], target) + count_subsets(nums[1:], target - nums[0])
        ''', '''
        assert count_subsets([1, 2, 3], 3) == 2
        assert count_subsets([2, 2, 2], 4) == 3
        assert count_subsets([], 0) == 1
        assert count_subsets([5], 1) == 0
        '''),
    _task("rec/tree_depth", "tree_depth", '''
        def tree_depth(node) -> int:
            """The depth of a binary tree given as nested tuples (value, left, right), where an empty
            subtree is None: None has depth 0, a single node depth 1."""
        ''', '''
        if node is None:
            return 0
        _, left, right = node
        return 1 + max(tree_depth(left), tree_depth(right))
        ''', '''
        assert tree_depth(None) == 0
        assert tree_depth((1, None, None)) == 1
        assert tree_depth((1, (2, (3, None, None), None), (4, None, None))) == 3
        '''),
    _task("rec/stairs", "count_climbs", '''
        def count_climbs(n: int, steps: tuple[int, ...] = (1, 2)) -> int:
            """In how many ordered ways can one climb n stairs taking, each time, one of the step sizes
            in `steps`? There is one way to climb 0 stairs."""
        ''', '''
        ways = [1] + [0] * n
        for i in range(1, n + 1):
            ways[i] = sum(ways[i - s] for s in steps if s <= i)
        return ways[n]
        ''', '''
        assert count_climbs(4) == 5
        assert count_climbs(0) == 1
        assert count_climbs(4, (1, 3)) == 3
        assert count_climbs(30) == 1346269
        '''),
    _task("rec/islands", "count_islands", '''
        def count_islands(grid: list[str]) -> int:
            """Count the groups of "#" cells in grid (a list of equal-length strings) that touch
            each other up, down, left or right."""
        ''', '''
        seen = set()
        rows, cols = len(grid), len(grid[0]) if grid else 0

        def fill(r: int, c: int) -> None:
            stack = [(r, c)]
            while stack:
                r, c = stack.pop()
                if 0 <= r < rows and 0 <= c < cols and grid[r][c] == "#" and (r, c) not in seen:
                    seen.add((r, c))
                    stack += [(r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)]

        count = 0
        for r in range(rows):
            for c in range(cols):
                if grid[r][c] == "#" and (r, c) not in seen:
                    count += 1
                    fill(r, c)
        return count
        ''', '''
        assert count_islands(["##..", "#...", "..##", "...#"]) == 2
        assert count_islands(["#.#", ".#.", "#.#"]) == 5
        assert count_islands(["...", "..."]) == 0
        assert count_islands([]) == 0
        '''),
    # ---- matrices ----------------------------------------------------------------------------
    _task("grid/transpose", "transpose", '''
        def transpose(matrix: list[list[int]]) -> list[list[int]]:
            """The transpose of a rectangular matrix given as a list of rows ([] stays [])."""
        ''', '''
        return [list(col) for col in zip(*matrix)]
        ''', '''
        assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]
        assert transpose([[7]]) == [[7]]
        assert transpose([]) == []
        '''),
    _task("grid/spiral", "spiral", '''
        def spiral(matrix: list[list[int]]) -> list[int]:
            """The elements of a rectangular matrix in clockwise spiral order, starting top left."""
        ''', '''
        out = []
        m = [row[:] for row in matrix]
        while m:
            out += m.pop(0)
            m = [list(r) for r in zip(*m)][::-1]
        return out
        ''', '''
        assert spiral([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]
        assert spiral([[1, 2], [3, 4], [5, 6]]) == [1, 2, 4, 6, 5, 3]
        assert spiral([[1]]) == [1]
        assert spiral([]) == []
        '''),
    _task("grid/diagonal_sum", "diagonal_sums", '''
        def diagonal_sums(matrix: list[list[int]]) -> tuple[int, int]:
            """(sum of the main diagonal, sum of the anti-diagonal) of a square matrix."""
        ''', '''
        n = len(matrix)
        return (sum(matrix[i][i] for i in range(n)), sum(matrix[i][n - 1 - i] for i in range(n)))
        ''', '''
        assert diagonal_sums([[1, 2], [3, 4]]) == (5, 5)
        assert diagonal_sums([[1, 2, 3], [4, 5, 6], [7, 8, 10]]) == (16, 15)
        assert diagonal_sums([]) == (0, 0)
        '''),
]
