"""What a constrained request asks for: plain data, no torch, no grammar library."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any


class GrammarKind(enum.Enum):
    JSON_OBJECT = "json_object"  # any JSON object (response_format json_object)
    JSON_SCHEMA = "json_schema"  # JSON valid under a schema (response_format json_schema)
    STRUCTURAL_TAG = "structural_tag"  # an xgrammar structural tag (forced tool calls)


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """A grammar by value: equal specs compile to the same grammar (the cache key).

    `source` is compact JSON with the keys in the order given: the same schema written with
    its properties in another order is another grammar (the output follows that order)."""

    kind: GrammarKind
    source: str = ""  # canonical JSON text of the schema or the structural tag

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls(GrammarKind.JSON_OBJECT)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> GrammarSpec:
        return cls(GrammarKind.JSON_SCHEMA, _canonical(schema))

    @classmethod
    def structural_tag(cls, fmt: dict[str, Any]) -> GrammarSpec:
        tag = {"type": "structural_tag", "format": fmt}
        return cls(GrammarKind.STRUCTURAL_TAG, _canonical(tag))


def _canonical(value: Any) -> str:
    # Keys keep their order: the order of a schema's properties is the order they are written.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
