"""The KV cache manager's verbs as the KV tests use them: admission by request id and tokens.

One thin adapter, so that the tests (and the shadow model in test_kv_cache_model.py) say what
they check, not how the manager's signatures look. The manager works on the scheduler's
`Request` objects; here each request id gets one, holding the tokens the test gives it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence

from heddle.core.kv_cache import KVBlock, KVCacheManager
from heddle.request import Request, SamplingParams

_REQUESTS: weakref.WeakKeyDictionary[KVCacheManager, dict[str, Request]] = (
    weakref.WeakKeyDictionary()
)


def request(
    kv: KVCacheManager,
    request_id: str,
    tokens: Sequence[int] | None = None,
    salt: str | None = None,
) -> Request:
    """The request behind `request_id` (made on first use, with `tokens` if given)."""
    requests = _REQUESTS.setdefault(kv, {})
    existing = requests.get(request_id)
    if existing is None:
        existing = requests[request_id] = Request(
            request_id, list(tokens or [0]), SamplingParams(), 0.0, cache_salt=salt
        )
    elif tokens is not None and len(tokens) > existing.num_tokens:
        existing.all_token_ids = list(tokens)
    return existing


def lookup(
    kv: KVCacheManager, request_id: str, tokens: Sequence[int], salt: str | None = None
) -> list[KVBlock]:
    """The cached blocks a new request with these tokens would share (longest prefix)."""
    return kv.find_cached_prefix(request(kv, request_id, tokens, salt))


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
    req = request(kv, request_id, tokens, salt)
    if hits:
        req.num_computed_tokens = len(hits) * kv.block_size
    return kv.allocate_slots(req, num_tokens, hits)


def commit(kv: KVCacheManager, request_id: str, tokens: Sequence[int], num_computed: int) -> None:
    """The request's first `num_computed` tokens now have KV: register its full blocks."""
    req = request(kv, request_id, tokens)
    req.num_computed_tokens = num_computed
    kv.commit_computed(req)


def free(kv: KVCacheManager, request_id: str) -> None:
    req = _REQUESTS.get(kv, {}).pop(request_id, None)
    if req is not None:
        kv.free(req)


def table(kv: KVCacheManager, request_id: str) -> list[int]:
    return list(kv.block_ids(request_id))


def num_blocks(kv: KVCacheManager, request_id: str) -> int:
    return kv.num_request_blocks(request_id)


def computed(kv: KVCacheManager, num_computed: Mapping[str, int]) -> list[Request]:
    """The running requests `check_integrity` takes, with these computed counts."""
    running = []
    for request_id, count in num_computed.items():
        req = request(kv, request_id)
        req.num_computed_tokens = count
        running.append(req)
    return running
