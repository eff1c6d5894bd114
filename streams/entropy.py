"""Shannon entropy, in bits, of the key distribution inside a window (docs/design.md §3.3).

The warmup trigger reads it next to QPS: 2.1 < H < 3.8 bits is the "predictable enough to warm"
band. The sum is taken with `math.fsum` over per-key terms, so the result does not depend on the
order the counts arrive in: the stream (merging partial windows) and an offline pass over the same
events agree to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def shannon_entropy_bits(counts: Iterable[int]) -> float:
    """H = -sum(p_i * log2 p_i) over keys with p_i = c_i / n; 0 for no or one key."""
    positive = [c for c in counts if c > 0]
    if len(positive) < 2:
        return 0.0
    n = sum(positive)
    # H = log2(n) - (1/n) * sum(c * log2 c): one log per key, exact-rounded sum.
    h = math.log2(n) - math.fsum(c * math.log2(c) for c in positive) / n
    return max(0.0, h)
