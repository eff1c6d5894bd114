"""The binary answer of POST /v1/blocks/fetch (`application/x-cachemesh-blocks`): many blocks' values in
one body, length-prefixed, encoded and parsed here without I/O (the API and the client share it).

All integers big-endian:

    magic   4 bytes  b"CMBF"
    version u8       1
    count   u32      records that follow, one per requested key, in request order
    record:
      key_len u16, key (UTF-8, key_len bytes)
      status  u8     0 miss, 1 hit, 2 omitted (a hit left out: the response reached its byte budget)
      tier    u8     0 none, 1 l1, 2 l2, 3 l3 (where the hit was served from)
      val_len u32, value (val_len bytes: the entry's value in the cachemesh value encoding, exactly as
                     GET /v1/values/{key} returns it; empty unless status is 1)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

MEDIA_TYPE = "application/x-cachemesh-blocks"
MAGIC = b"CMBF"
VERSION = 1

Status = Literal["miss", "hit", "omitted"]
_STATUS: tuple[Status, ...] = ("miss", "hit", "omitted")
_TIERS: tuple[str | None, ...] = (None, "l1", "l2", "l3")
_HEAD = struct.Struct(">4sBI")
_RECORD_KEY = struct.Struct(">H")
_RECORD_TAIL = struct.Struct(">BBI")


class FrameError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class FetchedBlock:
    key: str
    status: Status
    tier: str | None = None
    value: bytes | memoryview = b""

    @property
    def hit(self) -> bool:
        return self.status == "hit"


def frame_parts(blocks: Iterable[FetchedBlock]) -> list[bytes | memoryview]:
    """The frame as a list of buffers, the values not copied (to send them one after another)."""
    items = list(blocks)
    parts: list[bytes | memoryview] = [_HEAD.pack(MAGIC, VERSION, len(items))]
    for b in items:
        key = b.key.encode()
        tail = _RECORD_TAIL.pack(_STATUS.index(b.status), _TIERS.index(b.tier), len(b.value))
        parts.append(b"".join((_RECORD_KEY.pack(len(key)), key, tail)))
        if len(b.value):
            parts.append(b.value)
    return parts


def encode_blocks(blocks: Iterable[FetchedBlock]) -> bytes:
    return b"".join(frame_parts(blocks))


def parse_blocks(data: bytes | memoryview, *, copy: bool = True) -> list[FetchedBlock]:
    """The records of a frame; without `copy` each value is a view of `data` (no copy of the payloads)."""
    view = memoryview(data)
    if len(view) < _HEAD.size:
        raise FrameError(f"{len(view)} bytes: shorter than the {_HEAD.size}-byte header")
    magic, version, count = _HEAD.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        raise FrameError(f"not a version-{VERSION} block frame (magic {bytes(magic)!r}, version {version})")
    pos, out = _HEAD.size, []
    for i in range(count):
        try:
            (key_len,) = _RECORD_KEY.unpack_from(view, pos)
            pos += _RECORD_KEY.size
            key = bytes(view[pos : pos + key_len]).decode()
            pos += key_len
            status, tier, val_len = _RECORD_TAIL.unpack_from(view, pos)
            pos += _RECORD_TAIL.size
        except (struct.error, UnicodeDecodeError) as exc:
            raise FrameError(f"record {i}: {exc}") from None
        if status >= len(_STATUS) or tier >= len(_TIERS) or pos + val_len > len(view):
            raise FrameError(f"record {i}: bad status {status}, tier {tier} or length {val_len}")
        value = view[pos : pos + val_len]
        out.append(FetchedBlock(key, _STATUS[status], _TIERS[tier], bytes(value) if copy else value))
        pos += val_len
    if pos != len(view):
        raise FrameError(f"{len(view) - pos} bytes after the last record")
    return out
