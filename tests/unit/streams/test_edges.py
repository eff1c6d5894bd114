"""The worker's edges without a broker: trace context from input to output, the faust adapter on an
app that never started, and the pages served next to /healthz."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from opentelemetry import trace

from schemas.events import CacheAccessed, RequestPenetrated
from services.runtime import tracing
from streams import faust_adapter
from streams.app import StreamsApp
from streams.settings import StreamsSettings
from streams.web import routes

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{PARENT_TRACE}-b7ad6b7169203331-01"


class Recorder:
    """Stands in for the producer: keeps what `StreamsApp.send` was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, bytes]]]] = []

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[None]:
        self.sent.append((topic, list(headers or [])))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _streams() -> StreamsApp:
    return StreamsApp(StreamsSettings(kafka={"topic_namespace": "unit."}), source_count=2)


async def test_a_published_event_carries_a_child_of_the_input_trace() -> None:
    tracing.configure_tracing("streams-test")
    streams, recorder = _streams(), Recorder()
    streams.send = recorder.send  # type: ignore[method-assign]
    event = RequestPenetrated(event_id="p1", occurred_at_ms=1, shard="s0", key="k")
    with tracing.consumer_span(streams.names.access, [("traceparent", PARENT.encode())]) as span:
        await streams.publish(event)
        handling = format(span.get_span_context().span_id, "016x")
    assert trace.get_current_span().get_span_context().is_valid is False
    [(topic, headers)] = recorder.sent
    assert topic == streams.names.window
    carried = dict(headers)["traceparent"].decode().split("-")
    assert carried[1] == PARENT_TRACE
    assert carried[2] not in (PARENT.split("-")[2], handling)  # the publish span's own id
    assert dict(headers)["event_type"] == b"stream.request_penetrated"


async def test_the_adapter_answers_none_before_the_consumer_exists() -> None:
    streams = _streams()
    tp = faust_adapter.TP(streams.names.access, 0)
    assert faust_adapter.aiokafka_consumer(streams.app) is None
    assert faust_adapter.last_poll_ms(streams.app, tp) is None
    assert faust_adapter.highwater(streams.app, tp) is None
    assert faust_adapter.committed_offset(streams.app, tp) is None
    assert faust_adapter.set_fetch_max_wait(streams.app, 100) is False
    assert streams.caught_up() == {}


async def test_a_recovery_faust_completes_with_records_unread_loads_nothing() -> None:
    """faust-streaming swallows a restart while it waits for the end of reading and completes the
    recovery anyway (`faust_adapter.recovery_read_everything`): loading the tables then would
    start from an older snapshot than the committed offsets; the worker waits for the restart."""
    streams = _streams()
    recovery = faust_adapter.recovery(streams.app)
    tp = faust_adapter.TP(streams.ingest_table.changelog_topic.get_topic_name(), 0)
    recovery.active_highwaters[tp] = 10
    recovery.active_offsets[tp] = 4
    assert faust_adapter.recovery_read_everything(streams.app) is False
    await streams._on_recovered()
    assert streams.recoveries_cut_short == 1 and streams.health()["recoveries_cut_short"] == 1
    assert not streams.ready and streams.ingest.partitions == [] and streams.merge.partitions == []
    recovery.active_offsets[tp] = 10
    assert faust_adapter.recovery_read_everything(streams.app) is True


async def test_source_records_the_consumer_skipped_are_read_again_before_the_next(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """faust's consumer can drop the record at the committed offset and deliver the next ones; it then
    commits past the dropped one. Stage 1 expects each partition's offsets in sequence and reads a
    skipped range again (`StreamsApp._read_skipped`) before applying the record that revealed it."""
    from aiokafka import ConsumerRecord

    from schemas.wire import encode

    streams, recorder = _streams(), Recorder()
    streams.send = recorder.send  # type: ignore[method-assign]
    topic = streams.names.access
    t0 = 1_767_225_600_000

    def record(offset: int) -> ConsumerRecord[bytes, bytes]:
        access = CacheAccessed(
            event_id=f"e{offset}", occurred_at_ms=t0 + offset, key=f"k{offset}", hit=True, shard="s0"
        )
        value = encode(access)
        return ConsumerRecord(topic, 0, offset, 0, 0, b"k", value, None, len(b"k"), len(value), ())

    asked: list[tuple[int, int]] = []

    async def read_range(bootstrap: str, t: str, partition: int, start: int, end: int, **_: Any) -> list[Any]:
        asked.append((start, end))
        return [record(o) for o in range(start, end)]

    monkeypatch.setattr("streams.app.read_range", read_range)
    streams.ingest.load(0, [], now_wall_ms=0)
    streams._expect[0] = 5  # the committed offset faust sought to

    class Stream:
        async def ack(self, event: Any) -> None:  # pragma: no cover - acks come at ticks
            pass

    def delivered(offset: int) -> Any:
        r = record(offset)
        message = SimpleNamespace(topic=topic, partition=0, offset=offset, value=r.value, headers=())
        return SimpleNamespace(message=message)

    await streams.on_source_record(Stream(), delivered(7))  # type: ignore[arg-type]
    await streams.on_source_record(Stream(), delivered(8))  # type: ignore[arg-type]
    assert asked == [(5, 7)]
    assert streams.ingest.counters.applied == 4 and streams.ingest.counters.late == 0


async def _get(streams: StreamsApp, path: str) -> tuple[int, Any]:
    app = web.Application()
    app.add_routes(routes(streams))
    resolved = await app.router.resolve(make_mocked_request("GET", path, app=app))
    assert resolved.http_exception is None, path
    response = await resolved.handler(make_mocked_request("GET", path, app=app, match_info=dict(resolved)))
    assert isinstance(response, web.Response) and isinstance(response.text, str)
    return response.status, json.loads(response.text)


async def test_pages_show_the_latest_windows_drift_and_tables() -> None:
    streams = _streams()
    streams.latest_windows = {"b|s|*": {"window": "b"}, "a|s|*": {"window": "a"}}
    streams.latest_drift = {"s": [{"pattern": "pulse"}]}
    streams.latest_table.data["a|s|*"] = {"window": "a"}
    assert await _get(streams, "/windows/") == (200, [{"window": "a"}, {"window": "b"}])
    assert await _get(streams, "/drift/") == (200, {"s": [{"pattern": "pulse"}]})
    status, tables = await _get(streams, "/table/")
    assert status == 200 and {t["name"] for t in tables} == {"ingest", "merge", "latest"}
    assert await _get(streams, "/table/latest/") == (200, {"name": "latest", "help": ""})
    assert (await _get(streams, "/table/nope/"))[0] == 404
    assert await _get(streams, "/table/latest/a|s|*/") == (200, {"window": "a"})
    assert (await _get(streams, "/table/latest/zzz/"))[0] == 404
