"""GrammarSpec -> xgrammar CompiledGrammar for one tokenizer, compiled once per spec (LRU cache).

xgrammar (https://github.com/mlc-ai/xgrammar) compiles JSON schemas and structural tags into a
pushdown automaton with a per-token mask cache; its matchers fill token bitmasks in
microseconds and can roll back. It is the default grammar engine of vLLM and SGLang.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

import jsonschema
import xgrammar as xgr

from heddle.errors import InvalidRequestError
from heddle.structured.spec import GrammarKind, GrammarSpec

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept
# A small model left free to pick its whitespace may write it forever: JSON outside a
# structural tag is compact (", " and ": " separators); inside one, runs of whitespace are short.
MAX_WHITESPACE_IN_TAGS = 2
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


def tokenizer_info(tokenizer: Any, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of a heddle Tokenizer (a `tokenizers` backend) with `vocab_size` logits."""
    backend = tokenizer.backend
    encoded = [""] * vocab_size
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if token_id < vocab_size:
            encoded[token_id] = token
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    eos = tokenizer.eos_token_id
    return xgr.TokenizerInfo(
        encoded,
        xgr.VocabType(metadata["vocab_type"]),
        vocab_size=vocab_size,
        stop_token_ids=[eos] if eos is not None else None,
        add_prefix_space=bool(metadata["add_prefix_space"]),
    )


class GrammarCompiler:
    """Compiles specs for one tokenizer; thread-safe; keeps the last `cache_size` grammars."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, *, cache_size: int = DEFAULT_CACHE_SIZE,
        max_threads: int = 2,
    ) -> None:
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size)
        # xgrammar's own cache is off: ours is keyed by spec and bounded by count.
        self._compiler = xgr.GrammarCompiler(
            self.info, max_threads=max_threads, cache_enabled=False
        )
        self._cache: OrderedDict[GrammarSpec, xgr.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses
        self.num_hits = 0

    def compile(self, spec: GrammarSpec, param: str | None = None) -> xgr.CompiledGrammar:
        """The compiled grammar; raises InvalidRequestError (naming `param`) for a bad spec."""
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                self.num_hits += 1
                return compiled
        compiled = self._compile(spec, param)
        with self._lock:
            self.num_compiled += 1
            self._cache[spec] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, spec: GrammarSpec, param: str | None) -> xgr.CompiledGrammar:
        kind = spec.kind
        try:
            if kind is GrammarKind.JSON_OBJECT:
                return self._compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, strict_mode=False
                )
            if kind is GrammarKind.JSON_SCHEMA:
                check_schema(json.loads(spec.source), param)
                return self._compiler.compile_json_schema(spec.source, any_whitespace=False)
            tag = json.loads(spec.source)
            for fmt in _json_formats(tag):
                check_schema(fmt["json_schema"], param)
                fmt.setdefault("max_whitespace_cnt", MAX_WHITESPACE_IN_TAGS)
            return self._compiler.compile_structural_tag(json.dumps(tag))
        except InvalidRequestError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError with C++ context
            raise InvalidRequestError(
                f"the schema cannot be used for structured output: {_message(e)}", param
            ) from e


def check_schema(schema: Any, param: str | None) -> None:
    """A JSON schema that is itself valid (under its declared draft, else 2020-12)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise InvalidRequestError("a JSON schema must be an object or a boolean", param)
    try:
        jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator).check_schema(
            schema
        )
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.path)
        at = f" at {where}" if where else ""
        raise InvalidRequestError(f"invalid JSON schema{at}: {e.message}", param) from e


def _json_formats(value: Any) -> list[dict[str, Any]]:
    """The json_schema formats of a structural tag (not looking inside their schemas)."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if value.get("type") == "json_schema" and "json_schema" in value:
            return [value]
        for item in value.values():
            found.extend(_json_formats(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_json_formats(item))
    return found


def _message(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    return _CPP_PREFIX.sub("", first)
