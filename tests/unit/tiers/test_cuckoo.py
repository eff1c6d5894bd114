from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from services.tiers.l1.cuckoo import SLOTS_PER_BUCKET, CuckooFull, CuckooTable, Slot, key_hash, key_hashes

# Small hashes repeat (so deletes and lookups hit); large ones spread over the buckets.
KEY = st.one_of(st.integers(1, 48), st.integers(1, 2**64 - 1))
OP = st.tuples(st.sampled_from(["put", "put", "delete", "get"]), KEY, st.integers(0, 10**6))


def check_invariants(table: CuckooTable, oracle: dict[int, Slot]) -> None:
    assert len(table) == len(oracle)
    assert dict(table.items()) == oracle
    for kh in oracle:
        b1, b2, stashed = table.locations(kh)
        assert stashed or table.bucket_of(kh) in (b1, b2)
    assert table.stash_len <= table.stash_size


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(OP, min_size=30, max_size=250),
    n_buckets=st.sampled_from([1, 2, 4, 8]),
    stash_size=st.integers(0, 3),
    max_kicks=st.sampled_from([0, 1, 8, 64]),
)
def test_matches_dict_oracle(ops, n_buckets: int, stash_size: int, max_kicks: int) -> None:
    table = CuckooTable(n_buckets, stash_size=stash_size, max_kicks=max_kicks, seed=1)
    oracle: dict[int, Slot] = {}
    for kind, kh, v in ops:
        if kind == "put":
            slot = Slot(v, v + 1, v - 1)
            try:
                table.put(kh, *slot)
            except CuckooFull:
                event("full")
                assert kh not in oracle  # overwriting a present key never needs room
                assert table.stash_len == stash_size  # the stash is the last resort
                if max_kicks == 0:  # no walk: both candidate buckets must be full
                    b1, b2 = table.buckets(kh)
                    assert (
                        sum(table.bucket_of(k) in (b1, b2) for k in oracle)
                        == len({b1, b2}) * SLOTS_PER_BUCKET
                    )
                check_invariants(table, oracle)  # a failed put leaves the table untouched
                continue
            oracle[kh] = slot
        elif kind == "delete":
            assert table.delete(kh) == (oracle.pop(kh, None) is not None)
        else:
            assert table.get(kh) == oracle.get(kh)
        if table.stash_len:
            event("stash used")
    check_invariants(table, oracle)
    probe = np.array(list(oracle) + [kh for _, kh, _ in ops if kh not in oracle] or [1], dtype=np.uint64)
    found, desc, vref, vrow = table.get_many(probe)
    for i, kh in enumerate(probe.tolist()):
        want = oracle.get(kh)
        assert bool(found[i]) == (want is not None)
        got = Slot(int(desc[i]), int(vref[i]), int(vrow[i]))
        assert got == (want or Slot(-1, -1, -1))


def test_stash_takes_the_homeless_and_gives_it_back() -> None:
    # One bucket: both hash functions land there, so the fifth key can only go to the stash.
    table = CuckooTable(1, stash_size=2, max_kicks=4)
    for kh in range(1, 6):
        table.put(kh, kh, kh, kh)
    assert table.stash_len == 1
    stashed = [kh for kh in range(1, 6) if table.locations(kh)[2]]
    assert len(stashed) == 1
    assert table.get(stashed[0]) == Slot(stashed[0], stashed[0], stashed[0])
    bucketed = next(kh for kh in range(1, 6) if kh not in stashed)
    table.delete(bucketed)
    # The freed bucket slot pulls the stashed item back in: the stash is empty again.
    assert table.stash_len == 0
    assert table.get(stashed[0]) is not None
    assert len(table) == 4


def test_full_table_raises_and_rolls_back() -> None:
    table = CuckooTable(2, stash_size=1, max_kicks=16)
    inserted = []
    kh = 0
    with pytest.raises(CuckooFull, match="stash"):
        while True:
            kh += 1
            before = dict(table.items())
            table.put(kh * 0x9E3779B97F4A7C15 % 2**64 or 1, kh, kh, kh)
            inserted.append(kh)
    assert dict(table.items()) == before
    assert len(table) == len(before) == 2 * SLOTS_PER_BUCKET + 1
    # Overwrites still work when full; a delete makes room again.
    some = next(iter(before))
    table.put(some, 7, 7, 7)
    assert table.get(some) == Slot(7, 7, 7)
    table.delete(some)
    table.put(some, 8, 8, 8)
    assert table.get(some) == Slot(8, 8, 8)


def test_large_table_vectorised_lookup_agrees_with_scalar() -> None:
    keys = [f"prompt-{i}" for i in range(5000)]
    table = CuckooTable.for_capacity(len(keys))
    for i, key in enumerate(keys):
        table.put(key_hash(key), i, i + 10, -1 if i % 2 else i)
    assert table.load_factor <= 0.85
    khs = key_hashes([*keys, "absent-1", "absent-2"])
    found, desc, vref, vrow = table.get_many(khs)
    assert found[:-2].all() and not found[-2:].any()
    np.testing.assert_array_equal(desc[:-2], np.arange(5000))
    np.testing.assert_array_equal(vref[:-2], np.arange(5000) + 10)
    assert table.get(int(khs[123])) == Slot(int(desc[123]), int(vref[123]), int(vrow[123]))


def test_resized_keeps_every_item() -> None:
    table = CuckooTable(4)
    for kh in range(1, 14):
        table.put(kh, kh, 0, -1)
    bigger = table.resized(64)
    assert dict(bigger.items()) == dict(table.items())
    assert bigger.n_buckets == 64


def test_two_buckets_differ_and_are_symmetric() -> None:
    table = CuckooTable(1024)
    for kh in [1, 2, 3, 2**63, 2**64 - 1, key_hash("x")]:
        b1, b2 = table.buckets(kh)
        assert b1 != b2
        bb1, bb2 = table.buckets_many(np.array([kh], dtype=np.uint64))
        assert (int(bb1[0]), int(bb2[0])) == (b1, b2)


@pytest.mark.parametrize("bad", [0, -1, 2**64])
def test_key_hash_must_be_nonzero_uint64(bad: int) -> None:
    with pytest.raises(ValueError, match="nonzero uint64"):
        CuckooTable(4).put(bad, 0, 0)


def test_key_hash_is_stable_and_nonzero() -> None:
    assert key_hash("model:llama:v1:abc") == key_hash(b"model:llama:v1:abc")
    assert key_hash("model:llama:v1:abc") == 0xFA3E158C33FD3BAC  # blake2b-64: same in every process
    assert key_hashes(["a", "b"]).dtype == np.uint64


@pytest.mark.parametrize("n_buckets", [0, 3, 12])
def test_bucket_count_is_a_power_of_two(n_buckets: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        CuckooTable(n_buckets)
