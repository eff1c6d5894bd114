"""Content keys of KV blocks (client/cachemesh_client/kvkeys.py): a chain over the model identity and the
token ids, the same for any split of a prompt into calls, different for any other model, block size,
namespace or token, and full blocks only."""

from __future__ import annotations

import pytest
from cachemesh_client.kvkeys import (
    KEY_PREFIX,
    block_keys,
    chain_digests,
    digest_of,
    key_of,
    root_digest,
)


def test_a_chain_split_anywhere_gives_the_same_keys() -> None:
    tokens = list(range(1000, 1000 + 4 * 16 + 3))
    whole = block_keys(tokens, model="m", block_size=16)
    assert len(whole) == 4 and all(k.startswith(KEY_PREFIX) for k in whole)
    head = chain_digests(tokens[:32], 16, parent=root_digest("m", 16))
    tail = chain_digests(tokens[32:], 16, parent=head[-1])
    assert [key_of(d) for d in head + tail] == whole
    assert [digest_of(k) for k in whole] == head + tail


@pytest.mark.parametrize(
    "other",
    [
        {"model": "m2"},
        {"block_size": 8},
        {"namespace": "lora-a"},
    ],
)
def test_the_identity_is_in_every_key(other: dict[str, object]) -> None:
    tokens = list(range(64))
    base = block_keys(tokens, model="m", block_size=16)
    args: dict[str, object] = {"model": "m", "block_size": 16, **other}
    changed = block_keys(tokens, **args)  # type: ignore[arg-type]
    assert not set(base) & set(changed)


def test_a_token_changes_its_block_and_every_block_after_it() -> None:
    tokens = list(range(64))
    base = block_keys(tokens, model="m", block_size=16)
    edited = block_keys([*tokens[:20], 999, *tokens[21:]], model="m", block_size=16)
    assert edited[0] == base[0] and all(a != b for a, b in zip(edited[1:], base[1:], strict=True))


def test_partial_blocks_have_no_key_and_max_blocks_stops_early() -> None:
    assert block_keys(list(range(15)), model="m", block_size=16) == []
    assert len(block_keys(list(range(100)), model="m", block_size=16, max_blocks=2)) == 2


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5])
def test_token_ids_outside_uint32_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="integers in"):
        block_keys([0, bad], model="m", block_size=2)  # type: ignore[list-item]


def test_a_key_without_identity_or_in_another_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="identity"):
        root_digest("", 16)
    with pytest.raises(ValueError, match="positive"):
        root_digest("m", 0)
    with pytest.raises(ValueError, match="not a KV block key"):
        digest_of("entry-1")
