"""Other nodes' L2 pools as one more place to look before L3 (docs/design.md §1.1): the `RemoteL2` adapter
over each peer's block server (`CACHEMESH_TIERS_L2_PEERS`).

A lookup asks every peer that is not backing off at once: FIND for the keys (pipelined), then the blocks
of what was found (pipelined READs over TCP, or one-sided RDMA READs), checked against the size and
crc32 FIND gave (a block freed and reused in between reads as a miss, counted `stale`). The whole
exchange with one peer is bounded by `timeout_s`; a peer that times out or fails is a miss, is counted,
and is skipped for `retry_after_ms` so a dead node costs one timeout, not one per lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from services.tiers.entry import Entry
from services.tiers.l2.blocks import Located
from services.tiers.l2.net.frames import DEFAULT_MAX_FRAME_BYTES
from services.tiers.l2.net.rdma import PyverbsEndpoint, RdmaBlockTransport
from services.tiers.l2.net.transport import BlockTransport, TcpBlockClient
from services.tiers.ports import RemoteHit, RemoteL2
from services.tiers.settings import parse_peer, parse_peers

log = logging.getLogger(__name__)

TransportKind = Literal["tcp", "rdma", "auto"]


Connect = Callable[[str, int], Awaitable[BlockTransport]]


@dataclass
class _Peer:
    address: str
    host: str
    port: int
    transport: BlockTransport | None = None
    kind: str = "tcp"
    down_until: float = 0.0
    last_error: str | None = None
    hits: int = 0
    misses: int = 0
    stale: int = 0
    errors: int = 0
    timeouts: int = 0
    skipped: int = 0
    connecting: asyncio.Lock = field(default_factory=asyncio.Lock)

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "address": self.address,
            "transport": self.kind,
            "state": "backing_off" if now < self.down_until else ("connected" if self.transport else "idle"),
            "hits": self.hits,
            "misses": self.misses,
            "stale": self.stale,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "skipped": self.skipped,
            "last_error": self.last_error,
        }


class L2Peers(RemoteL2):
    """The L2 pools of the nodes at `addresses` (host:port of their block servers)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 0.1,
        retry_after_ms: int = 2_000,
        transport: TransportKind = "tcp",
        rdma_device: str | None = None,
        rdma_port: int = 1,
        rdma_gid_index: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        token: bytes | None = None,
        clock: Callable[[], float] = time.monotonic,
        connect: Connect | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_ms / 1000
        self.transport = transport
        self.rdma_device = rdma_device
        self.rdma_port = rdma_port
        self.rdma_gid_index = rdma_gid_index
        self.max_frame_bytes = max_frame_bytes
        self._token = token  # the mesh token peers' block servers require (never logged)
        self.clock = clock
        self._connect = connect or self._open
        self._peers = [_Peer(a, *parse_peer(a)) for a in parse_peers(addresses)]

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self._peers]

    async def _open(self, host: str, port: int) -> BlockTransport:
        """TCP, or RDMA with the handshake on a TCP control channel (`auto`: RDMA when both ends can)."""
        control = TcpBlockClient(
            host, port, max_frame_bytes=self.max_frame_bytes, timeout_s=self.timeout_s, token=self._token
        )
        if self.transport == "tcp":
            return control
        endpoint: PyverbsEndpoint | None = None
        try:
            endpoint = PyverbsEndpoint(self.rdma_device, port=self.rdma_port, gid_index=self.rdma_gid_index)
            rdma = RdmaBlockTransport(control, endpoint, timeout_s=self.timeout_s, want_write=False)
            await rdma.connect()
            return rdma
        except BaseException as exc:
            if endpoint is not None:
                endpoint.close()
            if self.transport == "rdma" or not isinstance(exc, Exception):
                await control.close()
                raise
            # auto: no device here, none there, or the handshake failed: this peer is read over TCP.
            log.info(
                "RDMA not usable with this peer; reading over TCP",
                extra={"peer": f"{host}:{port}", "error": repr(exc)},
            )
            return control

    async def fetch_many(self, keys: Sequence[str]) -> dict[str, RemoteHit]:
        if not keys or not self._peers:
            return {}
        now = self.clock()
        live = []
        for peer in self._peers:
            if now < peer.down_until:
                peer.skipped += 1
            else:
                live.append(peer)
        if not live:
            return {}
        results = await asyncio.gather(*(self._fetch(peer, keys) for peer in live))
        found: dict[str, RemoteHit] = {}
        for hits in results:  # peers in configured order: the first that has a key serves it
            for key, hit in hits.items():
                found.setdefault(key, hit)
        return found

    async def _fetch(self, peer: _Peer, keys: Sequence[str]) -> dict[str, RemoteHit]:
        try:
            async with asyncio.timeout(self.timeout_s):
                transport = await self._transport(peer)
                located = await transport.find_many(keys)
                present = [(k, loc) for k, loc in zip(keys, located, strict=True) if loc is not None]
                blobs = await transport.gather([loc.spans for _, loc in present]) if present else []
        except TimeoutError:
            peer.timeouts += 1
            await self._fail(peer, f"no answer within {self.timeout_s * 1000:.0f} ms")
            return {}
        except Exception as exc:  # refused, reset, protocol error, RDMA failure: a miss, never a failure
            peer.errors += 1
            await self._fail(peer, repr(exc))
            return {}
        out: dict[str, RemoteHit] = {}
        peer.misses += len(keys) - len(present)
        for (key, loc), blob in zip(present, blobs, strict=True):
            if blob is None or not _intact(key, loc, blob):
                peer.stale += 1
                continue
            peer.hits += 1
            out[key] = RemoteHit(Entry(loc.meta, blob), peer.address)
        return out

    async def _transport(self, peer: _Peer) -> BlockTransport:
        async with peer.connecting:  # concurrent lookups share one connection per peer
            if peer.transport is None:
                peer.transport = await self._connect(peer.host, peer.port)
                peer.kind = "rdma" if isinstance(peer.transport, RdmaBlockTransport) else "tcp"
            return peer.transport

    async def _fail(self, peer: _Peer, reason: str) -> None:
        peer.down_until = self.clock() + self.retry_after_s
        peer.last_error = reason
        transport, peer.transport = peer.transport, None
        if transport is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail too
                await transport.close()
        log.warning(
            "L2 peer unavailable; skipping it for a while",
            extra={"peer": peer.address, "error": reason, "retry_after_s": self.retry_after_s},
        )

    def stats(self) -> dict[str, Any]:
        now = self.clock()
        peers = [p.stats(now) for p in self._peers]
        totals = {
            k: sum(p[k] for p in peers) for k in ("hits", "misses", "stale", "errors", "timeouts", "skipped")
        }
        return {"peers": peers, "timeout_ms": self.timeout_s * 1000, "peer_totals": totals}

    async def close(self) -> None:
        for peer in self._peers:
            transport, peer.transport = peer.transport, None
            if transport is not None:
                with contextlib.suppress(Exception):
                    await transport.close()


def _intact(key: str, loc: Located, blob: bytes) -> bool:
    return loc.meta.key == key and len(blob) == loc.nbytes and zlib.crc32(blob) == loc.crc32
