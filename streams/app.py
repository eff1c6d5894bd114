"""The faust app: thin agents that move records between Kafka and the pure window stages (ingest.py,
merge.py). An offset is committed only once what it counted has been handed on, and the tables come
back from their changelogs on start: docs/streams.md says how. Lifecycle: `streams/service.py`; pages:
`streams/web.py`; faust's private parts: `faust_adapter.py`."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import faust
from aiokafka.errors import KafkaError
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from faust.types import TP, EventT, StreamT
from prometheus_client import CollectorRegistry

from schemas.events import (
    CacheAccessed,
    DriftClustered,
    Event,
    KvBlockStored,
    LatencySpikeDetected,
    RequestPenetrated,
    WindowComputed,
)
from schemas.wire import DecodeError, encode
from services.runtime import clients, tracing
from services.runtime.codec import decode_event
from services.runtime.deadletter import dead_letter
from streams import faust_adapter, metrics
from streams.handoff_gaps import read_handoff, read_range
from streams.ingest import Ingest, IngestCounters
from streams.merge import Merge
from streams.records import (
    Partial,
    TableWrite,
    accesses_of,
    compact_json,
    decode_handoff,
    wall_ms,
)
from streams.settings import StreamsSettings
from streams.spikes import SpikeDetector
from streams.topology import (
    INGEST_TABLE,
    INTERNAL_MAX_MESSAGE_BYTES,
    LATEST_TABLE,
    MERGE_TABLE,
    Names,
    names,
    source_partitions,
)
from streams.windows import pane_start

log = logging.getLogger(__name__)

_MAX_REQUEST_BYTES = 16 * 1024 * 1024
_MAX_BATCH_BYTES = 1024 * 1024
# A partition with nothing new is polled every fetch_max_wait_ms; a poll older than this is stale.
_FETCH_FRESH_MS = 3_000


def record_headers(event: EventT) -> list[tuple[str, bytes]]:
    headers = event.message.headers or ()
    # faust passes aiokafka's (key, value) pairs through; a mapping only if someone built one.
    return list(headers.items()) if isinstance(headers, Mapping) else list(headers)


class StreamsApp:
    """One faust app configured from `StreamsSettings`; `.app` is what `StreamsService` runs."""

    def __init__(
        self,
        settings: StreamsSettings,
        *,
        source_count: int | None = None,
        data_dir: str | None = None,
        clock: Callable[[], int] = wall_ms,
    ) -> None:
        self.settings = settings
        self.names: Names = names(settings)
        self.source_count = source_count or source_partitions(settings)
        self.clock = clock
        self.ingest = Ingest(
            lateness_ms=settings.lateness_ms,
            idle_ms=settings.idle_ms,
            spike_rtt_ms=settings.spike_rtt_ms,
            spikes=SpikeDetector(settings.spike_rtt_ms, settings.spike_cooldown_ms),
        )
        self.merge = Merge(settings.drift_params(), drift_enabled=settings.drift_enabled)
        self.ready = False
        self.recoveries_cut_short = 0
        self.last_window_lag_ms: int | None = None
        self.latest_windows: dict[str, dict[str, Any]] = {}
        self.latest_drift: dict[str, list[dict[str, Any]]] = {}
        # Per source partition, in offset order: (stream, record, start of the pane it counts in).
        self._pending: dict[int, deque[tuple[StreamT, EventT, int]]] = {}
        self._ack_soon: list[tuple[StreamT, EventT]] = []
        self._resend_progress = False
        # Assigned partitions without a committed offset at the last recovery: read again from
        # their start once the rebalance is over (see `_uncommitted`).
        self._rewind: list[TP] = []
        self._last_offset: dict[tuple[str, int], int] = {}
        # Per source partition: the offset the consumer should deliver next (see `_read_skipped`).
        self._expect: dict[int, int] = {}
        self._last_seen_ms: dict[int, int] = {}
        self._reported = IngestCounters()
        self._lock = asyncio.Lock()
        # faust's own sensors (when on) live apart so that several apps can share a process.
        self.faust_registry = CollectorRegistry()
        self.app = self._build_app(data_dir or settings.data_dir)
        self._define()

    # --- wiring ------------------------------------------------------------------------------

    def _build_app(self, data_dir: str | None) -> faust.App:
        s = self.settings
        brokers = [f"kafka://{host.strip()}" for host in s.kafka.bootstrap.split(",") if host.strip()]
        conf: dict[str, Any] = {
            "broker": brokers,
            "store": "memory://",
            "topic_partitions": s.partitions,
            "topic_allow_declare": True,
            "processing_guarantee": "at_least_once",
            # Records are acknowledged in batches after their state is safe; a stop or rebalance
            # must not wait for the rest: they are read again and skipped by offset.
            "stream_wait_empty": False,
            "table_standby_replicas": 0,
            "broker_session_timeout": s.session_timeout_ms / 1000.0,
            "broker_heartbeat_interval": min(3.0, s.session_timeout_ms / 3000.0),
            # One consumer feeds both stages: a deep stage-1 buffer would queue the hand-off
            # records behind thousands of accesses (head-of-line), so keep it shallow.
            "stream_buffer_maxsize": s.stream_buffer,
            "broker_max_poll_records": s.stream_buffer,
            "producer_acks": -1,
            "producer_linger_ms": s.kafka.linger_ms,
            "producer_max_request_size": _MAX_REQUEST_BYTES,
            # aiokafka builds one batch per partition at a time and makes a sender wait until a
            # full one is on the wire: room for many partials per round trip.
            "producer_max_batch_size": _MAX_BATCH_BYTES,
            "consumer_max_fetch_size": _MAX_REQUEST_BYTES,
            # Pages are served by the service's metrics server, like every other service's.
            "web_enabled": False,
            "autodiscover": False,
            "worker_redirect_stdouts": False,
        }
        if data_dir:
            conf["datadir"] = data_dir
        app = faust.App(self.names.app_id, **conf)
        if s.faust_metrics:
            app.monitor = PrometheusMonitor(
                metrics=FaustMetrics.create(self.faust_registry, "cachemesh_streams_faust")
            )
        return app

    def _define(self) -> None:
        app, n, s = self.app, self.names, self.settings
        self.source = app.topic(n.access, n.kv, key_serializer="raw", value_serializer="raw")
        self.handoff = app.topic(
            n.handoff, partitions=s.partitions, internal=True, key_serializer="raw", value_serializer="json"
        )
        table_args: dict[str, Any] = {
            "schema": faust.Schema(key_serializer="json", value_serializer="json"),
            "extra_topic_configs": {"max.message.bytes": str(INTERNAL_MAX_MESSAGE_BYTES)},
        }
        self.ingest_table = app.Table(INGEST_TABLE, partitions=self.source_count, **table_args)
        self.merge_table = app.Table(MERGE_TABLE, partitions=s.partitions, **table_args)
        self.latest_table = app.Table(LATEST_TABLE, partitions=s.partitions, **table_args)
        self.ingest_table.on_recover(self._on_recovered)

        async def ingest(stream: StreamT) -> None:
            manual = stream.noack()  # type: ignore[attr-defined]
            async for event in manual.events():
                with tracing.consumer_span(event.message.topic, record_headers(event)):
                    await self.on_source_record(manual, event)

        async def merge(stream: StreamT) -> None:
            async for event in stream.events():
                with tracing.consumer_span(event.message.topic, record_headers(event)):
                    await self.on_handoff_record(event)

        app.agent(self.source, name=f"{n.app_id}.ingest")(ingest)
        app.agent(self.handoff, name=f"{n.app_id}.merge")(merge)
        app.timer(s.tick_interval_ms / 1000.0)(self.tick)
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]

    # --- stage 1 -----------------------------------------------------------------------------

    async def on_source_record(self, stream: StreamT, event: EventT) -> None:
        message = event.message
        topic, partition, offset = message.topic, message.partition, message.offset
        if topic == self.names.access and not self.ingest.owns(partition):
            # Not ours (revoked while in flight): left unacknowledged, so its owner reads it again.
            metrics.EVENTS.labels("other").inc()
            return
        if topic == self.names.access:
            expect = self._expect.get(partition)
            self._expect[partition] = offset + 1
            if expect is not None and offset > expect:
                await self._read_skipped(partition, expect, offset)
        self._last_offset[(topic, partition)] = offset
        try:
            decoded = decode_event(message.value, self.settings.kafka.max_event_bytes)
        except DecodeError as exc:
            await self._dead_letter(message, exc.kind, exc.reason)
            self._ack_soon.append((stream, event))
            return
        accesses = accesses_of(decoded)
        if not accesses or topic != self.names.access:
            # KV stores only move warm times (kept in memory); anything else is not ours.
            if isinstance(decoded, KvBlockStored):
                self.ingest.apply(partition, offset, decoded, self.clock())
            else:
                metrics.EVENTS.labels("other").inc()
            self._ack_soon.append((stream, event))
            return
        self._last_seen_ms[partition] = now = wall_ms()
        # Acknowledged once the (last) pane it counts in is closed (see `tick`).
        newest = max(access.occurred_at_ms for access in accesses)
        self._pending.setdefault(partition, deque()).append((stream, event, pane_start(newest)))
        # One sample per record: its oldest event's delay (a batch's events arrive together).
        oldest = min(access.occurred_at_ms for access in accesses)
        metrics.INGEST_DELAY.observe(max(0, now - oldest) / 1000)
        await self._applyaccesses_of(partition, offset, accesses)

    async def _applyaccesses_of(self, partition: int, offset: int, accesses: list[CacheAccessed]) -> None:
        """Applies one source record's accesses, then publishes what they detected. The whole record
        is applied before anything is awaited: a tick never sees half a batch."""
        clock, outs = self.clock(), []
        for index, access in enumerate(accesses):
            outs += self.ingest.apply(partition, offset, access, clock, index)
        for out in outs:
            await self.publish(out)
            if isinstance(out, RequestPenetrated):
                metrics.PENETRATIONS.inc()
            elif isinstance(out, LatencySpikeDetected):
                metrics.SPIKES.inc()

    async def _read_skipped(self, partition: int, start: int, end: int) -> None:
        """Applies the source records at [start, end) that faust's consumer skipped. It can drop the
        record at the committed offset right after a recovery and deliver the next ones; once those
        are acknowledged, `Consumer._new_offset` commits past the dropped one (it refuses only a gap
        of two or more at the head), and the record was lost: a kill test missed one access so. Read
        with a consumer of their own, as stage 2 reads skipped hand-off records; a record applied
        before is skipped by its offset. They have no faust message to acknowledge: faust commits past
        them with the records after them, whose panes close after theirs in event order."""
        log.warning(
            "source records skipped by the consumer; reading them again",
            extra={"partition": partition, "from_offset": start, "to_offset": end},
        )
        metrics.EVENTS.labels("reread").inc(end - start)
        records = await read_range(
            self.settings.kafka.bootstrap,
            self.names.access,
            partition,
            start,
            end,
            max_fetch_bytes=_MAX_REQUEST_BYTES,
        )
        for record in records:
            try:
                decoded = decode_event(record.value, self.settings.kafka.max_event_bytes)
            except DecodeError as exc:
                await self._dead_letter(record, exc.kind, exc.reason)
                continue
            await self._applyaccesses_of(partition, record.offset, accesses_of(decoded))

    async def tick(self) -> None:
        """Close the panes the watermarks passed, hand them to stage 2, record the progress, then
        acknowledge the records those panes counted."""
        if not self.ready or self.app.rebalancing:
            # Until faust has sought every partition to its committed offset (the end of the
            # rebalance), records may come from the position before that seek, with gaps where faust
            # dropped some: closing a pane then would make the missing ones late.
            return
        if self._rewind:
            rewind, self._rewind = self._rewind, []
            # seek_wait, not seek: it runs in faust's consumer thread (a seek from this one raced the
            # fetcher there: KeyError in aiokafka's fetched_records, the worker crashed) and it drops
            # faust's read offset for the partition, which would otherwise skip the records again.
            await self.app.consumer.seek_wait(dict.fromkeys(rewind, 0))
            self._forget_reads(tp.partition for tp in rewind if tp.topic == self.names.access)
            self._expect.update((tp.partition, 0) for tp in rewind if tp.topic == self.names.access)
        async with self._lock:
            closing = self.ingest.close(self.clock(), self.caught_up(), self.source_count)
            # One trace per tick: stage 2 continues it in what the hand-off records close.
            trace = tracing.publish_headers(self.names.handoff)
            sent = []
            for partial in closing.partials:
                key = partial.routing_key().encode()
                payload = compact_json(partial.to_json())
                sent.append(await self.send(self.names.handoff, key, payload, headers=trace))
            progress = closing.progress
            if self._resend_progress:
                # After a restart stage 2 may not know where stage 1 stands; tell it once.
                progress = self.ingest.progress(self.source_count)
                self._resend_progress = False
            if progress is not None:
                for q in range(self.settings.partitions):
                    payload = compact_json(progress.to_json())
                    sent.append(await self.send(self.names.handoff, None, payload, q, headers=trace))
            if sent:
                await asyncio.gather(*sent)
            await self.write(self.ingest_table, closing.writes)
            await self._acknowledge()
            self._report_counters()

    async def _acknowledge(self) -> None:
        soon, self._ack_soon = self._ack_soon, []
        for stream, event in soon:
            await stream.ack(event)
        for p, queue in self._pending.items():
            closed = self.ingest.closed_before(p)
            if closed is None:
                continue
            # In offset order: a record waits for the ones before it (commits are contiguous).
            while queue and queue[0][2] < closed:
                stream, event, _ = queue.popleft()
                await stream.ack(event)

    def caught_up(self) -> dict[int, bool]:
        """Per owned source partition: has everything up to its end offset been applied? Asks
        for the end offset of the partition's latest fetch, and trusts it only when that fetch is
        recent and came after the last record was applied (aiokafka does not fetch a partition
        while it holds unread records of it)."""
        now = wall_ms()
        out: dict[int, bool] = {}
        for p in self.ingest.partitions:
            out[p] = False
            tp = TP(self.names.access, p)
            end, polled = faust_adapter.highwater(self.app, tp), faust_adapter.last_poll_ms(self.app, tp)
            if end is None or polled is None or now - polled > _FETCH_FRESH_MS:
                continue
            if polled < self._last_seen_ms.get(p, 0):
                continue  # no fetch since the last record was applied: more may be on the way
            seen = self._last_offset.get((tp.topic, p))
            upto = seen + 1 if seen is not None else (faust_adapter.committed_offset(self.app, tp) or 0)
            out[p] = upto >= end
        return out

    def _forget_reads(self, partitions: Iterable[int]) -> None:
        """The partitions are read again from an earlier offset (a rebalance seeks every one to its
        committed offset; a rewind to its start): what was read before says nothing about being caught
        up now. Kept, the last offset read would make a partition that is being read again look
        consumed to its end, hence idle, and its watermark would follow the others (or the event
        clock) past the panes of the records still to come: those would count as late, lost."""
        for p in partitions:
            self._last_offset.pop((self.names.access, p), None)
            self._last_seen_ms.pop(p, None)

    def _report_counters(self) -> None:
        now, last = self.ingest.counters, self._reported
        for outcome in ("applied", "replayed", "late"):
            delta = getattr(now, outcome) - getattr(last, outcome)
            if delta:
                metrics.EVENTS.labels(outcome).inc(delta)
        self._reported = IngestCounters(now.applied, now.replayed, now.late, now.warm_events)
        metrics.OPEN_PANES.set(self.ingest.open_panes())

    # --- stage 2 -----------------------------------------------------------------------------

    async def on_handoff_record(self, event: EventT) -> None:
        """Applies each hand-off record once, in offset order: a re-delivered one is skipped, and
        the ones faust's consumer skipped are read again first (see `streams.handoff_gaps`)."""
        q, offset = event.message.partition, event.message.offset
        if not self.merge.owns(q) or self.merge.applied(q, offset):
            return  # revoked while in flight (its next owner reads it), or re-delivered
        missed = self.merge.missed(q, offset)
        if missed is not None:
            start, end = missed
            log.warning(
                "hand-off records skipped by the consumer; reading them again",
                extra={"partition": q, "from_offset": start, "to_offset": end},
            )
            records = await read_handoff(
                self.settings.kafka.bootstrap,
                self.names.handoff,
                q,
                start,
                end,
                max_fetch_bytes=_MAX_REQUEST_BYTES,
            )
            for at, value in records:
                await self._apply_handoff(q, at, value)
        await self._apply_handoff(q, offset, event.value)  # type: ignore[arg-type]

    async def _apply_handoff(self, q: int, offset: int, value: dict[str, Any]) -> None:
        record = decode_handoff(value)
        if isinstance(record, Partial):
            # The changelog keeps the aggregate as it came: no second encoding of every key.
            writes = self.merge.apply_partial(q, record, offset, as_json=value["a"])
            await self.write(self.merge_table, writes)
            return
        progress_writes = self.merge.apply_progress(q, record, offset)
        if not progress_writes:
            return
        emission = self.merge.emit(q)
        now = self.clock()
        delivered = [await self.publish(out) for out in emission.events]
        if delivered:
            # The windows reach Kafka before the table records them as emitted: the producer sends
            # each partition's batches on their own, so a crash in between could otherwise persist
            # "emitted" and lose the windows. Now it re-emits them (consumers dedupe by event_id).
            await asyncio.gather(*delivered)
        # The progress entry (with the next hand-off offset) goes last: restored, it stands for
        # every write before it, this emission's included.
        await self.write(self.merge_table, [*emission.writes, *progress_writes])
        for out in emission.events:
            if isinstance(out, WindowComputed):
                await self._record_window(out, now)
            elif isinstance(out, DriftClustered):
                metrics.CLUSTERS.labels(out.pattern).inc()
        self._record_drift([e for e in emission.events if isinstance(e, DriftClustered)])

    async def _record_window(self, window: WindowComputed, now_ms: int) -> None:
        lag_ms = max(0, now_ms - window.window_end_ms)
        self.last_window_lag_ms = lag_ms
        metrics.WINDOW_LAG.observe(lag_ms / 1000.0)
        metrics.LAST_WINDOW_LAG.set(lag_ms / 1000.0)
        metrics.WINDOWS.labels(window.window).inc()
        labels = (window.window, window.shard, window.model or "*")
        metrics.QPS.labels(*labels).set(window.qps)
        metrics.ENTROPY.labels(*labels).set(window.entropy_bits)
        metrics.HIT_RATE.labels(*labels).set(window.hit_rate)
        key = "|".join(labels)
        summary = window.model_dump(mode="json", exclude_none=True)
        self.latest_windows[key] = summary
        # A live view only: kept in the table for faust's web views, not sent to its changelog.
        self.latest_table.data[key] = summary

    def _record_drift(self, clusters: list[DriftClustered]) -> None:
        by_shard: dict[str, list[dict[str, Any]]] = {}
        for cluster in clusters:
            by_shard.setdefault(cluster.shard or "", []).append(
                cluster.model_dump(mode="json", exclude_none=True)
            )
        self.latest_drift.update(by_shard)

    # --- edges -------------------------------------------------------------------------------

    async def publish(self, event: Event) -> Awaitable[Any]:
        """Queues `event` on its output topic; returns the delivery future."""
        topic = self.names.drift if isinstance(event, DriftClustered) else self.names.window
        payload = encode(event)
        limit = self.settings.kafka.max_event_bytes
        while len(payload) > limit and isinstance(event, DriftClustered) and len(event.keys) > 1:
            event = event.model_copy(update={"keys": event.keys[: len(event.keys) // 2]})
            payload = encode(event)
        headers = tracing.publish_headers(topic, [("event_type", str(event.type).encode())])  # type: ignore[attr-defined]
        return await self.send(topic, event.kafka_key().encode(), payload, headers=headers)

    async def write(self, table: Any, writes: Iterable[TableWrite]) -> None:
        """Applies stage writes to the local table and its changelog, on the chosen partition."""
        changelog = table.changelog_topic.get_topic_name()
        for w in writes:
            key = compact_json(w.key)
            if w.value is None:
                table.data.pop(w.key, None)
                await self.send(changelog, key, None, w.partition)
            else:
                table.data[w.key] = w.value
                await self.send(changelog, key, compact_json(w.value), w.partition)

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Awaitable[Any]:
        """Queues bytes on faust's producer (the one its commits flush) without faust's per-message
        channel machinery; returns the delivery future."""
        fut: Awaitable[Any] = await self.app.producer.send(topic, key, value, partition, None, headers)
        return fut

    async def _dead_letter(self, message: Any, kind: str, reason: str) -> None:
        headers = dead_letter(message, kind, reason, self.names.app_id)
        metrics.EVENTS.labels("dead_lettered").inc()
        await (await self.send(self.names.dlq(message.topic), message.key, message.value, headers=headers))

    # --- rebalancing and health ---------------------------------------------------------------

    def _tune_fetch(self) -> None:
        """faust hard-codes a 1.5 s fetch long-poll. aiokafka keeps one fetch in flight per broker
        and leaves out of it the partitions whose records are still being processed, so a fetch of
        only the quiet partitions (the hand-off between ticks, kv.events) would hold back the next
        fetch of the busy ones for up to that long: shorten it."""
        faust_adapter.set_fetch_max_wait(self.app, self.settings.fetch_max_wait_ms)

    async def _on_recovered(self) -> None:
        """After faust rebuilt the tables: load the partitions this worker now owns. Not when the
        recovery was cut short (see `faust_adapter.recovery_read_everything`): the tables then lag
        the committed offsets, and the restarted recovery calls this again once they are whole.
        Until then the worker is not ready, and records of partitions it has not loaded are left
        unacknowledged (stage 1) or read again from the hand-off by offset (stage 2)."""
        self._tune_fetch()
        if not faust_adapter.recovery_read_everything(self.app):
            self.recoveries_cut_short += 1
            log.warning("changelog recovery ended with records unread; waiting for its restart")
            return
        assigned = self.app.consumer.assignment()
        sources = {tp.partition for tp in assigned if tp.topic == self.names.access}
        handoffs = {tp.partition for tp in assigned if tp.topic == self.names.handoff}
        rewind, committed = await self._uncommitted(assigned)
        async with self._lock:
            ingest_items, now = list(self.ingest_table.data.items()), self.clock()
            for p in sorted(sources - set(self.ingest.partitions)):
                self.ingest.load(p, ingest_items, now)
            for p in sorted(set(self.ingest.partitions) - sources):
                self.ingest.revoke(p)
            merge_items = list(self.merge_table.data.items())
            for q in sorted(handoffs - set(self.merge.partitions)):
                self.merge.load(q, merge_items)
            for q in sorted(set(self.merge.partitions) - handoffs):
                self.merge.revoke(q)
            # faust seeks every stream partition to its committed offset once this returns.
            self._forget_reads(sources | set(self._last_seen_ms))
            # faust seeks each to its committed offset: what it must deliver first (0 when rewound).
            self._expect = {p: max(0, committed.get(p, 0)) for p in sources}
            for row in self.latest_table.data.values():
                if isinstance(row, dict) and "window" in row:
                    key = f"{row['window']}|{row['shard']}|{row.get('model', '*')}"
                    self.latest_windows.setdefault(key, row)
            self._resend_progress = True
            self._rewind = rewind
            self.ready = True
        log.info(
            "streams state recovered",
            extra={"source_partitions": sorted(sources), "handoff_partitions": sorted(handoffs)},
        )

    async def _uncommitted(self, assigned: Iterable[TP]) -> tuple[list[TP], dict[int, int]]:
        """The assigned stream partitions without a committed offset, and the source partitions'
        committed offsets (empty when unknown). faust-streaming drops records
        it fetched while its set of active partitions was empty (right after a changelog recovery
        aiokafka takes the empty set for "every partition", and faust discards what comes back);
        its seek to the committed offsets repairs only the partitions that have one, so the others
        are read again from their start once the rebalance is over (a repeat is skipped by offset).
        Asked before the streams resume, so that no commit of this generation hides a gap."""
        topics = {self.names.access, self.names.kv, self.names.handoff}
        try:
            starts = await clients.committed_offsets(
                self.settings.kafka.bootstrap, self.names.app_id, "cachemesh-streams-recovery"
            )
        except (KafkaError, OSError) as exc:
            # tansu answers this request in a form aiokafka cannot parse. Reading every partition again
            # is safe (both stages skip what they applied, by offset); it only costs the re-read.
            log.warning(
                "committed offsets unavailable; reading every partition again", extra={"error": repr(exc)}
            )
            return sorted(tp for tp in assigned if tp.topic in topics), {}
        sources = {p: o for (t, p), o in starts.items() if t == self.names.access}
        rewind = [
            tp for tp in assigned if tp.topic in topics and starts.get((tp.topic, tp.partition), -1) <= 0
        ]
        return sorted(rewind), sources

    async def _on_revoked(self, app: Any, revoked: set[TP], **_: Any) -> None:
        async with self._lock:
            self.ready = False
            for tp in revoked:
                if tp.topic == self.names.access:
                    self.ingest.revoke(tp.partition)
                    # Not acknowledged: the partition's next owner reads these again.
                    self._pending.pop(tp.partition, None)
                elif tp.topic == self.names.handoff:
                    self.merge.revoke(tp.partition)

    def health(self) -> dict[str, Any]:
        app = self.app
        running = bool(app.started) and not app.crashed
        counters = self.ingest.counters
        return {
            "healthy": running and self.ready,
            "service": "streams",
            "app_id": self.names.app_id,
            "running": running,
            "recovered": self.ready,
            "source_partitions": self.ingest.partitions,
            "handoff_partitions": self.merge.partitions,
            "applied": counters.applied,
            "late": counters.late,
            "replayed": counters.replayed,
            "open_panes": self.ingest.open_panes(),
            "windows": self.merge.counters.windows,
            # Partials that reached stage 2 after their windows were emitted, and were dropped: a
            # re-sent duplicate after a restart, or else a lost count.
            "late_partials": self.merge.counters.late_partials,
            "drift_clusters": self.merge.counters.clusters,
            "last_window_lag_ms": self.last_window_lag_ms,
            "recoveries_cut_short": self.recoveries_cut_short,
        }
