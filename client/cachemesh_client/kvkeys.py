"""Content keys of KV blocks: what the bridge, the vLLM connector, the gateway and the tiers call a block,
so that two engine processes agree on it (vLLM's own block hashes are per process: salted, and int or
bytes by a setting). Pure, standard library only.

A block is `block_size` token ids. Its key chains a digest of everything before it, the way a paged KV
block depends on every token before it:

    root     = blake2b("cachemesh-kv-v1" | model | block_size | namespace)
    digest_i = blake2b(digest_{i-1} | token ids of block i as little-endian uint32)
    key_i    = "kv:" + hex(digest_i)

The model identity (what is served, at which block size; `namespace` for a LoRA adapter, a salt a
tenant shares, or a model revision) is in the root, so a block of another model or block size can never
be taken for this one: a mismatch is a miss. Only full blocks have keys, as only full blocks are cached.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

KEY_PREFIX = "kv:"
DIGEST_BYTES = 16
_VERSION = b"cachemesh-kv-v1"


def root_digest(model: str, block_size: int, namespace: str = "") -> bytes:
    """The digest every chain of this model identity starts from."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if not model:
        raise ValueError("a block key needs the model's identity")
    material = b"\x00".join((_VERSION, model.encode(), str(block_size).encode(), namespace.encode()))
    return hashlib.blake2b(material, digest_size=DIGEST_BYTES).digest()


def next_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of one block after `parent`'s (ValueError on a token id outside uint32)."""
    try:
        packed = struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        raise ValueError("token ids must be integers in [0, 2**32)") from None
    return hashlib.blake2b(parent + packed, digest_size=DIGEST_BYTES).digest()


def key_of(digest: bytes) -> str:
    return KEY_PREFIX + digest.hex()


def digest_of(key: str) -> bytes:
    """The digest a key names (ValueError when it is not a block key)."""
    if not key.startswith(KEY_PREFIX) or len(key) != len(KEY_PREFIX) + 2 * DIGEST_BYTES:
        raise ValueError(f"{key!r} is not a KV block key")
    return bytes.fromhex(key[len(KEY_PREFIX) :])


def chain_digests(
    token_ids: Sequence[int], block_size: int, *, parent: bytes, max_blocks: int | None = None
) -> list[bytes]:
    """Digests of the full blocks of `token_ids` following `parent` (a root or a block's digest)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out = []
    digest = parent
    for i in range(n):
        digest = next_digest(digest, token_ids[i * block_size : (i + 1) * block_size])
        out.append(digest)
    return out


def block_keys(
    token_ids: Sequence[int],
    *,
    model: str,
    block_size: int,
    namespace: str = "",
    max_blocks: int | None = None,
) -> list[str]:
    """The keys of a prompt's full blocks, first to last (a trailing partial block has none)."""
    root = root_digest(model, block_size, namespace)
    return [key_of(d) for d in chain_digests(token_ids, block_size, parent=root, max_blocks=max_blocks)]
