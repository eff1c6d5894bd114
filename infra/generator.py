"""Turns the Mooncake trace into cache events, plants drift patterns, and replays them into Kafka.

Deterministic: the same records and config give the same events, ids included, so a test can
compute the expected windows offline from exactly what it sent. Per Mooncake request, at
`base_ms + timestamp * time_scale`: one `kv_block` access per block (hit or miss from an LRU
prefix-cache replay) and a prompt lookup cascading through the three layers of `penetration.py`
(docs/design.md §2.3); a token-layer miss pays a prefill of 20 ms + 8 us per input token. What each
layer keys on, and where spikes and warm times come from: docs/streams.md ("The event generator").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.paths import shared_data_dir
from schemas.events import CacheAccessed, Event, KvBlockStored, access_batch
from streams.penetration import LruK, model_layer_key, sequence_bucket_label


def default_trace() -> Path:
    return shared_data_dir() / "traces" / "mooncake_synthetic.jsonl"


DEFAULT_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BLOCK_TOKENS = 512
DEFAULT_SERVICES: tuple[str, ...] = tuple(f"svc-{n}" for n in range(8))


@dataclass(frozen=True, slots=True)
class MooncakeRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_mooncake(path: Path | None = None, *, until_ms: int | None = None) -> list[MooncakeRequest]:
    """The trace's requests in order; with `until_ms`, only those before that trace time."""
    out: list[MooncakeRequest] = []
    with (path or default_trace()).open() as fh:
        for line in fh:
            if not line.strip():
                continue
            raw = json.loads(line)
            ts = int(raw["timestamp"])
            if until_ms is not None and ts >= until_ms:
                break
            out.append(
                MooncakeRequest(
                    ts, int(raw["input_length"]), int(raw["output_length"]), tuple(raw["hash_ids"])
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    base_ms: int = DEFAULT_BASE_MS
    time_scale: float = 1.0
    shards: int = 4
    models: tuple[str, ...] = ("llama-7b", "llama-13b")
    model_version: str = "v1"
    services: int = 8
    block_cache_blocks: int = 8_192
    model_layer_capacity: int = 1_024
    sequence_layer_capacity: int = 256
    token_layer_capacity: int = 512
    per_block: bool = True
    cascade: bool = True
    kv_events: bool = True


def _event_id(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


class _Lru:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[object, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def touch(self, key: object) -> None:
        self._items[key] = None
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


class MooncakeReplay:
    """Stateful replay: feed requests in order, get events in time order."""

    def __init__(self, config: ReplayConfig | None = None) -> None:
        self.config = config or ReplayConfig()
        c = self.config
        self._blocks = _Lru(c.block_cache_blocks)
        self._model_layer = _Lru(c.model_layer_capacity)
        self._sequence_layer: dict[str, _Lru] = {}
        self._token_layer = LruK(c.token_layer_capacity, k=2)
        self._index = 0

    def events(self, requests: Iterable[MooncakeRequest]) -> Iterator[Event]:
        for request in requests:
            yield from self.request_events(request)

    def request_events(self, request: MooncakeRequest) -> list[Event]:
        c = self.config
        i = self._index
        self._index += 1
        t = c.base_ms + round(request.timestamp_ms * c.time_scale)
        first = request.hash_ids[0] if request.hash_ids else -(i + 1)
        shard = f"s{first % c.shards}"
        model = c.models[(first // c.shards) % len(c.models)]
        common = {
            "model": model,
            "shard": shard,
            "service": f"svc-{i % c.services}",
            "node_id": f"node-{first % c.shards}",
            "trace_id": f"mooncake-{i}",
            "call_depth": 1 + len(request.hash_ids) % 3,
            "occurred_at_ms": t,
        }
        out: list[Event] = []
        if c.per_block:
            out.extend(self._block_events(i, request, common))
        if c.cascade:
            out.extend(self._cascade_events(i, request, first, common))
        return out

    def _block_events(self, i: int, request: MooncakeRequest, common: dict[str, object]) -> list[Event]:
        resident = 0
        for h in request.hash_ids:
            if h not in self._blocks:
                break
            resident += 1
        missing = len(request.hash_ids) - resident
        out: list[Event] = []
        for j, h in enumerate(request.hash_ids):
            hit = j < resident
            out.append(
                CacheAccessed(
                    event_id=_event_id("block", i, j),
                    key=f"block:{h}",
                    hit=hit,
                    kind="kv_block",
                    tier="l2" if hit else None,
                    latency_ms=0.2 if hit else round(2.0 + 0.5 * missing, 3),
                    token_count=BLOCK_TOKENS,
                    size_bytes=BLOCK_TOKENS * 2 * 4096,
                    **common,  # type: ignore[arg-type]
                )
            )
            self._blocks.touch(h)
        return out

    def _cascade_events(
        self, i: int, request: MooncakeRequest, first: int, common: dict[str, object]
    ) -> list[Event]:
        c = self.config
        model = str(common["model"])
        t = int(common["occurred_at_ms"])  # type: ignore[call-overload]
        query = ",".join(map(str, request.hash_ids)) or f"empty-{i}"
        model_key = model_layer_key(model, c.model_version, query)
        bucket = sequence_bucket_label(request.input_length)
        seq_key = f"seq:{model}:{bucket}:{first}"
        token_key = f"tok:{model}:{first}"
        model_hit = model_key in self._model_layer
        seq_layer = self._sequence_layer.setdefault(bucket, _Lru(c.sequence_layer_capacity))
        seq_hit = (not model_hit) and seq_key in seq_layer
        token_hit = False
        if not model_hit and not seq_hit:
            token_hit = self._token_layer.access(token_key)
        # Latency as each layer saw it: its own lookup, plus everything below it after a miss.
        prefill_ms = 20.0 + 0.008 * request.input_length
        token_ms = 5.0 if token_hit else prefill_ms
        seq_ms = 2.0 if seq_hit else 2.0 + token_ms
        model_ms = 0.3 if model_hit else 0.3 + seq_ms
        lookups: list[tuple[str, str, bool, float, str]] = [("model", model_key, model_hit, model_ms, "l1")]
        if not model_hit:
            lookups.append(("sequence", seq_key, seq_hit, seq_ms, "l2"))
            if not seq_hit:
                lookups.append(("token", token_key, token_hit, token_ms, "l3"))
        out: list[Event] = []
        for layer, key, hit, latency, tier in lookups:
            out.append(
                CacheAccessed(
                    event_id=_event_id("prompt", i, layer),
                    key=key,
                    hit=hit,
                    kind="prompt",
                    tier=tier,  # type: ignore[arg-type]
                    layer=layer,  # type: ignore[arg-type]
                    latency_ms=round(latency, 3),
                    token_count=request.input_length,
                    **common,  # type: ignore[arg-type]
                )
            )
        self._model_layer.touch(model_key)
        seq_layer.touch(seq_key)
        if not model_hit and not seq_hit and not token_hit and c.kv_events:
            out.append(
                KvBlockStored(
                    event_id=_event_id("stored", i),
                    occurred_at_ms=t + round(prefill_ms),
                    block_hash=token_key,
                    model=model,
                    block_size_tokens=BLOCK_TOKENS,
                    node_id=str(common["node_id"]),
                    trace_id=str(common["trace_id"]),
                )
            )
        return out


def mooncake_events(
    path: Path | None = None, *, until_ms: int | None = None, config: ReplayConfig | None = None
) -> list[Event]:
    """The whole replay, in time order (KV stores land after the request that caused them)."""
    events = MooncakeReplay(config).events(read_mooncake(path, until_ms=until_ms))
    return sorted(events, key=lambda e: e.occurred_at_ms)  # stable: same-ms events keep their order


# --- planted drift patterns ------------------------------------------------------------------------


def _planted(
    start_ms: int,
    keys: int,
    duration_ms: int,
    per_key_per_s: int,
    prefix: str,
    service_for: Callable[[int, int], str],
    **fields: Any,
) -> list[CacheAccessed]:
    """`keys` keys, each accessed `per_key_per_s` times a second for `duration_ms`; tick n of key k
    comes from `service_for(n, k)`. Event ids are deterministic, so a re-run produces the same events."""
    step = 1000 // per_key_per_s
    return [
        CacheAccessed(
            event_id=_event_id(prefix, n, k),
            occurred_at_ms=t + k,
            key=f"{prefix}:{k}",
            service=service_for(n, k),
            **fields,
        )
        for n, t in enumerate(range(start_ms, start_ms + duration_ms, step))
        for k in range(keys)
    ]


def pulse_events(
    start_ms: int,
    *,
    keys: int = 12,
    duration_ms: int = 3_000,
    per_key_per_s: int = 10,
    shard: str = "s0",
    service: str = "svc-pulse",
    call_depth: int = 6,
    prefix: str = "pulse",
) -> list[CacheAccessed]:
    """A burst: `keys` new keys hammered from one service for `duration_ms` (docs/design.md §2.4: pulse)."""
    return _planted(
        start_ms, keys, duration_ms, per_key_per_s, prefix, lambda n, k: service,
        hit=False, tier="l1", latency_ms=4.0, shard=shard, call_depth=call_depth, model="llama-7b",
    )  # fmt: skip


def migration_events(
    start_ms: int,
    *,
    keys: int = 12,
    duration_ms: int = 60_000,
    per_key_per_s: int = 2,
    services: Sequence[str] = DEFAULT_SERVICES,
    shard: str = "s0",
    call_depth: int = 4,
    prefix: str = "migr",
) -> list[CacheAccessed]:
    """A steady set of keys whose callers move across every service over time (docs/design.md §2.4:
    migrating)."""
    return _planted(
        start_ms, keys, duration_ms, per_key_per_s, prefix, lambda n, k: services[(n + k) % len(services)],
        hit=True, tier="l1", latency_ms=0.5, shard=shard, call_depth=call_depth, model="llama-13b",
    )  # fmt: skip


def merge_by_time(*streams: Iterable[Event]) -> list[Event]:
    """One time-ordered list; events at the same millisecond keep their order within a stream."""
    return list(heapq.merge(*streams, key=lambda e: e.occurred_at_ms))


# --- producing -----------------------------------------------------------------------------------


async def produce(
    events: Sequence[Event],
    bootstrap: str,
    namespace: str = "",
    *,
    speed: float | None = None,
    rate_per_s: float | None = None,
    batch: int = 1,
) -> float:
    """Sends `events` in order to their topics; paced at `speed` x event time or at `rate_per_s`,
    as fast as possible when neither is set. With `batch` > 1, accesses go out as `CacheAccessBatch`
    records of up to `batch` events of one partition each (what tiers sends), flushed before any
    other event and whenever the pace waits. Returns the seconds it took."""
    from services.runtime.publisher import EventPublisher
    from services.runtime.settings import KafkaSettings

    publisher = EventPublisher(KafkaSettings(bootstrap=bootstrap, topic_namespace=namespace, linger_ms=5))
    await publisher.start()
    pending: dict[int, list[CacheAccessed]] = {}

    async def flush(partition: int | None = None) -> None:
        for p in [partition] if partition is not None else list(pending):
            group = pending.pop(p, [])
            if group:
                await publisher.publish(access_batch(group), wait=False)

    began = time.monotonic()
    try:
        if not events:
            return 0.0
        t0 = events[0].occurred_at_ms
        for n, event in enumerate(events):
            if speed:
                due = (event.occurred_at_ms - t0) / 1000.0 / speed
            elif rate_per_s:
                due = n / rate_per_s
            else:
                due = 0.0
            delay = began + due - time.monotonic()
            if delay > 0:
                await flush()
                await asyncio.sleep(delay)
            if batch > 1 and isinstance(event, CacheAccessed):
                (partition,) = await publisher.partitions_of([event])
                pending.setdefault(partition, []).append(event)
                if len(pending[partition]) >= batch:
                    await flush(partition)
                continue
            await flush()
            await publisher.publish(event, wait=False)
        await flush()
    finally:
        await publisher.stop()
    return time.monotonic() - began


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.generator", description="Replay the Mooncake trace as cache events."
    )
    parser.add_argument("--trace", type=Path, default=None, help="default: the shared Mooncake trace")
    parser.add_argument(
        "--bootstrap",
        default=None,
        help="Kafka bootstrap (default: $KAFKA_BOOTSTRAP, else the running mesh's)",
    )
    parser.add_argument("--namespace", default=None, help="topic prefix (default: $KAFKA_TOPIC_NAMESPACE)")
    parser.add_argument("--until-s", type=float, default=None, help="only the first N seconds of the trace")
    parser.add_argument("--speed", type=float, default=10.0, help="x real time; 0 = as fast as possible")
    parser.add_argument("--now", action="store_true", help="start event time at the current time")
    parser.add_argument("--plant", action="store_true", help="add a pulse and a migration (shard s0)")
    parser.add_argument("--dry-run", action="store_true", help="print the events as JSON lines instead")
    args = parser.parse_args(argv)

    base = time.time_ns() // 1_000_000 if args.now else DEFAULT_BASE_MS
    until = None if args.until_s is None else round(args.until_s * 1000)
    events = mooncake_events(args.trace, until_ms=until, config=ReplayConfig(base_ms=base))
    if args.plant:
        events = merge_by_time(events, migration_events(base + 5_000), pulse_events(base + 40_000))
    if args.dry_run:
        from schemas.wire import encode

        for event in events:
            print(encode(event).decode())
        return
    import os

    from infra.mesh_state import kafka_address

    # no address given: the environment's, else the mesh `cachemesh up` started
    env_bootstrap, env_namespace = kafka_address(os.environ)
    bootstrap = args.bootstrap or env_bootstrap
    namespace = args.namespace if args.namespace is not None else env_namespace
    took = asyncio.run(produce(events, bootstrap, namespace, speed=args.speed or None))
    print(f"sent {len(events)} events in {took:.1f} s ({len(events) / max(took, 1e-9):.0f}/s)")


if __name__ == "__main__":
    main()
