"""Where a streams worker's CPU goes per access, without Kafka or faust: the two window stages driven
in one process on the `bench.streams` traffic (the Mooncake replay's keys, nearly every access a
distinct key), with the JSON encoding and decoding the worker does between them.

Rows: decoding the source record, stage 1's `Ingest.apply`, closing panes (partials and progress
encoded for the hand-off), stage 2 (hand-off decoded, partials merged and written to the changelog,
windows and drift clusters computed and encoded). The baseline is `streams.offline.offline_windows`
on the same accesses: the window maths alone. What the live worker spends beyond these rows is
faust, aiokafka and the broker (`bench.streams` measures the whole). Each stage is measured under
Python's own GC threshold and under the worker's (`CACHEMESH_STREAMS_GC_THRESHOLD`), side by side.

    python -m bench.streams_stages [--rate 10000] [--seconds 12] [--gc-threshold 50000]
"""

from __future__ import annotations

import gc
import json
import time
import zlib
from typing import Annotated

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from bench.streams import STAMP, _templates
from schemas.events import CacheAccessed
from services.runtime.codec import decode_event
from streams.ingest import Ingest
from streams.merge import Merge
from streams.offline import offline_windows
from streams.records import Partial, decode_handoff
from streams.settings import StreamsSettings

SOURCES = HANDOFF = 6
BASE_MS = 1_767_225_600_000
TICK_MS = 100
PYTHON_GC_THRESHOLD = 700  # CPython's default young-generation threshold


def stages(rate: int, seconds: int) -> tuple[dict[str, float], int, list[CacheAccessed]]:
    """Seconds spent per stage over `rate * seconds` accesses; the outputs; the accesses."""
    encoder = msgspec.json.Encoder()
    templates = _templates(20_000)
    records = []
    for i in range(rate * seconds):
        key, payload, _ = templates[i % len(templates)]
        ts = BASE_MS + i * 1000 // rate
        records.append(
            (zlib.crc32(key) % SOURCES, payload.replace(str(STAMP).encode(), str(ts).encode()), ts)
        )
    ingest, merge = Ingest(lateness_ms=250, idle_ms=1_000), Merge()
    for p in range(SOURCES):
        ingest.assign(p)
    for q in range(HANDOFF):
        merge.assign(q)
    offsets, last_tick, outputs = [0] * SOURCES, BASE_MS, 0
    spent = dict.fromkeys(("decode", "stage 1 apply", "close + hand-off encode", "stage 2"), 0.0)
    accesses: list[CacheAccessed] = []
    for p, payload, ts in records:
        a = time.perf_counter()
        event = decode_event(payload)
        b = time.perf_counter()
        ingest.apply(p, offsets[p], event, ts)
        c = time.perf_counter()
        offsets[p] += 1
        spent["decode"] += b - a
        spent["stage 1 apply"] += c - b
        assert isinstance(event, CacheAccessed)
        accesses.append(event)
        if ts - last_tick < TICK_MS:
            continue
        last_tick = ts
        a = time.perf_counter()
        closing = ingest.close(ts, dict.fromkeys(range(SOURCES), False), SOURCES)
        handoff = [
            (zlib.crc32(pt.routing_key().encode()) % HANDOFF, encoder.encode(pt.to_json()))
            for pt in closing.partials
        ]
        if closing.progress is not None:
            handoff += [(q, encoder.encode(closing.progress.to_json())) for q in range(HANDOFF)]
        for w in closing.writes:
            encoder.encode(w.value)
        b = time.perf_counter()
        for q, value in handoff:
            doc = json.loads(value)
            record = decode_handoff(doc)
            if isinstance(record, Partial):
                for w in merge.apply_partial(q, record, None, as_json=doc["a"]):
                    encoder.encode(w.value)
            elif merge.apply_progress(q, record, None):
                emission = merge.emit(q)
                outputs += len(emission.events)
                for out in emission.events:
                    out.model_dump_json(exclude_none=True)
                for w in emission.writes:
                    encoder.encode(w.value)
        spent["close + hand-off encode"] += b - a
        spent["stage 2"] += time.perf_counter() - b
    return spent, outputs, accesses


def main(
    rate: Annotated[int, typer.Option(help="Accesses per second of event time")] = 10_000,
    seconds: Annotated[int, typer.Option(help="Seconds of event time")] = 12,
    gc_threshold: Annotated[
        int, typer.Option(help="The worker's young-generation GC threshold (its setting by default)")
    ] = StreamsSettings.model_fields["gc_threshold"].default,
) -> None:
    """Each stage under Python's own GC threshold (700) and under the worker's, in one run."""
    thresholds = (PYTHON_GC_THRESHOLD, gc_threshold or PYTHON_GC_THRESHOLD)
    runs = []
    saved = gc.get_threshold()
    try:
        for young in thresholds:
            gc.set_threshold(young, *saved[1:])
            gc.collect()
            spent, outputs, accesses = stages(rate, seconds)
            began = time.perf_counter()
            offline_windows(accesses)
            runs.append((spent, time.perf_counter() - began))
    finally:
        gc.set_threshold(*saved)
    n = len(accesses)
    table = Table(title=f"streams stages: CPU per access, {n:,} accesses at {rate:,}/s, {outputs} outputs")
    table.add_column("stage", justify="left")
    for young in thresholds:
        table.add_column(f"us/access, GC {young:,}", justify="right")
        table.add_column("x offline maths", justify="right")
    rows: dict[str, list[str]] = {}
    for spent, offline_s in runs:
        for name, s in [*spent.items(), ("all stages", sum(spent.values()))]:
            rows.setdefault(name, []).extend([f"{s / n * 1e6:.1f}", f"{s / offline_s:.2f}"])
        rows.setdefault("offline maths (baseline)", []).extend([f"{offline_s / n * 1e6:.1f}", "1.00"])
    for name, cells in rows.items():
        table.add_row(name, *cells)
    Console(width=120).print(table)
    for young, (spent, _) in zip(thresholds, runs, strict=True):
        ceiling = n / sum(spent.values())
        print(f"ceiling of one core on these stages alone, GC {young:,}: {ceiling:,.0f} accesses/s")


if __name__ == "__main__":
    typer.run(main)
