"""The consuming half of the Kafka edge (the publisher is `publisher.py`): at-least-once, offsets
committed only after the handler is done; duplicates dropped by `event_id`; transient failures retried
without moving on; what cannot be decoded or applied dead-lettered to `<topic>.dlq.v1` with the reason
in headers. What to do with each record is decided in `consume.py`; this carries it out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg
from aiokafka import (
    AIOKafkaConsumer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import CommitFailedError, KafkaError

from schemas.events import Event
from schemas.topics import dlq_name, qualified
from services.runtime import metrics, tracing
from services.runtime.consume import (
    Abandon,
    Applied,
    Apply,
    Attempts,
    DeadLetter,
    Dedupe,
    RetryPolicy,
    admit,
    after_attempt,
    backoff_s,
)
from services.runtime.deadletter import dead_letter
from services.runtime.publisher import RECORD_OVERHEAD_BYTES, EventPublisher
from services.runtime.settings import KafkaSettings

log = logging.getLogger(__name__)


_APPLIED = Applied()


class TransientError(Exception):
    """Raise from a handler to say "try again later, do not dead-letter"."""


# Failures that say nothing about the event itself: retry until they clear.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    KafkaError,
)


@dataclass(slots=True)
class Delivery:
    """One decoded event as the handler sees it. (Not frozen: a frozen dataclass's `__init__` sets
    each field through `object.__setattr__`, 1.1 against 0.4 us, and every record builds one.)"""

    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    trace_id: str | None = None


Handler = Callable[[Delivery], Awaitable[None]]


class _CommitOnRevoke(ConsumerRebalanceListener):
    """Hands the consumer's rebalance callbacks to it; aiokafka waits for them before re-joining."""

    def __init__(self, consumer: EventConsumer) -> None:
        self._consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._consumer._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._consumer._on_assigned(set(assigned))


