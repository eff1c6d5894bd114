"""The consumers `bench/stream_floor.py` times, one per process: each reads a topic from its start until it
has seen N records, then prints one JSON line {"records", "seconds", "cpu_s"} timed from the first record
to the N-th (start-up and the group join left out). Run by the bench, not by hand:
`python -m bench._floor_consumers KIND BOOTSTRAP TOPIC N`. The quixstreams kind runs in its own
interpreter (`.venv-quix`, `make quix-venv`), since quixstreams pins a pydantic older than the mesh's;
it imports nothing of cachemesh."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
import uuid
from typing import Any


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Clock:
    """From the first record to the N-th; prints the result and ends the process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0
        self.t0 = 0.0
        self.cpu0 = 0.0

    def tick(self, k: int = 1) -> None:
        if self.seen == 0:
            self.t0, self.cpu0 = time.perf_counter(), _cpu_s()
        self.seen += k
        if self.seen >= self.n:
            out = {
                "records": self.seen,
                "seconds": time.perf_counter() - self.t0,
                "cpu_s": _cpu_s() - self.cpu0,
            }
            print(json.dumps(out), flush=True)
            os._exit(0)


async def _aiokafka(bootstrap: str, topic: str, n: int, decode: bool) -> None:
    from aiokafka import AIOKafkaConsumer

    decode_event: Any = None
    if decode:
        from services.runtime.codec import decode_event
    clock = _Clock(n)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"floor-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    while True:
        for records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
            if decode_event is not None:
                for r in records:
                    decode_event(r.value, 1 << 20)
            clock.tick(len(records))


def _faust(bootstrap: str, topic: str, n: int, batch: bool, own_buffers: bool) -> None:
    """An agent that only counts, on the settings the streams worker runs with (streams/app.py), or
    with faust's own buffer sizes."""
    import faust

    clock = _Clock(n)
    buffers: dict[str, Any] = (
        {"stream_buffer_maxsize": 256, "broker_max_poll_records": 256} if own_buffers else {}
    )
    app = faust.App(
        f"floor-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        stream_wait_empty=False,
        **buffers,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        autodiscover=False,
        worker_redirect_stdouts=False,
    )
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")

    if batch:

        async def count(stream: Any) -> None:
            async for values in stream.take(1000, within=0.05):
                clock.tick(len(values))

    else:

        async def count(stream: Any) -> None:
            manual = stream.noack()
            async for event in manual.events():
                await manual.ack(event)
                clock.tick()

    app.agent(source, name="floor.count")(count)
    worker = faust.Worker(app, loglevel="warning", quiet=True)
    worker.execute_from_commandline()


def _quix(bootstrap: str, topic: str, n: int, window: bool) -> None:
    """quixstreams' StreamingDataFrame: a count per record, or its own 1 s tumbling-window count."""
    from quixstreams import Application

    clock = _Clock(n)
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"floor-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        state_dir=f"/tmp/floor-quix-{uuid.uuid4().hex[:8]}",
        loglevel="WARNING",
    )
    source = app.topic(topic, key_deserializer="bytes", value_deserializer="bytes")
    sdf = app.dataframe(source)
    if window:
        sdf = sdf.apply(lambda value: 1).tumbling_window(1000).count().current()
    sdf = sdf.update(lambda value: clock.tick())
    app.run()


def main() -> None:
    kind, bootstrap, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.argv = [*sys.argv[:1], "worker"]  # faust's Worker reads the command line
    if kind in ("aiokafka", "aiokafka+decode"):
        asyncio.run(_aiokafka(bootstrap, topic, n, decode=kind.endswith("decode")))
    elif kind in ("faust", "faust-take", "faust-defaults"):
        _faust(bootstrap, topic, n, batch=kind == "faust-take", own_buffers=kind != "faust-defaults")
    elif kind in ("quix", "quix-window"):
        _quix(bootstrap, topic, n, window=kind == "quix-window")
    else:
        raise SystemExit(f"unknown consumer {kind!r}")


if __name__ == "__main__":
    main()
