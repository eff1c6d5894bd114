"""Frequency estimation for TinyLFU admission: a 4-bit count-min sketch with aging and a doorkeeper.

Reference: Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM ToS
2017 (doorkeeper §3.4.2, reset §3.3), and Caffeine's `FrequencySketch`. Parameters: depth 4,
16 counters per cached entry in total (as Caffeine), 4-bit counters (max 15), aging every
`sample_factor * capacity` (10x) increments halves every counter and clears the doorkeeper.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np

_M64 = (1 << 64) - 1
_DEPTH = 4
POSITIONS_CACHED = 1024


def key_digest(key: Hashable) -> int:
    """A key as 64 bits, before mixing: an int as it is (mod 2**64), str and bytes by blake2b (their
    own hash is salted per process), anything else by `hash`."""
    if isinstance(key, int):
        return key & _M64
    if isinstance(key, str | bytes):
        data = key.encode() if isinstance(key, str) else key
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return hash(key) & _M64


def stable_hash(key: Hashable, seed: int = 0) -> int:
    """A 64-bit hash that does not change between processes (str hashing is salted per process)."""
    h = key_digest(key)
    h = ((h ^ (seed * 0x9E3779B97F4A7C15)) * 0xBF58476D1CE4E5B9) & _M64
    h ^= h >> 31
    h = (h * 0x94D049BB133111EB) & _M64
    return h ^ (h >> 29)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class FrequencySketch:
    """Count-min sketch of recent popularity; `frequency` is in [0, 15] (+1 with a doorkeeper)."""

    def __init__(
        self, capacity: int, *, doorkeeper: bool = True, sample_factor: int = 10, seed: int = 0
    ) -> None:
        self.width = _next_pow2(max(16, 4 * capacity))
        self._mask = self.width - 1
        self._table = bytearray(_DEPTH * self.width)
        self.sample_size = max(16, sample_factor * capacity)
        self.additions = 0
        self.resets = 0
        self.seed = seed
        # The doorkeeper is a Bloom filter (2 probes, ~8 bits per sample) in front of the sketch,
        # packed 8 bits a byte.
        self._door_bits = _next_pow2(8 * self.sample_size) if doorkeeper else 0
        self._door = bytearray(max(1, self._door_bits >> 3))
        # Counter and doorkeeper positions of recently seen keys: hashing dominates the cost of a
        # lookup, and a cache asks about the same few keys again and again (one access reads its
        # key several times). Cleared when full; a fixed size, so it costs no memory per entry.
        self._positions: dict[Hashable, tuple[int, int, int, int, int, int]] = {}
        self._positions_max = POSITIONS_CACHED

    def _rows(self, h: int) -> tuple[int, int, int, int]:
        m, w = self._mask, self.width
        if w <= 1 << 16:  # four 16-bit slices of one 64-bit hash are enough
            return (h & m, w + ((h >> 16) & m), 2 * w + ((h >> 32) & m), 3 * w + ((h >> 48) & m))
        g = stable_hash(h ^ 0x5555, self.seed)
        return (h & m, w + ((h >> 32) & m), 2 * w + (g & m), 3 * w + ((g >> 32) & m))

    def _door_slots(self, h: int) -> tuple[int, int]:
        m = self._door_bits - 1
        g = (h * 0x9E3779B97F4A7C15) & _M64  # decorrelate from the row slices
        return (g >> 40) & m, (g >> 13) & m

    def _positions_of(self, key: Hashable) -> tuple[int, int, int, int, int, int]:
        pos = self._positions.get(key)
        if pos is None:
            h = stable_hash(key, self.seed)
            x, y = self._door_slots(h) if self._door_bits else (0, 0)
            pos = (*self._rows(h), x, y)
            if len(self._positions) >= self._positions_max:
                self._positions.clear()
            self._positions[key] = pos
        return pos

    def frequency(self, key: Hashable) -> int:
        a, b, c, d, x, y = self._positions_of(key)
        t = self._table
        f = min(t[a], t[b], t[c], t[d])
        if self._door_bits:
            door = self._door
            if door[x >> 3] >> (x & 7) & 1 and door[y >> 3] >> (y & 7) & 1:
                f += 1
        return f

    def increment(self, key: Hashable) -> None:
        a, b, c, d, x, y = self._positions_of(key)
        if self._door_bits:
            door = self._door
            if not (door[x >> 3] >> (x & 7) & 1 and door[y >> 3] >> (y & 7) & 1):
                # First sighting since the last reset: only the doorkeeper remembers it.
                door[x >> 3] |= 1 << (x & 7)
                door[y >> 3] |= 1 << (y & 7)
                self._tick()
                return
        t = self._table
        for i in (a, b, c, d):
            if t[i] < 15:
                t[i] += 1
        self._tick()

    def _tick(self) -> None:
        self.additions += 1
        if self.additions >= self.sample_size:
            self.reset()

    def state(self) -> tuple[bytes, bytes, int, int]:
        """(counters, doorkeeper, additions, resets): what a compiled core loads."""
        return bytes(self._table), bytes(self._door), self.additions, self.resets

    def reset(self) -> None:
        """Age: halve every counter and clear the doorkeeper."""
        arr = np.frombuffer(self._table, dtype=np.uint8)
        arr >>= 1
        self.additions //= 2
        self.resets += 1
        if self._door_bits:
            self._door[:] = bytes(len(self._door))
