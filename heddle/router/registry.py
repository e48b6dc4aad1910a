"""Routing policies by name (serve and simulate choose them with --router NAME)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, TypeVar

from heddle.errors import HeddleError
from heddle.router.base import RouterPolicy

P = TypeVar("P", bound=type[RouterPolicy])

_REGISTRY: dict[str, type[RouterPolicy]] = {}


def register(cls: P) -> P:
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two routing policies named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    import heddle.router.policies as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"heddle.router.policies.{module.name}")


def available_routers() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def router_policy_class(name: str) -> type[RouterPolicy]:
    _load_all()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise HeddleError(f"unknown router {name!r}; available: {', '.join(available_routers())}")
    return cls


def make_router_policy(name: str, **options: Any) -> RouterPolicy:
    cls = router_policy_class(name)
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise HeddleError(f"bad options for router {name!r}: {exc}") from exc
