"""Where a value lies in an L2 pool: its block spans and, for a remote reader, the entry's facts and the
size and crc32 to check the gathered bytes against. Pure data, shared by the store and the wire."""

from __future__ import annotations

from dataclasses import dataclass

from services.tiers.entry import EntryMeta


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """One block of a value and how many of its bytes the value uses."""

    block_id: int
    length: int


@dataclass(frozen=True, slots=True)
class Located:
    """An entry in a remote pool: its blocks in order, its size and crc32 (what a reader checks the
    gathered bytes against: blocks may be freed and reused between FIND and READ), and its facts."""

    meta: EntryMeta
    spans: tuple[BlockSpan, ...]
    nbytes: int
    crc32: int
