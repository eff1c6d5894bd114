"""One-sided RDMA work, planned sans I/O: where a block lies in the peer's registered pool region (its
`ServerHello`), and batches of READ / WRITE work requests that fit the bounce buffer and the queue depth."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.tiers.l2.block_pool import UNIT_BYTES
from services.tiers.l2.blocks import BlockSpan
from services.tiers.l2.net.frames import ServerHello


def remote_address(region: ServerHello, block_id: int, nbytes: int, offset: int = 0) -> int:
    """Where `nbytes` at `offset` of block `block_id` sit in the peer's registered pool."""
    start = block_id * UNIT_BYTES + offset
    if block_id < 0 or offset < 0 or nbytes < 0 or start + nbytes > region.length:
        raise ValueError(
            f"{nbytes} bytes at offset {offset} of block {block_id} fall outside the "
            f"{region.length} byte pool"
        )
    return region.addr + start


@dataclass(frozen=True, slots=True)
class RdmaOp:
    """One signalled work request: READ copies remote -> bounce buffer, WRITE bounce -> remote."""

    wr_id: int
    write: bool
    local_offset: int
    remote_addr: int
    length: int


def plan(
    spans: Sequence[BlockSpan], region: ServerHello, *, bounce_bytes: int, depth: int, write: bool = False
) -> list[list[RdmaOp]]:
    """Batches of one-sided ops for `spans`, in order, laid back to back in the bounce buffer: each batch
    fits the buffer and the send queue depth. Empty spans need no work request."""
    batches: list[list[RdmaOp]] = []
    batch: list[RdmaOp] = []
    used = 0
    for i, span in enumerate(spans):
        if span.length > bounce_bytes:
            raise ValueError(f"a {span.length} byte span does not fit the {bounce_bytes} byte bounce buffer")
        if span.length == 0:
            continue
        if batch and (used + span.length > bounce_bytes or len(batch) == depth):
            batches.append(batch)
            batch, used = [], 0
        addr = remote_address(region, span.block_id, span.length)
        batch.append(RdmaOp(i, write, used, addr, span.length))
        used += span.length
    if batch:
        batches.append(batch)
    return batches
