"""Every reach of the worker into faust's and aiokafka's private attributes, in one place: what
each one reads or sets, and why no public API does it. Everything else uses their public APIs."""

from __future__ import annotations

from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError
from faust.exceptions import ConsumerNotStarted
from faust.tables.recovery import Recovery
from faust.types import TP


def aiokafka_consumer(app: faust.App) -> AIOKafkaConsumer | None:
    """The aiokafka consumer under faust's consumer thread, or None before it started.

    Private: faust wraps the aiokafka consumer in `Consumer._thread` and only forwards a few of
    its calls (`highwater`, `assignment`, ...); when each partition was last fetched
    (`last_poll_timestamp`) and the fetcher's long-poll are not forwarded, so they need the
    consumer itself."""
    try:
        consumer = app.consumer._thread._ensure_consumer()  # type: ignore[attr-defined]
    except Exception:  # not created yet, or a driver without a consumer thread
        return None
    return consumer if isinstance(consumer, AIOKafkaConsumer) else None


def last_poll_ms(app: faust.App, tp: TP) -> int | None:
    """Wall time (ms) of the latest fetch response for `tp`; None if not assigned or not fetched.

    `last_poll_timestamp` is public on aiokafka's consumer; reaching that consumer is not (above)."""
    consumer = aiokafka_consumer(app)
    if consumer is None:
        return None
    try:
        polled: int | None = consumer.last_poll_timestamp(tp)
    except (AssertionError, KafkaError):  # not assigned (rebalancing)
        return None
    return polled


def highwater(app: faust.App, tp: TP) -> int | None:
    """The end offset of `tp` as of its latest fetch (public: faust's `Consumer.highwater`)."""
    try:
        end: int | None = app.consumer.highwater(tp)
    except (AssertionError, KafkaError, ConsumerNotStarted):  # not assigned, or not started yet
        return None
    return end


def committed_offset(app: faust.App, tp: TP) -> int | None:
    """The offset faust last committed (or read as committed on assignment) for `tp`.

    Private: faust keeps it in `Consumer._committed_offset` and has no accessor; aiokafka's public
    `committed()` asks the broker every time, too slow for a check that runs on every tick."""
    committed: Any = getattr(app.consumer, "_committed_offset", {})
    offset: int | None = committed.get(tp)
    return offset


def set_fetch_max_wait(app: faust.App, wait_ms: int) -> bool:
    """Replaces the fetch long-poll faust hard-codes (1.5 s); True if it could.

    Private: faust builds its aiokafka consumer with `fetch_max_wait_ms=1500` and no setting for
    it, and aiokafka reads the value from `Fetcher._fetch_max_wait_ms` on every fetch with no way
    to change it after construction."""
    fetcher = getattr(aiokafka_consumer(app), "_fetcher", None)
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return False
    fetcher._fetch_max_wait_ms = wait_ms
    return True


def recovery(app: faust.App) -> Recovery:
    """faust's changelog recovery service (`TableManager.recovery`).

    Public on the concrete `TableManager`, but `app.tables` is typed as the `TableManagerT`
    interface, which does not declare it."""
    tables: Any = app.tables
    service: Recovery = tables.recovery
    return service


def recovery_read_everything(app: faust.App) -> bool:
    """Did the changelog recovery that faust just called complete read every record up to the
    highwaters it built? If so, applies what its buffers still hold and says True.

    faust-streaming 0.15's `Recovery._restart_recovery` waits for the end of reading inside
    `try: ... except Exception`, which also swallows the `RebalanceAgain` that a restart (a new
    rebalance, or the recovery watchdog) raises there: it logs "Done reading from changelog topics",
    completes the recovery and calls the tables' recovery callbacks with records still unread, then
    runs the restarted recovery. Tables loaded at that point are an older snapshot than the committed
    offsets stand for (a kill test lost 3-37% of a window's counts so). `need_recovery` and
    `flush_buffers` are public on `Recovery`; reaching it is not (`recovery` above)."""
    service = recovery(app)
    if service.need_recovery():
        return False
    service.flush_buffers()
    return True
