"""The tier node's outbox relay: sends the invalidations the outbox queues as soon as they are due
(and again when a send fails), access events in batches, and sweeps L3's outbox table: rows the broker
acknowledged are forgotten, rows left too long by any node are relayed."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

from schemas.events import CacheAccessBatch, CacheInvalidated
from services.runtime.publisher import EventPublisher, partition_groups
from services.tiers.l1.cache import monotonic_ms
from services.tiers.l3.store import PostgresL3Store
from services.tiers.node.outbox import Outbox, access_batch_json
from services.tiers.node.tiered import TieredCache
from services.tiers.settings import TiersSettings

log = logging.getLogger(__name__)

# Access events go out when this many are queued, even before access_flush_ms.
_ACCESS_BATCH = 500
# Access events built and published between two turns of the event loop (one publish_many each).
_ACCESS_SLICE = 256
# A failed invalidation publish is tried again after this long.
_REPUBLISH_DELAY_MS = 500


class EventRelay:
    """`publisher` carries access events, `announcer` invalidations (it may be the same producer);
    `wake` is set by the outbox when an invalidation is urgent."""

    def __init__(
        self,
        settings: TiersSettings,
        cache: TieredCache,
        l3: PostgresL3Store,
        publisher: EventPublisher,
        announcer: EventPublisher,
        wake: asyncio.Event,
    ) -> None:
        self.settings, self.cache, self.l3 = settings, cache, l3
        self.publisher, self.announcer, self.wake = publisher, announcer, wake
        self.published_invalidations = 0
        self.publish_errors = 0
        # Ids of invalidations the broker acknowledged, for the outbox sweep to forget (a batch each).
        self._acknowledged: list[str] = []

    async def send_events(self) -> None:
        """Invalidations as soon as they are due; access events every access_flush_ms or per 500."""
        outbox = self.cache.outbox
        flush_s = self.settings.access_flush_ms / 1000
        last_access_flush = time.monotonic()
        while True:
            due = outbox.next_due_ms()
            wait_s = flush_s if due is None else max(0.0, min(flush_s, (due - monotonic_ms()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=wait_s)
            self.wake.clear()
            await self._publish_due(outbox)
            now = time.monotonic()
            if now - last_access_flush >= flush_s or outbox.stats().queued_access >= _ACCESS_BATCH:
                last_access_flush = now
                await self._publish_access(outbox)

    async def _publish_due(self, outbox: Outbox) -> None:
        for event in outbox.take_due():
            try:
                await self.announcer.publish(
                    event, wait=False, on_settled=functools.partial(self._settled, outbox, event)
                )
                self.published_invalidations += 1
            except Exception as exc:  # broker unreachable: try again shortly, never crash the loop
                self._settled(outbox, event, exc)

    def _settled(self, outbox: Outbox, event: CacheInvalidated, error: BaseException | None) -> None:
        """The broker has `event` (its outbox row can go), or the send failed (past the producer's
        request timeout, say): it is queued again; the outbox row stays until some node relays it."""
        if error is None:
            if event.attempt == 1:  # the one L3 recorded with the write
                self._acknowledged.append(event.event_id)
            return
        self.publish_errors += 1
        outbox.send_failures += 1
        log.warning("invalidation publish failed; retrying", extra={"error": repr(error)})
        outbox.invalidation(event, delay_ms=_REPUBLISH_DELAY_MS)

    async def sweep_outbox(self) -> None:
        """Every outbox_sweep_ms: forget the invalidations the broker acknowledged, and relay (publish,
        acknowledged, then forget) those still there past outbox_relay_after_ms, whoever wrote them."""
        s, publisher = self.settings, self.announcer

        # The rows a relay takes are locked until the broker has them: bounded, so a relay cut off from
        # the broker midway leaves them to the others soon.
        send_timeout_s = max(1.0, s.outbox_relay_after_ms / 1000)

        async def send(items: list[tuple[str, bytes]]) -> None:
            async with asyncio.timeout(send_timeout_s):
                await publisher.publish_encoded(CacheInvalidated, items, wait=True)

        while True:
            await asyncio.sleep(s.outbox_sweep_ms / 1000)
            done, self._acknowledged = self._acknowledged, []
            try:
                if done:
                    await self.l3.outbox_sent(done)
                if self._reaches_broker():
                    relayed = await self.l3.relay_outbox(send, older_than_ms=s.outbox_relay_after_ms)
                    self.cache.outbox.relayed += relayed
            except Exception as exc:  # L3 or the broker away: the rows wait (a forgotten id is relayed)
                log.warning("outbox sweep failed; trying again", extra={"error": repr(exc)})

    def _reaches_broker(self) -> bool:
        """Whether the broker answered this node's fetches lately: a node cut off from it leaves the
        relay to the others (it would hold the rows it took until its send timed out)."""
        heard = self.cache.placement.heard_at_ms
        return heard is not None and self.cache.wall_ms() - heard <= self.settings.outbox_relay_after_ms / 2

    async def _publish_access(self, outbox: Outbox) -> None:
        node, per_record = self.settings.node_id, self.settings.access_batch_events
        records = outbox.take_access()
        for start in range(0, len(records), _ACCESS_SLICE):
            chunk = records[start : start + _ACCESS_SLICE]
            try:
                if per_record > 1:
                    # One batch record per partition (and per `per_record` events): per-key order holds.
                    # Encoded straight from the records, no model per event; one producer batch each.
                    keys = [r.key for r in chunk]
                    partitions = await self.publisher.partitions_of_keys(CacheAccessBatch, keys)
                    groups = partition_groups(chunk, partitions, per_record)
                    items = [(group[0].key, access_batch_json(group, node)) for group in groups]
                    await self.publisher.publish_encoded(CacheAccessBatch, items, wait=False)
                else:
                    await self.publisher.publish_many([record.event(node) for record in chunk], wait=False)
            except Exception as exc:  # access events are statistics: drop, count, go on
                self.publish_errors += len(chunk)
                log.warning("access events publish failed; dropped", extra={"error": repr(exc)})
            await asyncio.sleep(0)  # let waiting requests in between slices: no long loop stalls

    async def drain(self) -> None:
        """On the way out: the second deletes still pending go now rather than be lost."""
        outbox = self.cache.outbox
        deadline = time.monotonic() + 1.0
        while outbox.next_due_ms() is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            await self._publish_due(outbox)
        await self._publish_access(outbox)
