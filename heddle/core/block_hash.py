"""Block hashes of the prefix cache: SHA-256 (or, in the simulator, Python's tuple hash),
chained from the root of a request's prefix.

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

`builtin` (the simulator's default, `heddle simulate --block-hash`): the same chain with
Python's 64-bit `hash((parent, *token_ids))`, rooted at the first 8 bytes of the SHA-256 root
as an int: cheaper per block (no packing, no digest object) and deterministic
across processes (ints and tuples of ints are not salted by PYTHONHASHSEED). It is not
collision-resistant, so it is only for the simulator, whose prompts nobody crafts: prefix-cache
decisions depend only on hash equality, and over 10^8 blocks a 64-bit collision has a chance
of about 3 in 10^4 (birthday bound), which the golden test and the report diffs would show.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import cast

BLOCK_HASH_ALGORITHM = "sha256"
BLOCK_HASH_ALGORITHMS = ("sha256", "builtin")
BLOCK_HASH_VERSION = b"heddle-kv-v1"
BlockHash = bytes | int  # a 32-byte SHA-256 digest, or a builtin hash

_sha256 = hashlib.sha256
_PACKERS: dict[int, struct.Struct] = {}


def root_hash(
    namespace: str = "", cache_salt: str | None = None, algorithm: str = "sha256"
) -> BlockHash:
    """The hash a request's chain starts from: what, besides the tokens, changes the KV.

    `namespace` names the model (and anything else that makes one engine's KV differ from
    another's); `cache_salt` separates tenants that must never share cache entries.
    """
    salt = b"0" if cache_salt is None else b"1" + cache_salt.encode()
    digest = _sha256(BLOCK_HASH_VERSION + b"\0" + namespace.encode() + b"\0" + salt).digest()
    if algorithm == "builtin":
        return int.from_bytes(digest[:8], "little", signed=True)
    if algorithm != "sha256":
        raise ValueError(f"block hash must be one of {BLOCK_HASH_ALGORITHMS}, got {algorithm!r}")
    return digest


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The SHA-256 hash of one full block chained to its parent's.

    `parent` is a SHA-256 digest here (the KV manager binds one algorithm per pool); an int
    parent fails at the `+` with a TypeError, so no runtime check is spent per block.
    """
    packer = _PACKERS.get(len(token_ids))
    if packer is None:
        packer = _PACKERS.setdefault(len(token_ids), struct.Struct(f"<{len(token_ids)}q"))
    return _sha256(cast(bytes, parent) + packer.pack(*token_ids)).digest()


def builtin_hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The builtin hash of one full block chained to its parent's (the simulator's)."""
    return hash((parent, *token_ids))


def block_hasher(algorithm: str) -> Callable[[BlockHash, Sequence[int]], BlockHash]:
    """The block hash function of `algorithm` ("sha256" or "builtin")."""
    if algorithm == "sha256":
        return hash_block_tokens
    if algorithm == "builtin":
        return builtin_hash_block_tokens
    raise ValueError(f"block hash must be one of {BLOCK_HASH_ALGORITHMS}, got {algorithm!r}")


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
