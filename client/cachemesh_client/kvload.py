"""Loading a chain of KV blocks from a tier node into an engine's memory: the blocks are fetched in
chunks (`POST /v1/blocks/fetch`, one kept-alive connection, bulk.py), each checked (the value header
and its crc32, valuecodec.py) and handed to `place` in prompt order; the next chunk is fetched on a
thread of its own while this one is placed, so the copy into the engine overlaps the transfer. A load
stops at the first block that is missing, damaged or refused by `check`: what follows it is of no use
to attention. numpy and the standard library only (the vLLM connector places with torch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from cachemesh_client.blockframe import FetchedBlock, FrameError, parse_blocks
from cachemesh_client.bulk import NodeError, NodeLink
from cachemesh_client.valuecodec import CodecError, ValueHeader, decode

Chunk = tuple[int, list[FetchedBlock]]


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
    ) -> None:
        self.url = url
        self.model = model
        self.token = token
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
        pending: Future[Chunk] | None = self._fetcher.submit(self._fetch, keys, 0, deadline)
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
