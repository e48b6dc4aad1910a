"""The tokenizer: a `tokenizers.Tokenizer` plus special ids and the model's chat template.

Built from GGUF metadata (`heddle.model.gguf_loader`) or from a Hugging Face directory
(`Tokenizer.from_hf_dir`). Encoding and decoding agree with transformers' tokenizer for the
same files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as BackendTokenizer

from heddle.errors import InvalidRequestError, ModelLoadError


class Tokenizer:
    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        chat_template: str | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self._backend = backend
        self._bos_token_id = bos_token_id
        self._eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.chat_template = chat_template
        self._compiled_template: jinja2.Template | None = None
        added = backend.get_added_tokens_decoder()
        self._special_ids = sorted(i for i, token in added.items() if token.special)
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        """Load `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`) from a dir."""
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ModelLoadError(f"{path} has no tokenizer.json")
        try:
            backend = BackendTokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise ModelLoadError(f"cannot read {tokenizer_file}: {_first_line(e)}") from e
        config = _read_json(path / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        template_file = path / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        bos = _token_id(backend, config.get("bos_token"))
        eos = _token_id(backend, config.get("eos_token"))
        if eos is None:  # fall back to the model's generation config, then its config
            for name in ("generation_config.json", "config.json"):
                eos_value = _read_json(path / name).get("eos_token_id")
                if isinstance(eos_value, list):
                    eos_value = eos_value[0] if eos_value else None
                if isinstance(eos_value, int):
                    eos = eos_value
                    break
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            chat_template=template,
            pad_token_id=_token_id(backend, config.get("pad_token")),
        )

    # -- the public surface ------------------------------------------------------------------

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self._vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of all special (control) tokens: bos, eos, and the rest of the added specials."""
        return list(self._special_ids)

    @property
    def backend(self) -> BackendTokenizer:
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` with the model's own chat template (jinja2, sandboxed, as HF does)."""
        if self.chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; use a plain prompt", "messages"
            )
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self.chat_template)
        context = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self._token_text(self._bos_token_id),
            "eos_token": self._token_text(self._eos_token_id),
            **kwargs,
        }
        try:
            return self._compiled_template.render(**context)
        except jinja2.TemplateError as e:
            raise InvalidRequestError(f"chat template error: {_first_line(e)}", "messages") from e

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None:
            return ""
        return self._backend.id_to_token(token_id) or ""


def _compile_template(source: str) -> jinja2.Template:
    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ModelLoadError(f"the model's chat template does not compile: {_first_line(e)}") from e


def _token_id(backend: BackendTokenizer, token: object) -> int | None:
    """Id of a special token given as a string or as an AddedToken dict {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    return backend.token_to_id(token)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {_first_line(e)}") from e
    return data if isinstance(data, dict) else {}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
