"""Trace parsers, one per format, each producing the flat `Trace` the replayer walks.

Formats (Caffeine simulator conventions):
- LIRS: gzip or plain text, one integer block number per line; `*` marker lines are skipped.
- ARC (Megiddo & Modha, FAST'03 traces): `start nblocks ignore reqno` per line; the line expands to
  `nblocks` consecutive blocks `start .. start + nblocks - 1`, each an independent access.
- Mooncake JSONL (FAST'25): `timestamp` (ms), `hash_ids` (prefix-chained KV block ids); one request
  is one prefix lookup (see `Trace.prefix`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import numpy as np

TraceFormat = Literal["lirs", "arc", "mooncake"]


@dataclass(frozen=True)
class Trace:
    """A replayable trace: `keys[i]` is accessed at `times_ms[i]`.

    With `prefix` set, `starts` splits the accesses into requests (request r covers
    `keys[starts[r]:starts[r+1]]`, each key the prefix parent of the next) and the replayer applies
    prefix-block semantics: a request hits the longest resident prefix of its blocks. Traces without
    clocks (LIRS, ARC) get one millisecond per request.
    """

    name: str
    keys: np.ndarray
    times_ms: np.ndarray
    starts: np.ndarray
    prefix: bool = False

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def requests(self) -> int:
        return len(self.starts) - 1

    @property
    def distinct(self) -> int:
        return len(np.unique(self.keys))


def _open_text(path: Path) -> IO[str]:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt")
    return path.open("r")


def _trace_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".trace", ".txt", ".lis", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def _clocked(name: str, keys: list[int]) -> Trace:
    n = len(keys)
    return Trace(
        name=name,
        keys=np.asarray(keys, dtype=np.int64),
        times_ms=np.arange(n, dtype=np.int64),
        starts=np.arange(n + 1, dtype=np.int64),
    )


def iter_lirs(lines: Iterator[str]) -> Iterator[int]:
    for raw in lines:
        line = raw.strip()
        if line and line != "*":
            yield int(line)


def read_lirs(path: Path) -> Trace:
    with _open_text(path) as fh:
        return _clocked(_trace_name(path), list(iter_lirs(fh)))


def iter_arc(lines: Iterator[str]) -> Iterator[int]:
    for raw in lines:
        fields = raw.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise ValueError(f"ARC trace line needs `start nblocks ignore reqno`, got {raw!r}")
        start, count = int(fields[0]), int(fields[1])
        yield from range(start, start + count)


def read_arc(path: Path) -> Trace:
    with _open_text(path) as fh:
        return _clocked(_trace_name(path), list(iter_arc(fh)))


def read_mooncake(path: Path, limit: int | None = None) -> Trace:
    keys: list[int] = []
    times: list[int] = []
    starts = [0]
    with _open_text(path) as fh:
        for raw in fh:
            if not raw.strip():
                continue
            request = json.loads(raw)
            blocks = [int(b) for b in request["hash_ids"]]
            keys.extend(blocks)
            stamp = request.get("timestamp", len(starts) - 1)  # no clock: one ms per request
            times.extend([int(stamp)] * len(blocks))
            starts.append(len(keys))
            if limit is not None and len(starts) > limit:
                break
    return Trace(
        name=_trace_name(path),
        keys=np.asarray(keys, dtype=np.int64),
        times_ms=np.asarray(times, dtype=np.int64),
        starts=np.asarray(starts, dtype=np.int64),
        prefix=True,
    )


def detect_format(path: Path) -> TraceFormat:
    """Guess the format from the first data line: JSON, four ARC columns, or one integer."""
    with _open_text(path) as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line == "*":
                continue
            if line.startswith("{"):
                return "mooncake"
            return "arc" if len(line.split()) >= 2 else "lirs"
    raise ValueError(f"{path}: empty trace")


def read_trace(path: Path, fmt: TraceFormat | None = None) -> Trace:
    fmt = fmt or detect_format(path)
    if fmt == "lirs":
        return read_lirs(path)
    if fmt == "arc":
        return read_arc(path)
    if fmt == "mooncake":
        return read_mooncake(path)
    raise ValueError(f"unknown trace format {fmt!r}")


def from_keys(name: str, keys: list[int] | np.ndarray) -> Trace:
    """An in-memory block trace (tests, synthetic scenarios), one millisecond per access."""
    return _clocked(name, [int(k) for k in keys])


def from_requests(name: str, requests: list[list[int]], times_ms: list[int] | None = None) -> Trace:
    """An in-memory prefix trace: each request is a chain of block ids."""
    keys: list[int] = []
    times: list[int] = []
    starts = [0]
    for r, blocks in enumerate(requests):
        keys.extend(blocks)
        times.extend([times_ms[r] if times_ms is not None else r] * len(blocks))
        starts.append(len(keys))
    return Trace(
        name=name,
        keys=np.asarray(keys, dtype=np.int64),
        times_ms=np.asarray(times, dtype=np.int64),
        starts=np.asarray(starts, dtype=np.int64),
        prefix=True,
    )
