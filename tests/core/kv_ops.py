"""The KV cache manager's verbs as the KV tests use them: admission by request id and tokens.

One thin adapter, so that the tests (and the shadow model in test_kv_cache_model.py) say what
they check, not how the manager's signatures look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from heddle.core.kv_cache import KVBlock, KVCacheManager

_HASHES: dict[tuple[int, str], list[Any]] = {}


def lookup(
    kv: KVCacheManager, request_id: str, tokens: Sequence[int], salt: str | None = None
) -> list[KVBlock]:
    """The cached blocks a new request with these tokens would share (longest prefix)."""
    blocks, hashes = kv.find_cached_prefix(tokens, salt)
    _HASHES[(id(kv), request_id)] = hashes
    return blocks


def allocate(
    kv: KVCacheManager,
    request_id: str,
    num_tokens: int,
    hits: Sequence[KVBlock] = (),
    *,
    tokens: Sequence[int] | None = None,
    salt: str | None = None,
) -> bool:
    """Cover `num_tokens` tokens (sharing `hits`, from `lookup`, on first allocation)."""
    hashes = _HASHES.pop((id(kv), request_id), []) if hits else []
    return kv.allocate_slots(request_id, num_tokens, hits, hashes, salt)


def commit(kv: KVCacheManager, request_id: str, tokens: Sequence[int], num_computed: int) -> None:
    """The request's first `num_computed` tokens now have KV: register its full blocks."""
    kv.commit_computed(request_id, tokens, num_computed)


def free(kv: KVCacheManager, request_id: str) -> None:
    kv.free(request_id)


def table(kv: KVCacheManager, request_id: str) -> list[int]:
    return list(kv.block_ids(request_id))


def num_blocks(kv: KVCacheManager, request_id: str) -> int:
    return kv.num_request_blocks(request_id)


def computed(num_computed: Mapping[str, int]) -> Any:
    """What `check_integrity` takes to know each running request's computed tokens."""
    return dict(num_computed)
