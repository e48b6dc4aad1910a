"""The live-server helper skips only when the embedded model is missing (fast, no model)."""

from __future__ import annotations

import importlib.util

import pytest

from heddle.model import registry
from tests.server import live


def test_a_missing_embedded_model_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        live.require_embedded_model()


def test_any_other_error_locating_the_model_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise PermissionError("cannot read the site-packages directory")

    monkeypatch.setattr(registry, "default_model_path", broken)
    try:
        live.require_embedded_model()
    except pytest.skip.Exception:
        pytest.fail("a broken model lookup skipped the live tests instead of failing them")
    except PermissionError:
        return
    pytest.fail("the error was swallowed")
