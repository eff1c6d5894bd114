"""Bucketized cuckoo hash table for L1 exact keys (docs/design.md §1.1), slots held in flat numpy columns.

Two hash functions in partial-key form (b2 = b1 ^ offset(key), so either bucket finds the other),
4-slot buckets, insertion by a bounded random walk of at most `max_kicks` displacements that is undone
whole if it fails, and a small stash for the item left homeless (Kirsch, Mitzenmacher & Wieder,
"More robust hashing: cuckoo hashing with a stash", 2009). Keys are nonzero 64-bit key hashes (0 marks
an empty slot); each slot carries a descriptor slot, a value reference and a vector row (-1: none).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

SLOTS_PER_BUCKET = 4
EMPTY = 0
_M64 = 0xFFFFFFFFFFFFFFFF
_MIX = 0xD6E8FEB86659FD93  # odd multiplier (splitmix-style finaliser)
# A bucketized 4-way cuckoo table fills to ~95% before walks start failing; stay well below.
DEFAULT_MAX_LOAD = 0.85


class CuckooFull(RuntimeError):
    """No slot within `max_kicks` displacements and the stash is full; the table is unchanged."""


class Slot(NamedTuple):
    desc: int
    vref: int
    vrow: int


def key_hash(key: str | bytes) -> int:
    """Deterministic nonzero 64-bit hash of a key (blake2b), stable across processes."""
    raw = key.encode() if isinstance(key, str) else key
    h = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
    return h or 1


def key_hashes(keys: list[str] | list[bytes]) -> np.ndarray:
    return np.fromiter((key_hash(k) for k in keys), dtype=np.uint64, count=len(keys))


class CuckooTable:
    """Map nonzero uint64 key hashes to (desc, vref, vrow) slots.

    `n_buckets` must be a power of two. Single-key calls take Python ints; `get_many` is vectorised.
    """

    def __init__(self, n_buckets: int, *, stash_size: int = 8, max_kicks: int = 128, seed: int = 0) -> None:
        if n_buckets < 1 or n_buckets & (n_buckets - 1):
            raise ValueError(f"n_buckets must be a power of two, got {n_buckets}")
        if stash_size < 0 or max_kicks < 0:
            raise ValueError("stash_size and max_kicks must be >= 0")
        self.n_buckets = n_buckets
        self.stash_size = stash_size
        self.max_kicks = max_kicks
        self._mask = n_buckets - 1
        self._stash_base = n_buckets * SLOTS_PER_BUCKET
        n = self._stash_base + stash_size
        # One flat column per field: buckets first, then the stash, so a location is one index.
        self._kh = np.zeros(n, dtype=np.uint64)
        self._desc = np.full(n, -1, dtype=np.int64)
        self._vref = np.full(n, -1, dtype=np.int64)
        self._vrow = np.full(n, -1, dtype=np.int64)
        self._stash_n = 0
        self._len = 0
        self._rng = random.Random(seed)

    @classmethod
    def for_capacity(
        cls, n_entries: int, *, max_load: float = DEFAULT_MAX_LOAD, **kwargs: int
    ) -> CuckooTable:
        need = max(1, -(-n_entries // SLOTS_PER_BUCKET))
        n_buckets = 1 << max(0, int(np.ceil(np.log2(need / max_load))))
        return cls(n_buckets, **kwargs)

    # -- hashing ---------------------------------------------------------------------------------

    def buckets(self, kh: int) -> tuple[int, int]:
        h = ((kh ^ (kh >> 32)) * _MIX) & _M64
        h ^= h >> 29
        b1 = h & self._mask
        # Offset is odd, hence nonzero whenever there are two or more buckets: b2 != b1.
        return b1, b1 ^ (((h >> 32) | 1) & self._mask)

    def buckets_many(self, khs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = khs.astype(np.uint64, copy=False)
        h = (k ^ (k >> np.uint64(32))) * np.uint64(_MIX)  # uint64 arrays wrap mod 2**64
        h ^= h >> np.uint64(29)
        mask = np.uint64(self._mask)
        b1 = h & mask
        b2 = b1 ^ (((h >> np.uint64(32)) | np.uint64(1)) & mask)
        return b1.astype(np.intp), b2.astype(np.intp)

    def _alt(self, bucket: int, kh: int) -> int:
        b1, b2 = self.buckets(kh)
        return b2 if bucket == b1 else b1

    # -- single-key operations -------------------------------------------------------------------

    def _locate(self, kh: int) -> int:
        """Flat location of `kh`, or -1. The L1 exact-get hot path: `buckets` inlined, b2 lazily."""
        h = ((kh ^ (kh >> 32)) * _MIX) & _M64
        h ^= h >> 29
        b1 = h & self._mask
        base = b1 * SLOTS_PER_BUCKET
        row = self._kh[base : base + SLOTS_PER_BUCKET].tolist()
        if kh in row:
            return base + row.index(kh)
        base = (b1 ^ (((h >> 32) | 1) & self._mask)) * SLOTS_PER_BUCKET
        row = self._kh[base : base + SLOTS_PER_BUCKET].tolist()
        if kh in row:
            return base + row.index(kh)
        if self._stash_n:
            stash = self._kh[self._stash_base : self._stash_base + self._stash_n].tolist()
            if kh in stash:
                return self._stash_base + stash.index(kh)
        return -1

    def get(self, kh: int) -> Slot | None:
        loc = self._locate(kh)
        if loc < 0:
            return None
        return Slot(self._desc.item(loc), self._vref.item(loc), self._vrow.item(loc))

    def get_desc(self, kh: int) -> int:
        """Just the descriptor slot of `kh` (-1 when absent): the cheapest exact lookup."""
        loc = self._locate(kh)
        return -1 if loc < 0 else self._desc.item(loc)

    def __contains__(self, kh: object) -> bool:
        return isinstance(kh, int) and kh != EMPTY and self._locate(kh) >= 0

    def __len__(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return self._stash_base + self.stash_size

    @property
    def load_factor(self) -> float:
        return self._len / self._stash_base

    @property
    def stash_len(self) -> int:
        return self._stash_n

    def _write(self, loc: int, kh: int, desc: int, vref: int, vrow: int) -> None:
        self._kh[loc] = kh
        self._desc[loc] = desc
        self._vref[loc] = vref
        self._vrow[loc] = vrow

    def _read(self, loc: int) -> tuple[int, int, int, int]:
        return self._kh.item(loc), self._desc.item(loc), self._vref.item(loc), self._vrow.item(loc)

    def _free_slot(self, bucket: int) -> int:
        s = SLOTS_PER_BUCKET
        row = self._kh[bucket * s : bucket * s + s].tolist()
        return bucket * s + row.index(EMPTY) if EMPTY in row else -1

    def put(self, kh: int, desc: int, vref: int, vrow: int = -1) -> None:
        """Insert or overwrite. Raises `CuckooFull` (leaving the table as it was) when no room."""
        if not 0 < kh <= _M64:
            raise ValueError(f"key hash must be a nonzero uint64, got {kh}")
        loc = self._locate(kh)
        if loc >= 0:
            self._write(loc, kh, desc, vref, vrow)
            return
        b1, b2 = self.buckets(kh)
        for b in (b1, b2):
            loc = self._free_slot(b)
            if loc >= 0:
                self._write(loc, kh, desc, vref, vrow)
                self._len += 1
                return
        self._displace((kh, desc, vref, vrow), self._rng.choice((b1, b2)))
        self._len += 1

    def _displace(self, item: tuple[int, int, int, int], bucket: int) -> None:
        undo: list[tuple[int, tuple[int, int, int, int]]] = []
        homeless = item
        for _ in range(self.max_kicks):
            loc = bucket * SLOTS_PER_BUCKET + self._rng.randrange(SLOTS_PER_BUCKET)
            evicted = self._read(loc)
            undo.append((loc, evicted))
            self._write(loc, *homeless)
            homeless = evicted
            bucket = self._alt(bucket, homeless[0])
            free = self._free_slot(bucket)
            if free >= 0:
                self._write(free, *homeless)
                return
        if self._stash_n < self.stash_size:
            self._write(self._stash_base + self._stash_n, *homeless)
            self._stash_n += 1
            return
        # Undo newest first so every displaced item is back where it was.
        for loc, old in reversed(undo):
            self._write(loc, *old)
        raise CuckooFull(
            f"no slot for key hash {item[0]:#x} within {self.max_kicks} kicks and the stash "
            f"({self.stash_size}) is full; {self._len} entries in {self.n_buckets} buckets"
        )

    def delete(self, kh: int) -> bool:
        loc = self._locate(kh)
        if loc < 0:
            return False
        if loc >= self._stash_base:
            last = self._stash_base + self._stash_n - 1
            self._write(loc, *self._read(last))
            self._write(last, EMPTY, -1, -1, -1)
            self._stash_n -= 1
        else:
            self._write(loc, EMPTY, -1, -1, -1)
            self._unstash(loc // SLOTS_PER_BUCKET)
        self._len -= 1
        return True

    def _unstash(self, bucket: int) -> None:
        """A bucket slot just freed: move a stashed item that hashes there back into the table, so
        the stash stays empty in the common case and lookups skip it."""
        for i in range(self._stash_n):
            loc = self._stash_base + i
            item = self._read(loc)
            if bucket in self.buckets(item[0]):
                self._write(self._free_slot(bucket), *item)
                last = self._stash_base + self._stash_n - 1
                self._write(loc, *self._read(last))
                self._write(last, EMPTY, -1, -1, -1)
                self._stash_n -= 1
                return

    def clear(self) -> None:
        self._kh[:] = EMPTY
        self._desc[:] = self._vref[:] = self._vrow[:] = -1
        self._stash_n = self._len = 0

    def items(self) -> Iterator[tuple[int, Slot]]:
        for loc in np.flatnonzero(self._kh).tolist():
            kh, desc, vref, vrow = self._read(loc)
            yield kh, Slot(desc, vref, vrow)

    def locations(self, kh: int) -> tuple[int, int, bool]:
        """(b1, b2, stashed) for `kh`, which must be present: lets tests check placement invariants."""
        loc = self._locate(kh)
        if loc < 0:
            raise KeyError(kh)
        b1, b2 = self.buckets(kh)
        return b1, b2, loc >= self._stash_base

    def bucket_of(self, kh: int) -> int:
        loc = self._locate(kh)
        if loc < 0 or loc >= self._stash_base:
            return -1
        return loc // SLOTS_PER_BUCKET

    def resized(self, n_buckets: int) -> CuckooTable:
        """A copy with `n_buckets` buckets holding every item (raises `CuckooFull` if they do not fit)."""
        table = CuckooTable(
            n_buckets, stash_size=self.stash_size, max_kicks=self.max_kicks, seed=self._rng.randrange(1 << 30)
        )
        for kh, slot in self.items():
            table.put(kh, *slot)
        return table

    # -- vectorised lookups ----------------------------------------------------------------------

    def locate_many(self, khs: npt.ArrayLike) -> np.ndarray:
        """Flat locations (int64, -1 when absent) of many key hashes at once."""
        k = np.asarray(khs, dtype=np.uint64)
        b1, b2 = self.buckets_many(k)
        s = SLOTS_PER_BUCKET
        grid = self._kh[: self._stash_base].reshape(self.n_buckets, s)
        col = k[:, None]
        m1 = grid[b1] == col
        m2 = grid[b2] == col
        loc = np.where(
            m1.any(axis=1),
            b1 * s + m1.argmax(axis=1),
            np.where(m2.any(axis=1), b2 * s + m2.argmax(axis=1), -1),
        ).astype(np.int64)
        if self._stash_n:
            ms = col == self._kh[self._stash_base : self._stash_base + self._stash_n][None, :]
            hit = ms.any(axis=1) & (loc < 0)
            loc[hit] = self._stash_base + ms.argmax(axis=1)[hit]
        return loc

    def get_many(self, khs: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(found, desc, vref, vrow) arrays; absent keys get -1 in the payload columns."""
        loc = self.locate_many(khs)
        found = loc >= 0
        # Location -1 reads the last stash slot; mask it back to -1 below.
        return (
            found,
            np.where(found, self._desc[loc], -1),
            np.where(found, self._vref[loc], -1),
            np.where(found, self._vrow[loc], -1),
        )
