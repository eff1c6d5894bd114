"""S3-FIFO and SIEVE against hand-worked sequences, a tiny list-based reference model of each (the
papers' pseudo-code read literally), and libCacheSim's implementations where it is installed."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import S3FIFO, SIEVE, Policy

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(policy: Policy, keys: str) -> tuple[str, list[list[Hashable]]]:
    hits, evicted = [], []
    for t, key in enumerate(keys):
        hit, out = policy.access(key, t)
        hits.append("H" if hit else ".")
        evicted.append([e.key for e in out])
    return "".join(hits), evicted


def test_sieve_keeps_a_visited_entry_in_place_and_the_hand_moves_on() -> None:
    sieve = SIEVE(3)
    hits, evicted = run(sieve, "ABCADEAFG")
    assert hits == "...H..H.."
    # D: the hand clears A's bit and takes B; E takes C (the hand stayed there); A is hit again,
    # so F and G take D and E, newer than A, while A, the oldest, stays.
    assert evicted == [[], [], [], [], ["B"], ["C"], [], ["D"], ["E"]]
    assert sieve.queue() == ["A", "F", "G"]
    assert sieve.hand == "F"


def test_sieve_wraps_to_the_tail_past_the_head() -> None:
    sieve = SIEVE(2)
    _, evicted = run(sieve, "ABABC")  # both visited: one full sweep clears them, A goes
    assert evicted[-1] == ["A"]
    _, evicted = run(sieve, "D")  # the hand stopped at B (unvisited now)
    assert evicted == [["B"]]


def test_s3fifo_hand_worked() -> None:
    # Capacity 4: small 1, main 3, ghost 3.
    s3 = S3FIFO(4, small_ratio=0.25)
    hits, evicted = run(s3, "ABCDAAEFBAGCHDGX")
    assert hits == "....HH...H......"
    assert evicted == [
        [], [], [], [], [], [],
        ["B"],  # A (hit twice in small) moves to main, B leaves for the ghost
        ["C"],
        ["D"],  # B is a ghost: it enters main, small pays
        [],
        ["E"],
        ["F"],  # C is a ghost: main [A, B, C]
        ["G"],
        ["H"],  # D fell off the 3-key ghost: into small
        ["D"],  # G is a ghost: main [A, B, C, G] overflows its share
        ["B"],  # main pays now: A (hit once) is reinserted, B (never hit there) leaves
    ]  # fmt: skip
    assert list(s3.main) == ["C", "G", "A"] and list(s3.small) == ["X"]
    assert list(s3.ghost) == ["F", "H", "D"]


def test_s3fifo_frequency_is_two_bits() -> None:
    s3 = S3FIFO(4, small_ratio=0.25)
    run(s3, "AB")
    run(s3, "A" * 10)
    assert s3.small["A"] == 3


def test_s3fifo_fill_main_first_is_libcachesims_warm_up() -> None:
    paper, variant = S3FIFO(4, small_ratio=0.25), S3FIFO(4, small_ratio=0.25, fill_main_first=True)
    run(paper, "AB")
    run(variant, "AB")
    assert list(paper.small) == ["A", "B"] and not paper.main
    assert list(variant.small) == ["A"] and list(variant.main) == ["B"]


class RefSieve:
    """SIEVE as the paper draws it: a list (index 0 the tail), visited bits and a hand index."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.queue: list[list[object]] = []  # [key, visited]
        self.hand: int | None = None

    def access(self, key: object) -> tuple[bool, list[object]]:
        for entry in self.queue:
            if entry[0] == key:
                entry[1] = True
                return True, []
        evicted = []
        if len(self.queue) >= self.capacity:
            i = 0 if self.hand is None else self.hand
            while self.queue[i][1]:
                self.queue[i][1] = False
                i = i + 1 if i + 1 < len(self.queue) else 0
            evicted.append(self.queue.pop(i)[0])
            self.hand = i if i < len(self.queue) else None
        self.queue.append([key, False])
        return False, evicted


class RefS3FIFO:
    """S3-FIFO over plain lists (index 0 the tail), the module's rules spelt out one by one."""

    def __init__(self, capacity: int, small_ratio: float) -> None:
        self.small_max = min(max(1, int(capacity * small_ratio)), max(1, capacity - 1))
        self.main_max = capacity - self.small_max
        self.ghost_max = int(capacity * 0.9)
        self.capacity = capacity
        self.small: list[list[object]] = []
        self.main: list[list[object]] = []
        self.ghost: list[object] = []

    def access(self, key: object) -> tuple[bool, list[object]]:
        for entry in self.small + self.main:
            if entry[0] == key:
                entry[1] = min(int(entry[1]) + 1, 3)  # type: ignore[call-overload]
                return True, []
        was_ghost = key in self.ghost
        if was_ghost:
            self.ghost.remove(key)
        evicted = []
        while len(self.small) + len(self.main) >= self.capacity:
            evicted.append(self.evict())
        (self.main if was_ghost else self.small).append([key, 0])
        return False, evicted

    def evict(self) -> object:
        if len(self.main) <= self.main_max and self.small:
            while self.small:
                key, freq = self.small.pop(0)
                if int(freq) >= 2:  # type: ignore[call-overload]
                    self.main.append([key, 0])
                    continue
                self.ghost.append(key)
                if len(self.ghost) > self.ghost_max:
                    self.ghost.pop(0)
                return key
        while True:
            key, freq = self.main.pop(0)
            if freq:
                self.main.append([key, int(freq) - 1])  # type: ignore[call-overload]
                continue
            return key


sequences = st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=200)


@SETTINGS
@given(seq=sequences, capacity=st.integers(min_value=1, max_value=10))
def test_sieve_matches_the_reference_model(seq: list[int], capacity: int) -> None:
    sieve, ref = SIEVE(capacity), RefSieve(capacity)
    for t, key in enumerate(seq):
        hit, evicted = sieve.access(key, t)
        assert (hit, [e.key for e in evicted]) == ref.access(key)


@SETTINGS
@given(
    seq=sequences,
    capacity=st.integers(min_value=2, max_value=12),
    small_ratio=st.sampled_from([0.1, 0.25, 0.5]),
)
def test_s3fifo_matches_the_reference_model(seq: list[int], capacity: int, small_ratio: float) -> None:
    s3, ref = S3FIFO(capacity, small_ratio=small_ratio), RefS3FIFO(capacity, small_ratio)
    for t, key in enumerate(seq):
        hit, evicted = s3.access(key, t)
        assert (hit, [e.key for e in evicted]) == ref.access(key)


@pytest.mark.parametrize("name", ["sieve", "s3fifo"])
@SETTINGS
@given(
    seq=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=400),
    capacity=st.integers(min_value=20, max_value=40),
)
def test_hit_for_hit_with_libcachesim(name: str, seq: list[int], capacity: int) -> None:
    lcs = pytest.importorskip("libcachesim")
    if name == "sieve":
        ours: Policy = SIEVE(capacity)
        theirs = lcs.Sieve(cache_size=capacity, hashpower=8)
    else:
        # libCacheSim's S3FIFO.c is the warm-up variant; from the first eviction on they agree.
        ours = S3FIFO(capacity, fill_main_first=True)
        theirs = lcs.S3FIFO(cache_size=capacity, hashpower=8)
    req = lcs.Request(obj_size=1)
    for t, key in enumerate(seq):
        req.obj_id = key
        assert ours.access(key, t)[0] == theirs.get(req), f"access {t} of {seq[: t + 1]}"
