"""Loading a chain of KV blocks from a tier node into an engine's memory, in prompt order, each block
checked (its header and crc32, valuecodec.py) and handed to `place`. On the node's host the blocks in
its L2 are copied straight out of the pool's shared-memory segment (`POST /v1/blocks/locate` says
where; each copy is checked against the crc32 the node gave, since a block may be freed and its pages
reused meanwhile). The rest, and everything from another host, is fetched in chunks (`POST
/v1/blocks/fetch`, one kept-alive connection, bulk.py), the next chunk on a thread of its own while this
one is placed. A load stops at the first block that is missing, damaged or refused by `check`: what
follows it is of no use to attention. numpy and the standard library only (the vLLM connector places
with torch).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from cachemesh_client.blockframe import FetchedBlock, FrameError, parse_blocks
from cachemesh_client.bulk import NodeError, NodeLink
from cachemesh_client.valuecodec import CodecError, ValueHeader, decode

Chunk = tuple[int, list[FetchedBlock]]
SHM_DIR = "/dev/shm"

log = logging.getLogger("cachemesh.kvload")


class _Segment:
    """A node's L2 pool segment, mapped read-only."""

    def __init__(self, name: str, size: int) -> None:
        if "/" in name or not name:
            raise ValueError(f"{name!r} is not a segment name")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
        try:
            self.map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self.name = name

    def read(self, spans: Sequence[Sequence[int]]) -> bytes:
        if len(spans) == 1:
            offset, length = spans[0]
            return self.map[offset : offset + length]
        return b"".join(self.map[o : o + n] for o, n in spans)

    def close(self) -> None:
        self.map.close()


class LoadStopped(Exception):
    """Why a load ended before its last block (the blocks placed before it stay placed)."""


class BlockLoader:
    def __init__(
        self,
        url: str,
        *,
        model: str | None,
        token: str | None = None,
        chunk_bytes: int = 4 << 20,
        block_bytes: int = 256 << 10,
        shared_memory: bool = True,
    ) -> None:
        self.url = url
        self.model = model
        self.token = token
        # Tried until the node says it has no segment or it cannot be mapped here (another host).
        self.shared_memory = shared_memory
        self.from_segment = 0  # blocks copied out of the node's shared pool, in all
        self._segment: _Segment | None = None
        self.chunk_blocks = max(1, chunk_bytes // max(block_bytes, 1))
        self._local = threading.local()
        self._fetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cachemesh-fetch")

    def _link(self) -> NodeLink:
        link: NodeLink | None = getattr(self._local, "link", None)
        if link is None:
            link = self._local.link = NodeLink(self.url, token=self.token)
        return link

    def _fetch(self, keys: Sequence[str], start: int, deadline: float) -> Chunk:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("load deadline passed")
        body: dict[str, object] = {"keys": list(keys[start : start + self.chunk_blocks])}
        if self.model is not None:
            body["model"] = self.model
        data = self._link().post_json_raw("/v1/blocks/fetch", body, left)
        return start, parse_blocks(data, copy=False)

    def load(
        self,
        keys: Sequence[str],
        place: Callable[[int, ValueHeader, np.ndarray], None],
        *,
        timeout_s: float,
        check: Callable[[int, ValueHeader], None] | None = None,
    ) -> int:
        """How many leading blocks of `keys` were placed; `place(i, header, array)` gets each checked
        block, `check(i, header)` may refuse one (by raising CodecError). Raises LoadStopped, with the
        count placed so far in its args[1], when the load ended early."""
        deadline = time.monotonic() + timeout_s
        placed = 0
        if self.shared_memory:
            try:
                placed = self._from_segment(keys, place, check, deadline)
            except (NodeError, ValueError, KeyError, TypeError) as exc:
                raise LoadStopped(f"{type(exc).__name__}: {exc}", placed) from None
            if placed == len(keys):
                return placed
        return self._over_http(keys, placed, place, check, deadline)

    def _from_segment(
        self,
        keys: Sequence[str],
        place: Callable[[int, ValueHeader, np.ndarray], None],
        check: Callable[[int, ValueHeader], None] | None,
        deadline: float,
    ) -> int:
        """Blocks copied out of the node's shared L2 pool, up to the first it does not hold there."""
        body: dict[str, object] = {"keys": list(keys)}
        if self.model is not None:
            body["model"] = self.model
        where = self._link().post_json(
            "/v1/blocks/locate", body, timeout_s=max(deadline - time.monotonic(), 0.001)
        )
        name = where.get("segment")
        if not name:
            self.shared_memory = False  # the node does not share its pool
            return 0
        if self._segment is None or self._segment.name != name:
            if self._segment is not None:
                self._segment.close()
                self._segment = None
            try:
                self._segment = _Segment(str(name), int(where["segment_bytes"]))
            except OSError as exc:
                log.info("the node's L2 segment cannot be mapped here (%r): loading over HTTP", exc)
                self.shared_memory = False
                return 0
        placed = 0
        for i, block in enumerate(where["blocks"]):
            data = self._segment.read(block["spans"])
            if zlib.crc32(data) != block["crc32"]:
                break  # freed and reused since the node located it: the rest over HTTP
            try:
                header, array = decode(data, verify=False)  # the whole value's crc32 was checked
                if check is not None:
                    check(i, header)
            except CodecError as exc:
                raise LoadStopped(f"block {i}: {exc}", placed) from None
            place(i, header, array)
            placed += 1
            self.from_segment += 1
        return placed

    def _over_http(
        self,
        keys: Sequence[str],
        placed: int,
        place: Callable[[int, ValueHeader, np.ndarray], None],
        check: Callable[[int, ValueHeader], None] | None,
        deadline: float,
    ) -> int:
        pending: Future[Chunk] | None = self._fetcher.submit(self._fetch, keys, placed, deadline)
        try:
            while pending is not None:
                start, blocks = pending.result()
                pending = None
                if start != placed:  # fetched ahead from a position that turned out wrong
                    pending = self._fetcher.submit(self._fetch, keys, placed, deadline)
                    continue
                hits = 0
                for block in blocks:
                    if block.status != "hit":
                        break
                    hits += 1
                after = start + hits
                if hits == len(blocks) and after < len(keys):  # all there: fetch on while placing
                    pending = self._fetcher.submit(self._fetch, keys, after, deadline)
                for i, block in enumerate(blocks[:hits]):
                    header, array = decode(block.value)  # checks the crc32
                    if check is not None:
                        check(start + i, header)
                    place(start + i, header, array)
                    placed += 1
                if hits < len(blocks):
                    if blocks[hits].status == "miss":
                        raise LoadStopped(f"block {start + hits} is not held", placed)
                    if hits == 0:
                        raise LoadStopped(f"block {start} does not fit one response", placed)
                    pending = self._fetcher.submit(self._fetch, keys, after, deadline)  # omitted ones
        except (NodeError, FrameError, CodecError, TimeoutError, ValueError) as exc:
            raise LoadStopped(f"{type(exc).__name__}: {exc}", placed) from None
        finally:
            if pending is not None:
                pending.cancel()
        return placed

    def close(self) -> None:
        self._fetcher.shutdown(wait=False, cancel_futures=True)
        if self._segment is not None:
            self._segment.close()
            self._segment = None
