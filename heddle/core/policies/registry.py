"""Policies are chosen by name everywhere (serve, bench, simulate)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, TypeVar

from heddle.core.policies.base import Policy
from heddle.errors import HeddleError

P = TypeVar("P", bound=type[Policy])

_REGISTRY: dict[str, type[Policy]] = {}


def register(cls: P) -> P:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two policies named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    import heddle.core.policies as package

    for module in pkgutil.iter_modules(package.__path__):
        if module.name not in ("base", "registry"):
            importlib.import_module(f"heddle.core.policies.{module.name}")


def available_policies() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    _load_all()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise HeddleError(f"unknown policy {name!r}; available: {', '.join(available_policies())}")
    return cls


def make_policy(name: str, **options: Any) -> Policy:
    cls = policy_class(name)
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise HeddleError(f"bad options for policy {name!r}: {exc}") from exc
