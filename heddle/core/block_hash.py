"""Block hashes of the prefix cache: SHA-256, chained from the root of a request's prefix.

A prefix-cache lookup trusts the hash: it does not compare tokens. Two different prefixes with
one hash would share KV, so a crafted prompt could be served another tenant's cache (vLLM's
CVE-2025-25183 was this flaw with Python's built-in `hash()`). With SHA-256, finding a
collision is infeasible, so equal hashes mean equal prefixes: the same namespace (model),
the same cache salt and the same token ids, block by block from the start.

Why a cryptographic hash rather than comparing tokens on a hit: comparing would keep the
tokens of every cached block in memory and cost a comparison per hit, and it would still
let a cheap hash's collisions evict or shadow blocks. SHA-256 over ~8 x block_size bytes is
computed once per full block (each request's hashes are kept with the request), which is a
microsecond or two per block_size tokens (measured in benchmarks/engine_overhead.py).

Encoding, chosen so that different inputs never encode alike:
- root = SHA-256("heddle-kv-v1" NUL namespace NUL salt-flag salt), salt-flag "0" or "1";
- block = SHA-256(parent digest (32 bytes) || token ids as little-endian int64), always
  `block_size` tokens (only full blocks are hashed), so the token part has a fixed width.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BLOCK_HASH_ALGORITHM = "sha256"
BLOCK_HASH_VERSION = b"heddle-kv-v1"
BlockHash = bytes  # a 32-byte SHA-256 digest

_sha256 = hashlib.sha256
_PACKERS: dict[int, struct.Struct] = {}


def root_hash(namespace: str = "", cache_salt: str | None = None) -> BlockHash:
    """The hash a request's chain starts from: what, besides the tokens, changes the KV.

    `namespace` names the model (and anything else that makes one engine's KV differ from
    another's); `cache_salt` separates tenants that must never share cache entries.
    """
    salt = b"0" if cache_salt is None else b"1" + cache_salt.encode()
    return _sha256(BLOCK_HASH_VERSION + b"\0" + namespace.encode() + b"\0" + salt).digest()


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The hash of one full block chained to its parent's."""
    packer = _PACKERS.get(len(token_ids))
    if packer is None:
        packer = _PACKERS.setdefault(len(token_ids), struct.Struct(f"<{len(token_ids)}q"))
    return _sha256(parent + packer.pack(*token_ids)).digest()


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    namespace: str = "",
    cache_salt: str | None = None,
) -> list[BlockHash]:
    """The chained hashes of every full block of `token_ids` (a router can predict hits)."""
    parent = root_hash(namespace, cache_salt)
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out
