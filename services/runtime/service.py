"""The service base: an async context manager that opens its resources on an `AsyncExitStack`,
runs its background loops in a `TaskGroup` (a crash in one loop stops the service, loudly) and shuts
down idempotently in reverse order. Signals are handled only in `run_service`, called by `__main__`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Self

from aiohttp import web

from services.runtime.kafka import EventConsumer, Handler
from services.runtime.logs import configure_logging
from services.runtime.metrics import MetricsServer
from services.runtime.postgres import Database, apply_migrations
from services.runtime.publisher import EventPublisher
from services.runtime.settings import ServiceSettings
from services.runtime.tracing import configure_tracing

log = logging.getLogger(__name__)

Loop = Callable[[], Coroutine[Any, Any, None]]


class _StopRequested(Exception):
    pass


class Service:
    name: ClassVar[str] = "service"

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self._stack: AsyncExitStack | None = None
        self._stop = asyncio.Event()
        self._running: asyncio.Task[None] | None = None
        self._consumers: list[EventConsumer] = []
        self._db: Database | None = None
        self.metrics_server: MetricsServer | None = None

    # --- for subclasses -------------------------------------------------------------------------

    async def open(self, stack: AsyncExitStack) -> None:
        """Open resources (use the helpers below); each one is closed in reverse order."""

    def loops(self) -> Sequence[Loop]:
        """Background loops to run until stop; consumers opened with `open_consumer` run already."""
        return ()

    async def checks(self) -> dict[str, Any]:
        """Extra health facts; a value of False marks the service unhealthy."""
        return {}

    def routes(self) -> Sequence[web.AbstractRouteDef]:
        """Extra pages served next to /metrics and /healthz."""
        return ()

    async def open_publisher(self, stack: AsyncExitStack) -> EventPublisher:
        publisher = EventPublisher(self.settings.kafka, client_id=f"{self.name}-{self.settings.node_id}")
        await publisher.start()
        stack.push_async_callback(publisher.stop)
        return publisher

    async def open_consumer(
        self,
        stack: AsyncExitStack,
        topics: Sequence[str],
        group_id: str,
        handler: Handler,
        dead_letters: EventPublisher,
        **kwargs: Any,
    ) -> EventConsumer:
        consumer = EventConsumer(self.settings.kafka, topics, group_id, handler, dead_letters, **kwargs)
        await consumer.start()
        stack.push_async_callback(consumer.stop)
        self._consumers.append(consumer)
        return consumer

    async def open_database(self, stack: AsyncExitStack, migrate: bool = True) -> Database:
        db = Database(self.settings.postgres)
        await db.start()
        stack.push_async_callback(db.stop)
        if migrate:
            await apply_migrations(db, self.settings.postgres.cachemesh_embedding_dim)
        self._db = db
        return db

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._stack is not None:
            return
        stack = AsyncExitStack()
        try:
            await self.open(stack)
            server = MetricsServer(
                self.settings.metrics_host, self.settings.metrics_port, self.health, self.routes()
            )
            await server.start()
            stack.push_async_callback(server.stop)
            self.metrics_server = server
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        log.info("started", extra={"service": self.name, "metrics_port": server.port})

    async def run(self) -> None:
        """Runs every loop until `request_stop()`; re-raises the first loop that crashes."""
        if self._stack is None:
            raise RuntimeError(f"{self.name} is not started")
        self._running = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as group:
                for consumer in self._consumers:
                    group.create_task(consumer.run(), name=f"{self.name}:consume:{consumer.group_id}")
                for loop in self.loops():
                    group.create_task(loop(), name=f"{self.name}:{getattr(loop, '__name__', 'loop')}")
                group.create_task(self._wait_for_stop())
        except* _StopRequested:
            pass
        finally:
            self._running = None

    async def _wait_for_stop(self) -> None:
        await self._stop.wait()
        raise _StopRequested

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self.request_stop()
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
            log.info("stopped", extra={"service": self.name})

    def endpoints(self) -> dict[str, str]:
        """What a person opens, by name (an API, its docs, a page) -> URL; the health report lists them
        with the metrics, and `cachemesh up` / `status` print them."""
        return {}

    async def health(self) -> dict[str, Any]:
        report: dict[str, Any] = {"service": self.name, "node_id": self.settings.node_id}
        server = self.metrics_server
        metrics = (
            {}
            if server is None
            else {"metrics": f"http://{self.settings.metrics_host}:{server.port}/metrics"}
        )
        report["endpoints"] = {**self.endpoints(), **metrics}
        healthy = self._stack is not None
        consumers = [c.health() for c in self._consumers]
        if consumers:
            report["consumers"] = consumers
            healthy = healthy and all(c["running"] for c in consumers)
        if self._db is not None:
            report["database"] = await self._db.health()
            healthy = healthy and bool(report["database"])
        extra = await self.checks()
        report.update(extra)
        healthy = healthy and all(v is not False for v in extra.values())
        report["healthy"] = healthy
        # A service that serves, but not all of it, says so with its reasons (`degraded`, a list).
        report["status"] = "unhealthy" if not healthy else "degraded" if report.get("degraded") else "healthy"
        return report


def run_service(factory: Callable[[], Service]) -> None:
    """The body of every `services/<name>/__main__.py`: GC threshold, logs, tracing, signals, run until
    stopped."""
    service = factory()
    configure_gc(service.settings)
    configure_logging(service.name, service.settings.log_level)
    configure_tracing(service.name)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, service.request_stop)
        async with service:
            await service.run()

    with asyncio.Runner(loop_factory=_loop_factory(service.settings.event_loop)) as runner:
        runner.run(main())


def configure_gc(settings: ServiceSettings) -> None:
    """The young-generation threshold of the cyclic GC from `settings.gc_threshold` (0: Python's).
    Process-wide, so set by `run_service` and not by library code (tests run services in one process)."""
    if settings.gc_threshold:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(settings.gc_threshold, older, oldest)


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:  # an install without it: asyncio's loop, said once
            logging.getLogger(__name__).warning("uvloop is not installed; running on asyncio's loop")
            return None
        return uvloop.new_event_loop
    return None