class EventConsumer:
    """Consumes `topics` (catalogue names, qualified with the namespace) in `group_id`."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: Sequence[str],
        group_id: str,
        handler: Handler,
        dead_letters: EventPublisher,
        *,
        auto_offset_reset: str = "earliest",
        transient_errors: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
        max_backoff_s: float = 5.0,
        on_revoked: Callable[[set[TopicPartition]], None] | None = None,
        on_assigned: Callable[[set[TopicPartition]], None] | None = None,
    ) -> None:
        """`on_revoked` / `on_assigned`: a rebalance's two halves, for a handler that keeps state per
        key. `on_revoked` is told which partitions go, once the record in flight is applied and their
        offsets are committed; `on_assigned` what this member holds from then on. Kafka's (eager)
        rebalance revokes every partition and assigns some back, so what moved to another owner is
        revoked minus assigned."""
        self._settings = settings
        self.topics = [qualified(t, settings.topic_namespace) for t in topics]
        self.group_id = group_id
        self._handler = handler
        self._on_revoked_hook = on_revoked
        self._on_assigned_hook = on_assigned
        self._dlq = dead_letters
        self._auto_offset_reset = auto_offset_reset
        self._policy = RetryPolicy(
            settings.handler_max_attempts, transient_errors, max_backoff_s=max_backoff_s
        )
        # Transient errors are caught even where they are not `Exception`s; the policy tells them apart.
        self._catch: tuple[type[BaseException], ...] = (Exception, *transient_errors)
        self._dedupe = Dedupe(settings.dedupe_window)
        self._consumer: AIOKafkaConsumer | None = None
        # Next offset to commit per partition: everything below it has been applied.
        self._done: dict[TopicPartition, int] = {}
        # Held while one record is applied or offsets are committed, so that a revoke waits for the
        # record in flight and commits past it instead of leaving it to be applied twice.
        self._lock = asyncio.Lock()
        # Partitions revoked since the batch being processed was fetched: the rest of that batch on
        # them belongs to their next owner, who reads it again from the committed offset.
        self._revoked: set[TopicPartition] = set()
        # The commit of the last polled batch, left to run while the next one is fetched and applied:
        # a commit is a round trip to the coordinator, and waiting for it each poll bounded a
        # consumer to one max_poll_records batch per round trip.
        self._committing: asyncio.Task[None] | None = None
        self._stopping = False
        self.last_poll_monotonic: float | None = None
        self.processed = 0
        self.seen = 0  # records taken, whatever became of them (applied, duplicate, dead-lettered)
        # The next offset to apply, per partition (kept past commits): the lag the metrics report.
        self.applied: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        if self._consumer is not None:
            return
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._settings.bootstrap,
            client_id=self._settings.client_id,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._auto_offset_reset,
            max_poll_records=self._settings.max_poll_records,
            session_timeout_ms=self._settings.session_timeout_ms,
            heartbeat_interval_ms=self._settings.heartbeat_interval_ms,
            request_timeout_ms=self._settings.request_timeout_ms,
            fetch_max_wait_ms=self._settings.fetch_max_wait_ms,
            max_partition_fetch_bytes=max(
                1024 * 1024, self._settings.max_event_bytes + RECORD_OVERHEAD_BYTES
            ),
        )
        consumer.subscribe(self.topics, listener=_CommitOnRevoke(self))
        await consumer.start()
        self._consumer = consumer
        self._stopping = False
        metrics.CONSUMERS.add(self)

    async def stop(self) -> None:
        self._stopping = True
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await self._commit_settled()
            async with self._lock:
                await self._commit(consumer)
        finally:
            await consumer.stop()

    async def wait_positioned(self) -> None:
        """Resolve the position of every assigned partition (with `latest`: the log end now), so an
        event published after this returns is read. For callers that must not miss what they send next
        (tests, probes); `run` does not need it."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        for tp in self._consumer.assignment():
            await self._consumer.position(tp)

    def partition_count(self, topic: str) -> int:
        """Partitions of `topic` (qualified) as this consumer's metadata knows them; 0 if unknown."""
        parts = self._consumer.partitions_for_topic(topic) if self._consumer is not None else None
        return len(parts) if parts else 0

    def lag(self) -> dict[str, int]:
        """Records in the broker not applied yet, per topic: the log end as of the last fetch minus the
        next offset to apply, over the partitions this consumer holds."""
        consumer, lag = self._consumer, dict[str, int]()
        if consumer is None:
            return lag
        for tp in consumer.assignment():
            end, applied = consumer.highwater(tp), self.applied.get(tp)
            if end is not None and applied is not None:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - applied)
        return lag

    def health(self) -> dict[str, object]:
        assignment = sorted(str(tp) for tp in self._consumer.assignment()) if self._consumer else []
        return {
            "group": self.group_id,
            "running": self._consumer is not None,
            "assigned": assignment,
            "processed": self.processed,
            "seen": self.seen,
        }

    async def run(self) -> None:
        """Poll, apply, commit; until `stop()` or cancellation."""
        if self._consumer is None:
            raise RuntimeError("consumer is not started")
        consumer = self._consumer
        while not self._stopping:
            batches = await consumer.getmany(
                timeout_ms=self._settings.poll_timeout_ms, max_records=self._settings.max_poll_records
            )
            # getmany hands out records of the current assignment only; from here on a revoke
            # fences the partitions it takes.
            self._revoked = set()
            self.last_poll_monotonic = time.monotonic()
            for tp, records in batches.items():
                for record in records:
                    async with self._lock:
                        if tp in self._revoked:
                            break
                        await self._process(record)
                        self._done[tp] = record.offset + 1
                if tp in self._done:
                    self.applied[tp] = self._done[tp]
            self._commit_in_background(consumer)

    def _commit_in_background(self, consumer: AIOKafkaConsumer) -> None:
        """Commit what was applied, without waiting; if the previous commit is still on its way,
        what was applied since waits for the next poll (it must not overtake that one)."""
        if self._committing is not None and not self._committing.done():
            return
        if not self._done:
            return
        self._committing = asyncio.create_task(self._commit(consumer), name=f"commit {self.group_id}")

    async def _commit_settled(self) -> None:
        """Wait for the commit in flight, if any, so that a later one cannot land before it (as
        long as a revoke may wait; aiokafka orders commits by its own lock in any case)."""
        task = self._committing
        if task is None or task.done():
            return
        try:
            async with asyncio.timeout(self._settings.session_timeout_ms / 2000):
                await asyncio.shield(task)
        except TimeoutError:
            log.warning("an offset commit is still on its way; going on without it")
        except Exception:
            log.exception("background offset commit failed")

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before `revoked` go: wait for the record in flight, commit what was applied on them."""
        # The group waits for this member only so long (the rebalance timeout, which aiokafka sets to
        # the session timeout): a handler stuck past half of it is left running, and its record
        # goes uncommitted, to be applied again by the next owner and dropped there by event_id.
        held = True
        try:
            async with asyncio.timeout(self._settings.session_timeout_ms / 2000):
                await self._lock.acquire()
        except TimeoutError:
            held = False
            log.warning("a handler outlived the revoke; its record will be redelivered")
        try:
            self._revoked |= revoked
            await self._commit_settled()
            await self._commit_revoked(revoked)
            if self._on_revoked_hook is not None and revoked:
                self._on_revoked_hook(revoked)
        finally:
            if held:
                self._lock.release()

    async def _commit_revoked(self, revoked: set[TopicPartition]) -> None:
        offsets = {tp: self._done.pop(tp) for tp in revoked if tp in self._done}
        consumer = self._consumer
        if not offsets or consumer is None:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # This member was already out of the group: the next owner re-reads from the last
            # commit and the duplicates are dropped by event_id.
            log.warning("commit on revoke failed; records will be redelivered", extra={"error": str(exc)})
            return
        log.info("committed on revoke", extra={"offsets": {str(tp): off for tp, off in offsets.items()}})

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        # Nothing to load: the fetcher starts every assigned partition at its committed offset.
        log.info("partitions assigned", extra={"assigned": sorted(str(tp) for tp in assigned)})
        if self._on_assigned_hook is not None:
            self._on_assigned_hook(assigned)

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        if not self._done:
            return
        offsets, self._done = self._done, {}
        assigned = consumer.assignment()
        offsets = {tp: off for tp, off in offsets.items() if tp in assigned}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance took the partitions; the new owner re-reads from the last commit and the
            # duplicates are dropped downstream by event_id.
            log.warning("offset commit failed; records will be redelivered", extra={"error": str(exc)})

    async def _process(self, record: ConsumerRecord[bytes, bytes]) -> None:
        self.seen += 1
        admission = admit(record.value, self._settings.max_event_bytes, self._dedupe)
        if not isinstance(admission, Apply):
            if isinstance(admission, DeadLetter):
                await self._dead_letter(record, admission)
            metrics.child(metrics.EVENTS_CONSUMED, record.topic, self.group_id, admission.outcome).inc()
            return
        event = admission.event
        headers = tuple(record.headers or ())
        verdict: Applied | DeadLetter = _APPLIED
        with tracing.consumer_span(record.topic, headers) as span:
            delivery = Delivery(
                event=event,
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                key=record.key,
                headers=headers,
                timestamp_ms=record.timestamp,
                trace_id=tracing.trace_id_of(span),
            )
            started = time.perf_counter()
            try:
                await self._handler(delivery)
            except self._catch as exc:
                verdict = await self._apply_again(delivery, record, exc)
            else:
                # The usual case, without the retry bookkeeping.
                metrics.child(metrics.HANDLER_SECONDS, record.topic, self.group_id).observe(
                    time.perf_counter() - started
                )
        self._dedupe.remember(event.event_id)
        self.processed += 1
        metrics.child(metrics.EVENTS_CONSUMED, record.topic, self.group_id, verdict.outcome).inc()

    async def _apply_again(
        self, delivery: Delivery, record: ConsumerRecord[bytes, bytes], first_error: BaseException
    ) -> Applied | DeadLetter:
        """The handler raised `first_error`: retry, dead-letter or give up, as the policy says."""
        attempts = Attempts()
        error: BaseException | None = first_error
        while True:
            verdict = after_attempt(error, attempts, self._policy, stopping=self._stopping)
            if isinstance(verdict, Applied):
                return verdict
            if isinstance(verdict, Abandon):
                raise verdict.error
            if isinstance(verdict, DeadLetter):
                log.error("handler failed; dead-lettering", extra={"topic": record.topic}, exc_info=error)
                await self._dead_letter(record, verdict)
                return verdict
            if verdict.transient:
                log.warning(
                    "transient failure; retrying",
                    extra={"topic": record.topic, "offset": record.offset, "error": repr(error)},
                )
                await asyncio.sleep(verdict.backoff_s)
            attempts = verdict.attempts
            started, error = time.perf_counter(), None
            try:
                await self._handler(delivery)
            except self._catch as exc:
                error = exc
            else:
                metrics.child(metrics.HANDLER_SECONDS, record.topic, self.group_id).observe(
                    time.perf_counter() - started
                )

    async def _dead_letter(self, record: ConsumerRecord[bytes, bytes], verdict: DeadLetter) -> None:
        headers = dead_letter(record, verdict.kind, verdict.reason, self.group_id)
        # Waits for the acknowledgement: the source offset is committed only once the DLQ holds it.
        attempt = 0
        while True:
            try:
                await self._dlq.publish_raw(dlq_name(record.topic), record.key, record.value, headers)
                return
            except (KafkaError, OSError) as exc:
                if self._stopping:
                    raise
                log.warning("dead-letter publish failed; retrying", extra={"error": repr(exc)})
                attempt += 1
                await asyncio.sleep(backoff_s(attempt, 0.1, self._policy.max_backoff_s))
