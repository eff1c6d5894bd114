"""Shannon entropy of key counts, in bits (docs/design.md §3.3)."""

from __future__ import annotations

import math
import random

import pytest

from streams.entropy import shannon_entropy_bits


@pytest.mark.parametrize(
    ("counts", "bits"),
    [
        ([], 0.0),
        ([0, 0], 0.0),
        ([7], 0.0),
        ([1, 1], 1.0),
        ([5, 5, 5, 5], 2.0),
        ([1] * 8, 3.0),
        ([1] * 1024, 10.0),
        ([3, 1], 2.0 - 0.75 * math.log2(3)),  # -(3/4 log2 3/4 + 1/4 log2 1/4)
        ([2, 1, 1], 1.5),
        ([10, 0, 10], 1.0),
    ],
)
def test_entropy_table(counts: list[int], bits: float) -> None:
    assert shannon_entropy_bits(counts) == pytest.approx(bits, abs=1e-12)


def test_entropy_does_not_depend_on_the_order_counts_arrive_in() -> None:
    rng = random.Random(3)
    counts = [rng.randint(1, 500) for _ in range(2_000)]
    first = shannon_entropy_bits(counts)
    for _ in range(5):
        rng.shuffle(counts)
        assert shannon_entropy_bits(counts) == first  # bit for bit, not approximately


def test_entropy_is_bounded_by_log2_of_the_number_of_keys() -> None:
    rng = random.Random(4)
    for n in (2, 3, 17, 300):
        counts = [rng.randint(1, 50) for _ in range(n)]
        assert 0.0 <= shannon_entropy_bits(counts) <= math.log2(n) + 1e-12
