"""Event ids: random (version 4) UUIDs as 32 hex digits, drawn from the system's random source many at a
time."""

from __future__ import annotations

import os

# Ids drawn ahead, `_ID_BATCH` at a time: one read of the random source for many events instead
# of a system call each (0.35 against 0.7 us an event). `list.pop` and `list.extend` are atomic, so
# threads never share an id; a forked child starts with none of its parent's.
_ID_BATCH = 256
_ids_ahead: list[str] = []
os.register_at_fork(after_in_child=_ids_ahead.clear)


def new_event_id() -> str:
    """A random (version 4) UUID as 32 hex digits, as `uuid.uuid4().hex` spells it, without building
    the UUID object."""
    while True:
        try:
            return _ids_ahead.pop()
        except IndexError:
            _ids_ahead.extend(new_event_ids(_ID_BATCH))


def new_event_ids(n: int) -> list[str]:
    """`n` random (version 4) UUIDs as 32 hex digits each, from one read of the system's random
    source."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # the RFC 4122 variant
    hexed = raw.hex()
    return [hexed[i : i + 32] for i in range(0, 32 * n, 32)]
