"""The streams worker as a service: creates its topics, runs the faust app (`StreamsApp`) as a loop
of the common lifecycle, and serves its health, metrics and pages the way every service does."""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, Counter

from schemas.topics import BY_NAME
from services.runtime import clients
from services.runtime.service import Loop, Service
from services.runtime.topics import ensure_topics
from streams import faust_adapter
from streams import web as pages
from streams.app import StreamsApp
from streams.recovery_watch import RecoveryWatch
from streams.settings import StreamsSettings
from streams.topology import internal_topics, names

log = logging.getLogger(__name__)

RECOVERY_RESTARTS = Counter(
    "cachemesh_streams_recovery_restarts_total",
    "Changelog recoveries restarted by the watchdog after reading nothing for recovery_stall_s",
)
# How often the watchdog looks at the recovery (a fraction of any sensible stall period).
_WATCH_INTERVAL_S = 1.0


async def prepare(settings: StreamsSettings) -> int:
    """Creates the topics; returns the partition count of the source topic."""
    bootstrap, namespace = settings.kafka.bootstrap, settings.kafka.topic_namespace
    if settings.create_topics:
        await ensure_topics(bootstrap, namespace)
    count = settings.source_partitions or await clients.partition_count(
        bootstrap, names(settings).access, "cachemesh-streams-setup"
    )
    count = count or BY_NAME["cache.access.v1"].partitions
    if settings.create_topics:
        await ensure_topics(bootstrap, namespace, internal_topics(settings, count))
    changelog = names(settings).ingest_table
    have = await clients.partition_count(bootstrap, changelog, "cachemesh-streams-setup")
    if have and have != count:
        raise SystemExit(
            f"{changelog} has {have} partitions but the source topic has {count}; "
            "they must match (delete the changelog or set CACHEMESH_STREAMS_SOURCE_PARTITIONS)"
        )
    return count


class StreamsService(Service):
    name = "streams"

    def __init__(self, settings: StreamsSettings) -> None:
        super().__init__(settings)
        self.streams_settings = settings
        self._streams: StreamsApp | None = None
        self.recovery_watch = RecoveryWatch(settings.recovery_stall_s, settings.recovery_restarts)

    @property
    def streams(self) -> StreamsApp:
        if self._streams is None:
            raise RuntimeError("streams is not started")
        return self._streams

    async def open(self, stack: AsyncExitStack) -> None:
        settings = self.streams_settings
        source_count = await prepare(settings)
        # The tables live in memory and come back from their changelogs: a scratch directory will do.
        data_dir = settings.data_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="cachemesh-streams-")
        )
        # Built here, not in __init__: faust binds its services to the running event loop.
        self._streams = StreamsApp(settings, source_count=source_count, data_dir=data_dir)
        REGISTRY.register(self._streams.faust_registry)
        stack.callback(REGISTRY.unregister, self._streams.faust_registry)
        log.info(
            "starting the streams worker", extra={"app_id": self.streams.names.app_id, "data_dir": data_dir}
        )

    def loops(self) -> list[Loop]:
        return [self._run_app, self._watch_recovery]

    async def _watch_recovery(self) -> None:
        """Restarts a changelog recovery that has stopped reading (faust's own restart, as on a new
        rebalance); exits the worker when restarts do not help either."""
        watch = self.recovery_watch
        interval = min(_WATCH_INTERVAL_S, watch.stall_after_s / 4)
        while True:
            await asyncio.sleep(interval)
            recovery = faust_adapter.recovery(self.streams.app)
            remaining = recovery.active_remaining_total() if recovery.in_recovery else 0
            verdict = watch.observe(time.monotonic(), recovery.in_recovery, remaining)
            if verdict == "restart":
                RECOVERY_RESTARTS.inc()
                log.warning(
                    "changelog recovery read nothing; restarting it",
                    extra={
                        "stalled_s": watch.stall_after_s,
                        "remaining": remaining,
                        "restarts": watch.restarts,
                    },
                )
                recovery.signal_recovery_start.set()  # what a new assignment does: seek, resume, read
            elif verdict == "give_up":
                raise RuntimeError(
                    f"changelog recovery stalled with {remaining} records to read after "
                    f"{watch.give_up_after} restarts; exiting for the supervisor to start the worker again"
                )

    async def _run_app(self) -> None:
        """Runs the faust app until the service stops; its stopping by itself (a crash) is fatal.
        `start` returns once the tables are recovered; until then /healthz says not recovered."""
        app = self.streams.app
        try:
            await app.start()
            await app.wait_until_stopped()
        finally:
            # Commits what was acknowledged and flushes the producer, also when cancelled mid-start.
            await app.stop()
        raise RuntimeError(f"the faust app stopped by itself ({app.state})") from app.crash_reason

    async def checks(self) -> dict[str, Any]:
        if self._streams is None:
            return {"running": False}
        report = self._streams.health()
        report.pop("healthy")
        report.pop("service")
        report["recovery_restarts"] = self.recovery_watch.restarts
        return report

    def routes(self) -> Sequence[web.AbstractRouteDef]:
        return pages.routes(self.streams)
