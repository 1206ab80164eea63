"""What a request's output must match: a JSON schema, any JSON object, a regular expression, one of
a list of choices, or a grammar (vLLM's names for them).

    SamplingParams(structured_outputs=StructuredOutputs(json={"type": "object", ...}))
    SamplingParams(structured_outputs={"choice": ["yes", "no"]})

The spec is parsed by the grammar library (xgrammar) when SamplingParams is made, without a
tokenizer, so a bad schema, an unsupported keyword or a regex that does not compile is a
ValueError before the request enters the engine. The engine compiles it against its tokenizer
(engine/grammar.py) and masks every row that chooses one of the request's tokens.
"""
from __future__ import annotations

import json as json_module
import re
from dataclasses import dataclass, fields
from typing import Any

MAX_CHOICES = 1024

# JSON Schema keywords the grammar enforces, and those that only annotate. xgrammar passes any other
# keyword silently (not, if/then/else, allOf, uniqueItems, ...), which would let an output break the
# schema it was promised to match: those are refused instead.
ENFORCED_KEYWORDS = frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "nullable",
    "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
    "minProperties", "maxProperties", "unevaluatedProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "pattern", "minLength", "maxLength", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly"})
ENFORCED_FORMATS = frozenset({"date", "date-time", "email", "uuid", "uri", "ipv4", "hostname"})
_SUBSCHEMA = ("additionalProperties", "propertyNames", "unevaluatedProperties", "items")  # one schema
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def unsupported_keywords(schema: Any, path: str = "#") -> list[str]:
    """Where a schema uses a keyword the grammar would not enforce ('#/properties/a: uniqueItems')."""
    if not isinstance(schema, dict):
        return []
    found = [f"{path}: {k}" for k in schema if k not in ENFORCED_KEYWORDS and k not in ANNOTATIONS]
    if "format" in schema and schema["format"] not in ENFORCED_FORMATS:
        found.append(f"{path}: format {schema['format']!r} (enforced: {', '.join(sorted(ENFORCED_FORMATS))})")
    for k in _SUBSCHEMA:
        found += unsupported_keywords(schema.get(k), f"{path}/{k}")
    for k in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(k) or []):
            found += unsupported_keywords(sub, f"{path}/{k}/{i}")
    for k in _SUBSCHEMA_MAPS:
        for name, sub in (schema.get(k) or {}).items():
            found += unsupported_keywords(sub, f"{path}/{k}/{name}")
    return found


@dataclass(frozen=True)
class StructuredOutputs:
    """Exactly one of: `json` (a JSON schema, as a dict or its text), `json_object` (any JSON
    object), `regex`, `choice` (the output is one of these strings) or `grammar` (EBNF, as
    xgrammar reads it: `root ::= ...`). JSON comes out compact (no free whitespace): a small
    model offered unlimited spaces may spend its whole budget on them."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.choice is not None and not isinstance(self.choice, tuple):
            if isinstance(self.choice, str) or not isinstance(self.choice, (list, tuple)):
                raise ValueError(f"structured_outputs.choice must be a list of strings, got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, str):  # a schema given as text: parsed once, here
            try:
                object.__setattr__(self, "json", json_module.loads(self.json))
            except json_module.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> "StructuredOutputs":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"structured_outputs: unknown field(s) {unknown}; expected one of {sorted(known)}")
        return cls(**spec)

    @property
    def kind(self) -> str:
        set_ = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(set_) != 1:
            raise ValueError(f"structured_outputs needs exactly one of json, json_object, regex, choice, grammar; "
                             f"got {set_ or 'none'}")
        return set_[0]

    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal specs share one compiled grammar (engine/grammar.py's cache)."""
        kind = self.kind
        if kind == "json":
            return kind, json_module.dumps(self.json, sort_keys=True, separators=(",", ":"))
        if kind == "choice":
            return kind, json_module.dumps(list(self.choice))
        if kind == "json_object":
            return kind, ""
        return kind, getattr(self, kind)

    def validate(self) -> None:
        """Parse the spec with the grammar library (no tokenizer needed): ValueError on anything it refuses."""
        if self.__dict__.get("_valid"):  # SamplingParams validates again when the engine takes the request
            return
        kind = self.kind
        if kind == "json":
            if not isinstance(self.json, dict):
                raise ValueError(f"structured_outputs.json must be a JSON schema object, got {type(self.json).__name__}")
            unsupported = unsupported_keywords(self.json)
            if unsupported:
                raise ValueError(f"structured_outputs.json uses keywords the grammar cannot enforce: "
                                 f"{'; '.join(unsupported[:5])}")
        if kind == "choice":
            if not self.choice:
                raise ValueError("structured_outputs.choice must list at least one choice")
            if len(self.choice) > MAX_CHOICES:
                raise ValueError(f"structured_outputs.choice lists {len(self.choice)} choices; at most {MAX_CHOICES}")
            if any(not isinstance(c, str) or not c for c in self.choice):
                raise ValueError("structured_outputs.choice must hold non-empty strings")
        if kind in ("regex", "grammar") and not (isinstance(getattr(self, kind), str) and getattr(self, kind)):
            raise ValueError(f"structured_outputs.{kind} must be a non-empty string")
        try:
            self.to_grammar()
        except ImportError:
            raise ValueError("structured outputs need the xgrammar package: pip install xgrammar") from None
        except Exception as e:  # xgrammar's parse errors are RuntimeErrors with its own message
            raise ValueError(f"structured_outputs.{kind} was refused by the grammar compiler: "
                             f"{library_message(e)}") from None
        object.__setattr__(self, "_valid", True)

    def to_grammar(self):
        """The spec as an xgrammar.Grammar (tokenizer-free; engine/grammar.py compiles it for a vocabulary)."""
        import xgrammar as xgr

        kind = self.kind
        if kind == "json":
            return xgr.Grammar.from_json_schema(json_module.dumps(self.json), any_whitespace=False)
        if kind == "json_object":
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
        if kind == "regex":
            return xgr.Grammar.from_regex(self.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json_module.dumps(c, ensure_ascii=False)
                                                                    for c in self.choice))
        return xgr.Grammar.from_ebnf(self.grammar)


def library_message(e: BaseException) -> str:
    """The grammar library's first line, without its C++ source location ('[12:00:00] /x.cc:12: ')."""
    line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[0-9:]+\] \S+:[0-9]+: ", "", line)
