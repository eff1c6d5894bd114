"""The tier node's lifecycle: opens the publisher, Postgres (L3), the tiers, the block server that shares
its L2 pool with other nodes (read-only) and the clients of theirs, the consumers (each node in its own
consumer groups: every node must see every invalidation, heat decision and command) and the HTTP API;
runs the loops that send queued events, sweep expiries and drain L3 write-behind."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, ClassVar

from prometheus_client import Counter, Gauge

from schemas.events import (
    CacheInvalidated,
    ConversationEnded,
    EvictionRequested,
    PromotionRequested,
    TierModeChanged,
    WarmupApplied,
    WarmupRequested,
    heat_decisions,
    now_ms,
)
from schemas.topics import qualified
from services.runtime.breaker import LatencyBreaker
from services.runtime.http import InLoopServer, serve_in_loop
from services.runtime.kafka import Delivery, EventConsumer
from services.runtime.publisher import EventPublisher
from services.runtime.service import Loop, Service
from services.tiers.edge.api import create_app
from services.tiers.edge.embedder import Embedder
from services.tiers.edge.wire import wire_options
from services.tiers.l1.cache import L1Cache, monotonic_ms
from services.tiers.l2.block_pool import PAGE_BYTES, BlockPool
from services.tiers.l2.net.frames import RdmaUnavailable
from services.tiers.l2.net.peers import L2Peers
from services.tiers.l2.net.rdma import PyverbsExporter, rdma_available
from services.tiers.l2.net.transport import TcpBlockServer
from services.tiers.l2.store import L2Store
from services.tiers.l3.store import PostgresL3Store
from services.tiers.metrics import TIERS
from services.tiers.node.degrade import DegradeConfig, HitRateGuard, ModeChange
from services.tiers.node.matcher import Matcher
from services.tiers.node.outbox import Outbox
from services.tiers.node.refine import Refiner
from services.tiers.node.tiered import TieredCache
from services.tiers.relay import EventRelay
from services.tiers.settings import TiersSettings

log = logging.getLogger(__name__)

# How long a starting node waits to be assigned its invalidation partitions before it gives up.
_HEARING_TIMEOUT_S = 120.0
_HEARING_POLL_S = 0.05


def _heard_at_ms(consumer: EventConsumer) -> int | None:
    """The oldest of the times (wall ms) the broker last answered a fetch of each partition `consumer`
    is assigned; None without an assignment or before the first answers. An idle partition is fetched
    every `fetch_max_wait_ms`; one whose records wait to be applied is not fetched again, so its time
    ages (towards L3 only, the safe side)."""
    kafka = consumer._consumer  # aiokafka's own: the fetch state the runtime does not expose
    if kafka is None or not (partitions := kafka.assignment()):
        return None
    oldest: int | None = None
    for tp in partitions:
        at, end = kafka.last_poll_timestamp(tp), kafka.highwater(tp)
        if at is None or end is None:
            return None
        oldest = at if oldest is None else min(oldest, at)
    return oldest


LOCAL_ONLY = Gauge(
    "cachemesh_tiers_local_only", "1 while the node serves local-only (low hit rate)", ["node"]
)
WINDOW_HIT_RATE = Gauge("cachemesh_tiers_window_hit_rate", "Hit rate over the degrade window", ["node"])
MODE_CHANGES = Counter(
    "cachemesh_tiers_mode_changes_total", "Changes of serving mode, by mode entered", ["node", "mode"]
)


class TiersService(Service):
    name: ClassVar[str] = "tiers"
    settings: TiersSettings

    def __init__(self, settings: TiersSettings | None = None) -> None:
        super().__init__(settings or TiersSettings())
        self.cache: TieredCache | None = None
        self.embedder = Embedder(
            threads=self.settings.embedder_threads,
            backend=self.settings.embedder,
            max_call_texts=self.settings.embedder_max_call_texts,
            lanes=self.settings.embedder_lanes,
        )
        # The screen (refine.py): a second, cheaper model for text lookups; None without one.
        self.screen = (
            None
            if self.settings.embedder_screen == "none"
            else Embedder(
                threads=self.settings.embedder_threads,
                backend=self.settings.embedder_screen,
                max_call_texts=self.settings.embedder_max_call_texts,
                lanes=self.settings.embedder_lanes,
            )
        )
        self.publisher: EventPublisher | None = None
        self.announcer: EventPublisher | None = None  # the invalidations' producer (may be `publisher`)
        self.l3: PostgresL3Store | None = None
        self.block_server: TcpBlockServer | None = None
        self.peers: L2Peers | None = None
        self.api_port: int | None = None
        self._api: InLoopServer | None = None
        self._wake = asyncio.Event()
        self.relay: EventRelay | None = None
        self._delayed_commands: set[asyncio.Task[None]] = set()
        self._invalidations: EventConsumer | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.api_port}"

    def endpoints(self) -> dict[str, str]:
        if not self.api_port:
            return {}
        return {"cache API": self.api_url, "API docs": f"{self.api_url}/docs"}

    @staticmethod
    def _block_pool(s: TiersSettings) -> BlockPool:
        if s.l2_shared_memory:
            try:
                return BlockPool(s.l2_pages, shared=True)
            except OSError as exc:
                log.warning(
                    "L2 in private memory: no shared-memory segment of that size",
                    extra={"bytes": s.l2_pages * PAGE_BYTES, "error": repr(exc)},
                )
        return BlockPool(s.l2_pages)

    async def open(self, stack: AsyncExitStack) -> None:
        s = self.settings
        if s.embedding_dim != s.postgres.cachemesh_embedding_dim:
            raise ValueError(
                f"CACHEMESH_TIERS_EMBEDDING_DIM={s.embedding_dim} but the descriptor column is "
                f"{s.postgres.cachemesh_embedding_dim}-d (CACHEMESH_EMBEDDING_DIM)"
            )
        self.publisher = await self.open_publisher(stack)
        # Invalidations go out on a producer of their own that does not linger: each waits for no batch
        # to fill (the access events, many and in no hurry, keep the shared producer's linger).
        self.announcer = self.publisher
        if s.invalidation_linger_ms != s.kafka.linger_ms:
            self.announcer = EventPublisher(
                s.kafka.model_copy(update={"linger_ms": s.invalidation_linger_ms}),
                client_id=f"{self.name}-{s.node_id}-invalidations",
            )
            await self.announcer.start()
            stack.push_async_callback(self.announcer.stop)
        stack.push_async_callback(self._cancel_delayed_commands)
        # Registered after the publisher, so it runs before the publisher stops: queued events go out.
        stack.push_async_callback(self._drain_outbox)
        db = await self.open_database(stack)
        self.l3 = PostgresL3Store(
            db, dim=s.embedding_dim, outbox_topic=qualified(CacheInvalidated.topic, s.kafka.topic_namespace)
        )
        l2 = None
        if s.l2_pages:
            pool = self._block_pool(s)
            stack.callback(pool.close)
            l2 = L2Store(pool, dim=s.embedding_dim, max_value_bytes=s.l2_max_value_bytes)
        self.cache = TieredCache(
            l1=L1Cache(
                dim=s.embedding_dim,
                capacity_bytes=s.l1_capacity_bytes,
                max_entries=s.l1_max_entries,
                default_similarity_tolerance=s.default_similarity_tolerance,
            ),
            l2=l2,
            l3=self.l3,
            outbox=Outbox(
                clock=monotonic_ms,
                max_access=s.max_queued_access_events,
                max_invalidations=s.max_queued_invalidations,
                on_urgent=self._wake.set,
            ),
            breaker=LatencyBreaker(
                p99_ms=s.l3_breaker_p99_ms,
                window=s.l3_breaker_window,
                min_calls=s.l3_breaker_min_calls,
                cooldown_ms=s.l3_breaker_cooldown_ms,
                clock=monotonic_ms,
            ),
            node_id=s.node_id,
            wall_ms=(lambda: now_ms() + s.clock_skew_ms) if s.clock_skew_ms else now_ms,
            double_delete_delay_ms=s.double_delete_delay_ms,
            l3_timeout_s=s.l3_timeout_ms / 1000,
            l3_candidates=s.l3_candidates,
            max_pending_l3_writes=s.max_pending_l3_writes,
            write_behind=s.write_behind,
            matcher=Matcher(
                delta=s.match_delta if s.match_rule == "learned" else None,
                default_similarity_tolerance=s.default_similarity_tolerance,
                deltas=dict(s.match_delta_by),
                explore_rate=s.match_explore_rate,
                verify_rate=s.match_verify_rate,
            ),
            degrade=self._degrade_guard(),
        )
        if self.screen is not None:
            self.cache.placement.refiner = Refiner(
                self.embedder.embed, s.embedder_screen_band, s.embedder_screen_band_max
            )
        self.relay = EventRelay(s, self.cache, self.l3, self.publisher, self.announcer, self._wake)
        TIERS.watch(s.node_id, self.cache)
        stack.callback(TIERS.forget, s.node_id)
        await self._share_l2(stack)
        # A new node starts at the end of the streams: it holds nothing older to invalidate.
        invalidations = await self.open_consumer(
            stack,
            ["cache.invalidate.v1"],
            f"tiers-invalidate-{s.node_id}",
            self._on_invalidation,
            self.publisher,
            auto_offset_reset="latest",
        )
        await self.open_consumer(
            stack,
            ["heat.scores.v1", "tier.commands.v1", "context.lifecycle.v1"],
            f"tiers-control-{s.node_id}",
            self._on_control,
            self.publisher,
            auto_offset_reset="latest",
        )
        # No request before this node hears invalidations: what it read into its tiers meanwhile (from
        # L3 or a peer) would stay stale, served to its clients and, from L2, to its peers. A node
        # restarted after a crash waits here for the group to drop its dead member (the session timeout).
        await self._hearing(invalidations)
        self._invalidations = invalidations
        self.cache.placement.hearing_lease_ms = self.settings.hearing_lease_ms or None
        self.cache.placement.heard_at_ms = self._heard_at_ms(invalidations)
        await self._start_api(stack)
        # Everything built so far lives as long as the process: out of the collector's way, so a full
        # collection does not walk it in the middle of a request (tens of ms at p99 otherwise).
        gc.freeze()
        if s.embedder_preload:
            # The model is a large object graph; freeze it too once it is loaded.
            self.embedder.start_loading().add_done_callback(lambda _: gc.freeze())
            if self.screen is not None:
                self.screen.start_loading().add_done_callback(lambda _: gc.freeze())

    def _degrade_guard(self) -> HitRateGuard | None:
        s = self.settings
        if not s.degrade_enabled:
            return None
        config = DegradeConfig(
            window_ms=s.degrade_window_ms,
            enter_below=s.degrade_enter_below,
            exit_at=s.degrade_exit_at,
            hold_ms=s.degrade_hold_ms,
            min_dwell_ms=s.degrade_min_dwell_ms,
            min_lookups=s.degrade_min_lookups,
        )
        LOCAL_ONLY.labels(s.node_id).set(0)
        return HitRateGuard(config, clock=monotonic_ms)

    async def _hearing(self, consumer: EventConsumer) -> None:
        """Until `consumer` has its partitions, their positions and a first fetch answer from each (the
        coordinator and the fetcher work in the background; nothing needs to poll)."""
        deadline = time.monotonic() + _HEARING_TIMEOUT_S
        while not consumer.health()["assigned"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no invalidation partitions assigned within {_HEARING_TIMEOUT_S} s")
            await asyncio.sleep(0.05)
        await asyncio.wait_for(consumer.wait_positioned(), max(1.0, deadline - time.monotonic()))
        while _heard_at_ms(consumer) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no invalidation fetch answered within {_HEARING_TIMEOUT_S} s")
            await asyncio.sleep(0.01)

    async def _share_l2(self, stack: AsyncExitStack) -> None:
        """Serve this node's L2 pool to peers (read-only: its blocks belong to the L2 store) and connect
        to theirs; RDMA next to TCP where `l2_transport` asks for it and a device exists."""
        assert self.cache is not None
        s, l2 = self.settings, self.cache.l2
        token = s.token_bytes
        own: str | None = None
        if l2 is not None:
            exporter = self._rdma_exporter(l2.pool)
            if exporter is not None:
                stack.callback(exporter.close)
            server = TcpBlockServer(
                l2.pool,
                s.block_host,
                s.block_port,
                directory=l2,
                writable=False,
                rdma=exporter,
                token=token,
            )
            await server.start()
            stack.push_async_callback(server.stop)
            self.block_server = server
            own = server.address
            self.cache.placement.l2_address = own
            log.info("L2 block server listening", extra={"address": own, "rdma": exporter is not None})
        peers = [p for p in s.l2_peers if p != own]
        if peers:
            self.peers = L2Peers(
                peers,
                timeout_s=s.l2_peer_timeout_ms / 1000,
                retry_after_ms=s.l2_peer_retry_ms,
                transport=s.l2_transport,
                rdma_device=s.rdma_device,
                rdma_port=s.rdma_port,
                rdma_gid_index=s.rdma_gid_index,
                token=token,
            )
            stack.push_async_callback(self.peers.close)
            self.cache.placement.peers = self.peers
            log.info("reading peers' L2 before L3", extra={"peers": peers, "transport": s.l2_transport})

    def _rdma_exporter(self, pool: BlockPool) -> PyverbsExporter | None:
        s = self.settings
        if s.l2_transport == "tcp" or (s.l2_transport == "auto" and not rdma_available()):
            return None
        try:
            return PyverbsExporter(pool, s.rdma_device, port=s.rdma_port, gid_index=s.rdma_gid_index)
        except RdmaUnavailable as exc:
            if s.l2_transport == "rdma":
                raise RdmaUnavailable(f"CACHEMESH_TIERS_L2_TRANSPORT=rdma but {exc}") from exc
            log.warning("serving L2 over TCP only", extra={"error": str(exc)})
            return None

    async def _start_api(self, stack: AsyncExitStack) -> None:
        assert self.cache is not None
        s = self.settings
        app = create_app(self.cache, s, self.embedder, self.screen)
        self._api = await serve_in_loop(
            app,
            s.api_host,
            s.api_port,
            "tiers API",
            # httptools (h11 costs several times more per request), with the plain lookups answered
            # below uvicorn's ASGI cycle (edge/wire.py)
            **wire_options(app if s.wire_fast_path else None),
            proxy_headers=False,  # nothing reads the client address; its wrapper costs on every request
        )
        self.api_port = self._api.port
        stack.push_async_callback(self._stop_api)
        log.info("tiers API listening", extra={"url": self.api_url})

    @property
    def wire_answered(self) -> int:
        """Lookups the API answered at the wire (edge/wire.py) rather than through the ASGI app."""
        protocol = self._api.config.http_protocol_class if self._api is not None else None
        return getattr(protocol, "answered", 0)

    async def _stop_api(self) -> None:
        server, self._api = self._api, None
        if server is not None:
            await server.stop()

    async def _send_events(self) -> None:
        assert self.relay is not None
        await self.relay.send_events()

    async def _sweep_outbox(self) -> None:
        assert self.relay is not None
        await self.relay.sweep_outbox()

    @property
    def publish_errors(self) -> int:
        return self.relay.publish_errors if self.relay is not None else 0

    def loops(self) -> Sequence[Loop]:
        return (
            self._send_events,
            self._sweep_outbox,
            self._housekeeping,
            self._api_ticks,
            self._watch_hearing,
        )

    # --- consumers ------------------------------------------------------------------------------

    async def _on_invalidation(self, delivery: Delivery) -> None:
        if isinstance(delivery.event, CacheInvalidated) and self.cache is not None:
            self.cache.on_invalidated(delivery.event)

    async def _on_control(self, delivery: Delivery) -> None:
        event, cache = delivery.event, self.cache
        if cache is None:
            return
        delay_ms = self._warmup_delay_ms(event) if isinstance(event, WarmupRequested) else 0
        if (decisions := heat_decisions(event)) is not None:
            for decision in decisions:
                cache.on_heat(decision)
        elif delay_ms > 0:
            # Started at its time in the background, so the commands and decisions behind it wait for
            # nothing (a prefetch lost in a crash costs only a miss).
            assert isinstance(event, WarmupRequested)
            task = asyncio.create_task(self._run_command(event, delay_ms))
            self._delayed_commands.add(task)
            task.add_done_callback(self._delayed_commands.discard)
        elif isinstance(event, WarmupRequested | PromotionRequested | EvictionRequested):
            await self._run_command(event)
        elif isinstance(event, ConversationEnded):
            await cache.on_conversation_ended(event)

    def _warmup_delay_ms(self, event: WarmupRequested) -> int:
        if event.start_at_ms is None or self.cache is None:
            return 0
        return max(0, min(event.start_at_ms - self.cache.wall_ms(), self.settings.max_warmup_delay_ms))

    async def _run_command(
        self, event: WarmupRequested | PromotionRequested | EvictionRequested, delay_ms: int = 0
    ) -> None:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        assert self.cache is not None
        report = await self.cache.on_command(event)
        if report is None or isinstance(event, EvictionRequested):
            return
        applied = WarmupApplied(
            node_id=self.settings.node_id,
            command_event_id=event.event_id,
            tier=report.tier,  # type: ignore[arg-type]
            loaded=report.loaded,
            already_present=report.already_present,
            missing=report.missing,
            from_peers=report.from_peers,
            from_l3=report.from_l3,
        )
        assert self.publisher is not None
        await self.publisher.publish(applied, wait=False)

    async def _cancel_delayed_commands(self) -> None:
        for task in list(self._delayed_commands):
            task.cancel()
        await asyncio.gather(*self._delayed_commands, return_exceptions=True)

    def _heard_at_ms(self, consumer: EventConsumer) -> int | None:
        """`_heard_at_ms` on this node's clock (the broker client stamps with the machine's)."""
        heard = _heard_at_ms(consumer)
        return None if heard is None else heard + self.settings.clock_skew_ms

    # --- loops ----------------------------------------------------------------------------------

    async def _drain_outbox(self) -> None:
        if self.relay is not None:
            await self.relay.drain()

    async def _housekeeping(self) -> None:
        assert self.cache is not None and self.l3 is not None
        s = self.settings
        last_l3_sweep = time.monotonic()
        while True:
            await asyncio.sleep(s.expire_interval_ms / 1000)
            self.cache.expire()
            await self._check_mode()
            await self.cache.flush_pending()
            if time.monotonic() - last_l3_sweep >= s.l3_expire_interval_ms / 1000:
                last_l3_sweep = time.monotonic()
                try:
                    await self.l3.delete_expired(self.cache.wall_ms())
                except Exception as exc:  # the next sweep tries again
                    log.warning("L3 expiry sweep failed", extra={"error": repr(exc)})

    async def _check_mode(self) -> None:
        """The degrade guard's tick: the window's hit rate as a gauge; a change of mode as a metric and
        a `TierModeChanged` event."""
        assert self.cache is not None
        change = self.cache.check_mode()
        if self.cache.placement.degrade is None:
            return
        node = self.settings.node_id
        rate = self.cache.placement.degrade.stats().window_hit_rate
        if rate is not None:
            WINDOW_HIT_RATE.labels(node).set(rate)
        if change is not None:
            LOCAL_ONLY.labels(node).set(change.mode == "local_only")
            MODE_CHANGES.labels(node, change.mode).inc()
            await self._publish_mode_change(change)

    async def _publish_mode_change(self, change: ModeChange) -> None:
        s, node = self.settings, self.settings.node_id
        event = TierModeChanged(
            node_id=node,
            mode=change.mode,
            previous_mode=change.previous,
            reason=change.reason,
            hit_rate=change.hit_rate,
            hits=change.hits,
            lookups=change.lookups,
            window_ms=s.degrade_window_ms,
            enter_below=s.degrade_enter_below,
            exit_at=s.degrade_exit_at,
            in_previous_ms=change.in_previous_ms,
            local_only_ms=change.local_only_ms,
            changes=change.changes,
        )
        assert self.publisher is not None
        try:
            await self.publisher.publish(event, wait=False)
        except Exception as exc:  # the mode has changed anyway; the metric and the log still say so
            if self.relay is not None:
                self.relay.publish_errors += 1
            log.warning("mode change publish failed", extra={"error": repr(exc)})

    async def _watch_hearing(self) -> None:
        cache = self.cache
        assert cache is not None and self._invalidations is not None
        forget_after = self.settings.forget_after_unheard_ms
        was_hearing, deaf_since = cache.hearing, cache.wall_ms()
        last_heard = cache.placement.heard_at_ms
        while True:
            heard = cache.placement.heard_at_ms = self._heard_at_ms(self._invalidations)
            hearing = cache.hearing
            if was_hearing and not hearing:  # deaf since the last fetch answer (or now, without one)
                deaf_since = last_heard if last_heard is not None else cache.wall_ms()
            elif hearing and not was_hearing and forget_after and heard is not None:
                # Deaf this long is an outage, not a stalled loop: what this node holds may have been
                # replaced meanwhile, and the invalidations other nodes' producers buffered can land
                # after it hears again. It starts its memory afresh (L3 has every write).
                deaf_ms = heard - deaf_since
                if deaf_ms >= forget_after:
                    gone = cache.forget_memory("unheard")
                    log.warning(
                        "heard invalidations again after an outage; memory dropped",
                        extra={"entries": gone, "deaf_ms": deaf_ms},
                    )
            was_hearing = hearing
            if heard is not None:
                last_heard = heard
            await asyncio.sleep(_HEARING_POLL_S)

    async def _api_ticks(self) -> None:
        if self._api is not None:
            await self._api.tick()

    # --- health ---------------------------------------------------------------------------------

    def _degraded(self) -> list[str]:
        """What a client does not get from this node now, one reason each (empty: all of it)."""
        cache = self.cache
        if cache is None:
            return []
        reasons = []
        if cache.breaker.state != "closed":
            writes = (
                "queued for L3 (write-behind)" if cache.writes.write_behind else "refused with 503 (retry)"
            )
            reasons.append(f"L3 breaker {cache.breaker.state}: lookups from L1/L2 only, writes {writes}")
        if not cache.hearing:
            reasons.append("not hearing invalidations: lookups read L3 alone")
        if cache.placement.local_only:
            reasons.append("local-only: the peers' L2 is not asked (hit rate under the degrade threshold)")
        return reasons

    async def checks(self) -> dict[str, Any]:
        cache = self.cache
        guard = (
            cache.placement.degrade.stats()
            if cache is not None and cache.placement.degrade is not None
            else None
        )
        return {
            "degraded": self._degraded(),
            "api_serving": self._api is not None and self._api.started,
            "api": {
                "url": self.api_url if self.api_port else None,
                "auth": self.settings.api_token is not None,
            },
            "embedder": self.embedder.health(),
            "screen": self.screen.health() if self.screen is not None else None,
            "l2_blocks": {
                "address": self.block_server.address if self.block_server is not None else None,
                "rdma": self.block_server is not None and self.block_server.rdma is not None,
                "connections": self.block_server.connections if self.block_server is not None else 0,
                "peers": self.peers.addresses if self.peers is not None else [],
            },
            "tiers": None
            if cache is None
            else {
                "degraded": cache.degraded,
                "mode": cache.mode,
                "window_hit_rate": guard.window_hit_rate if guard is not None else None,
                "local_only_ms": guard.local_only_ms if guard is not None else 0,
                "l1_entries": len(cache.l1),
                "l2_entries": len(cache.l2) if cache.l2 is not None else None,
                "l3_breaker": cache.breaker.state,
                "pending_l3_writes": cache.pending_l3_writes,
                "published_invalidations": self.relay.published_invalidations if self.relay else 0,
                "publish_errors": self.publish_errors,
            },
        }
