"""The modelled serving engine behind `bench.warmup`: a GPU KV tier run by a replacement policy, an L2
(host/peer) and an L3 (disk/Postgres) tier with bandwidths, prefill per uncached token, and background
warmup loads that the real `WarmupPlanner` asks for. Pure: the clock is the trace's, nothing sleeps.

FTL of a request = base + load time of its prefix blocks found in L2/L3 (bytes / bandwidth) + prefill
of the tokens from the first block found nowhere on (prefix rule: KV of a block depends on everything
before it, so the reusable part ends at the first block that no tier holds). Blocks a request computes
or loads enter the GPU tier by the policy; what the GPU tier evicts spills to L2 (LRU), what L2 evicts
to L3 (LRU), what L3 evicts is gone. Requests are served in isolation (an unloaded engine, no queueing
or batching); background loads share one link per source tier, first in first out.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from policies.base import AccessMeta, Policy
from schemas.events import (
    MAX_KEYS_PER_EVENT,
    CacheAccessed,
    ConversationEnded,
    Event,
    KvBlockRemoved,
    KvBlockStored,
    RequestPenetrated,
    WarmupDecided,
    WarmupMeasured,
    WarmupRequested,
    WindowComputed,
)
from services.tiers.l2.block_pool import MAX_BLOCK_BYTES, PAGE_BYTES, BlockPool
from services.warmup.ftl import KvShape
from services.warmup.planner import ALL_NODES
from streams.entropy import shannon_entropy_bits

NODE = "gpu0"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One H100 80 GB serving a Llama-3-8B-class GQA model (32 layers, 8 KV heads, head_dim 128, fp16).

    - KV per token 2 x 32 x 8 x 128 x 2 B = 128 KiB, so a 512-token block is 64 MiB.
    - GPU tier 768 blocks (48 GiB, 393K tokens): 80 GB x 0.9 (vLLM's default gpu_memory_utilization)
      = 72 GB, minus 16 GB of fp16 weights and ~6 GB of activations / CUDA graphs, leaves ~50 GB.
    - L2 1,024 blocks (64 GiB): a pinned host pool (LMCache-style CPU offload) at PCIe 4.0 x16, 32 GB/s
      raw, ~25 GB/s effective for pinned cudaMemcpy.
    - L3 32,768 blocks (2 TiB): NVMe or a networked store (Postgres in cachemesh) at ~2.5 GB/s (one
      PCIe 4.0 NVMe drive reads 3-7 GB/s sequentially; a network store 1-3 GB/s).
    - Prefill 0.1 ms per uncached token. Derived, not measured: ~16 GFLOP/token of weights plus ~8.6
      GFLOP/token of attention at a 16K average context (4 x 32 layers x 4096 x 16K) is ~25 GFLOP,
      at ~250 TFLOP/s sustained (~25-35% of the H100's 756-989 TFLOP/s dense bf16) is 0.1 ms; the low
      end of the 0.1-0.2 ms/token usually quoted for 8B prefill on one H100. Linear in tokens (the
      quadratic attention term is folded into the average).
    - Base 15 ms: scheduling plus the first decode step (NVIDIA NIM's Llama-3.1-8B-Instruct benchmark:
      TTFT 10.3 ms, ITL 4.6 ms at concurrency 1 with a short prompt).
    - `layerwise_overlap`: the prefix KV found in L2/L3 streams in layer by layer while the suffix's
      prefill runs: vLLM's KV connector API starts the load before the forward pass and each attention
      layer waits only for its own layer (`start_load_kv` / `wait_for_layer_load`, as LMCache's
      connector implements them; vllm-ascend's "Layerwise KV Pool" guide: layer i+1's transfer
      overlaps layer i's compute). So a request takes max(load, prefill) + min(load, prefill) / layers
      instead of their sum, at the same bandwidths. Off by default: vLLM's own prefix cache keeps KV
      on the GPU only and a bulk load from host memory blocks the forward pass.
    """

    shape: KvShape = field(default_factory=lambda: KvShape(layers=32, kv_heads=8, head_dim=128))
    block_tokens: int = 512
    gpu_blocks: int = 768
    l2_blocks: int = 1_024
    l3_blocks: int = 32_768
    l2_gb_per_s: float = 25.0
    l3_gb_per_s: float = 2.5
    prefill_ms_per_token: float = 0.1
    base_ms: float = 15.0
    tick_ms: int = 100  # the warmup service's tick_interval_ms
    window_ms: int = 1_000  # the streams' tumbling_1s window
    layerwise_overlap: bool = False

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.shape.bytes_per_token()

    def load_ms(self, tier: str) -> float:
        gbps = self.l2_gb_per_s if tier == "l2" else self.l3_gb_per_s
        return self.block_bytes / (gbps * 1e9) * 1000


@dataclass(frozen=True, slots=True)
class Request:
    at_ms: int
    blocks: tuple[int, ...]
    input_tokens: int
    trace_id: str | None = None
    turn: int = 0  # 0 for the first request of a conversation (or when there are none)
    last: bool = False  # the conversation's last turn (the client closes its session after it)


@dataclass(frozen=True, slots=True)
class Served:
    at_ms: int
    ftl_ms: float
    blocks: int
    gpu_hits: int
    l2_loads: int
    l3_loads: int
    prefilled_tokens: int
    turn: int


@dataclass(slots=True)
class PrefetchStats:
    commands: int = 0
    keys: int = 0
    already_present: int = 0
    missing: int = 0  # in no tier: nothing to load
    loaded: int = 0
    bytes_loaded: int = 0
    read: int = 0  # loaded blocks a request then found on the GPU
    evicted_unread: int = 0
    rejected: int = 0  # the policy would not admit the loaded block
    overtaken: int = 0  # a request needed the block before its load finished


def hold_cause(reason: str) -> str:
    """The bound a hold names, without its numbers (the planner's reasons start with it)."""
    head = reason.split(";")[0]
    for cause in ("no 1 s window", "budget", "not finite"):
        if cause in head:
            return cause
    if "were wasted" in head:
        return "backed off (waste)"
    words = head.removeprefix("hold: ").split()
    return f"{words[0]} {words[2]}" if len(words) >= 3 else head  # e.g. "entropy >="


class LruTier:
    """L2 or L3: LRU over block ids. L2 also carves each block out of a real `BlockPool` (scaled: one
    64 MiB KV block is one 2 KB pool block) so its fragmentation formula reads a live layout."""

    def __init__(self, capacity: int, pool: BlockPool | None = None) -> None:
        self.capacity = capacity
        self.pool = pool
        self._blocks: OrderedDict[int, int] = OrderedDict()  # block id -> pool block (or -1)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def touch(self, block: int) -> None:
        if block in self._blocks:  # the request that loaded it may have spilled it on since
            self._blocks.move_to_end(block)

    def put(self, block: int) -> list[int]:
        """Insert (or refresh) `block`; returns the blocks pushed out, oldest first."""
        if block in self._blocks:
            self._blocks.move_to_end(block)
            return []
        out: list[int] = []
        while len(self._blocks) >= self.capacity:
            old, slot = self._blocks.popitem(last=False)
            if self.pool is not None:
                self.pool.free(slot)
            out.append(old)
        self._blocks[block] = self.pool.allocate(MAX_BLOCK_BYTES) if self.pool is not None else -1
        return out

    def fragmentation(self) -> float:
        return self.pool.fragmentation() if self.pool is not None else 0.0


class _Windows:
    """Modelled 1 s tumbling windows of the engine's block accesses (what streams would publish):
    qps = accesses per second, Shannon entropy over the block keys, GPU hit rate, miss latency p95."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self.start_ms: int | None = None
        self.keys: Counter[int] = Counter()
        self.hits = 0
        self.miss_latencies: list[float] = []

    def add(self, now_ms: int, block: int, hit: bool, latency_ms: float) -> None:
        if self.start_ms is None:
            self.start_ms = now_ms - now_ms % self.window_ms
        self.keys[block] += 1
        self.hits += hit
        if not hit:
            self.miss_latencies.append(latency_ms)

    def close_before(self, now_ms: int) -> list[WindowComputed]:
        """The open window once `now_ms` is past its end (the engine closes before it adds, so every
        access held belongs to that window); windows without accesses are not published."""
        if self.start_ms is None or now_ms < self.start_ms + self.window_ms:
            return []
        n, end = sum(self.keys.values()), self.start_ms + self.window_ms
        lat = sorted(self.miss_latencies)
        window = WindowComputed(
            shard=ALL_NODES,
            window="tumbling_1s",
            window_start_ms=self.start_ms,
            window_end_ms=end,
            requests=n,
            qps=n * 1000 / self.window_ms,
            entropy_bits=shannon_entropy_bits(self.keys.values()),
            hit_rate=self.hits / n,
            hits=self.hits,
            distinct_keys=len(self.keys),
            miss_latency_ms_p95=lat[max(0, math.ceil(0.95 * len(lat)) - 1)] if lat else None,
            occurred_at_ms=end,
        )
        self.start_ms, self.keys, self.hits, self.miss_latencies = None, Counter(), 0, []
        return [window]


@dataclass(slots=True)
class EngineRun:
    served: list[Served] = field(default_factory=list)
    prefetch: PrefetchStats = field(default_factory=PrefetchStats)
    measured: list[WarmupMeasured] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)  # L2 pool, sampled at every request
    holds: Counter[str] = field(default_factory=Counter)  # why the planner held, by cause


class Planner(Protocol):
    """What the engine asks of a warmup planner: the real `WarmupPlanner`, or the oracle."""

    def apply(self, event: Event) -> list[Event]: ...
    def tick(self, now_ms: int) -> list[Event]: ...
    def stats(self) -> dict[str, object]: ...


class OracleWarmup:
    """The upper bound on any arrival predictor: it knows when every request comes and which blocks
    it reads, and asks for the reusable ones not on the GPU to be loaded into it over the same links
    (L3 at its bandwidth, L2 at its own, queued behind earlier loads) so the loads finish as the
    request arrives. Eviction stays the engine policy's; only the timing is perfect."""

    def __init__(self, requests: list[Request], config: EngineConfig, horizon_ms: int = 30_000) -> None:
        self.requests = sorted(requests, key=lambda r: r.at_ms)
        self.config = config
        self.horizon_ms = horizon_ms
        self.engine: Engine | None = None
        self._next = 0  # first request not yet arrived
        self._issued: set[int] = set()
        self.bytes_warmed = 0

    def apply(self, event: Event) -> list[Event]:
        return []

    def tick(self, now_ms: int) -> list[Event]:
        e, c = self.engine, self.config
        assert e is not None and e.policy is not None
        while self._next < len(self.requests) and self.requests[self._next].at_ms <= now_ms:
            self._next += 1
        out: list[Event] = []
        for j in range(self._next, len(self.requests)):
            r = self.requests[j]
            if r.at_ms - now_ms > self.horizon_ms:
                break
            if j in self._issued:
                continue
            keys: list[str] = []
            busy = {"l2": max(0.0, e._link_free["l2"] - now_ms), "l3": max(0.0, e._link_free["l3"] - now_ms)}
            for b in r.blocks:
                if b in e.policy or b in e._pending:
                    continue
                tier = "l2" if b in e.l2 else "l3" if b in e.l3 else ""
                if not tier:
                    break  # the reusable prefix ends here
                busy[tier] += c.load_ms(tier)
                keys.append(str(b))
            if not keys:
                continue
            if r.at_ms - now_ms > max(busy.values()) + c.tick_ms:
                continue  # not yet: it would land early and could be evicted before the request
            self._issued.add(j)
            self.bytes_warmed += len(keys) * c.block_bytes
            for i in range(0, len(keys), MAX_KEYS_PER_EVENT):
                out.append(
                    WarmupRequested(
                        node_id=NODE,
                        keys=keys[i : i + MAX_KEYS_PER_EVENT],
                        tier="l1",
                        reason=f"oracle: request at {r.at_ms} ms",
                        start_at_ms=now_ms,
                        occurred_at_ms=now_ms,
                    )
                )
        return out

    def stats(self) -> dict[str, object]:
        return {"bytes_warmed": self.bytes_warmed}


class Engine:
    """Serves `Request`s in time order. `policy` None is the no-cache engine (everything prefilled);
    with a `planner`, the engine tells it what it stores and reads and carries out its warmups."""

    def __init__(
        self,
        config: EngineConfig,
        policy: Policy | None,
        planner: Planner | None = None,
        *,
        end_signal: bool = False,
    ) -> None:
        self.config = c = config
        self.policy = policy
        self.planner = planner
        self.end_signal = end_signal  # after a last turn, publish ConversationEnded (context lifecycle)
        pages = max(1, math.ceil(c.l2_blocks * MAX_BLOCK_BYTES / PAGE_BYTES))
        self._clock_ms = 0
        self.l2 = LruTier(c.l2_blocks, BlockPool(pages, xp=np, clock=lambda: self._clock_ms))
        self.l3 = LruTier(c.l3_blocks)
        self.run = EngineRun()
        self._parent: dict[int, int | None] = {}
        self._pending: dict[int, float] = {}  # block -> when its background load completes
        # heap of (done_ms, block, target): target "gpu" (a command for l1) or "l2" (from L3 up to L2)
        self._loads: list[tuple[float, int, str]] = []
        self._link_free = {"l2": 0.0, "l3": 0.0}
        self._prefetched: set[int] = set()  # loaded by warmup, not read by a request yet
        self._ticked_ms: int | None = None
        self._windows = _Windows(c.window_ms)

    # -- time ------------------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        """Everything that happens up to `now_ms`: planner ticks, windows closing, loads finishing."""
        if self.planner is not None:
            tick = self.config.tick_ms
            t = now_ms if self._ticked_ms is None else self._ticked_ms + tick
            while t <= now_ms:
                self._finish_loads(t)
                self._clock_ms = t
                self._tell(self._windows.close_before(t))
                self._execute(self.planner.tick(t), t)
                self._ticked_ms = t
                t += tick
        self._finish_loads(now_ms)
        self._clock_ms = now_ms

    def _finish_loads(self, until_ms: float) -> None:
        while self._loads and self._loads[0][0] <= until_ms:
            done, block, target = heapq.heappop(self._loads)
            if self._pending.get(block) != done:
                continue  # overtaken by a request
            del self._pending[block]
            assert self.policy is not None
            if block in self.policy:
                continue
            if target == "l2":
                if block not in self.l2:
                    self._spill(block)
                    self._prefetched.add(block)
                    self.run.prefetch.loaded += 1
                    self.run.prefetch.bytes_loaded += self.config.block_bytes
                continue
            if self._admit(block, int(done)):
                self._prefetched.add(block)
                self.run.prefetch.loaded += 1
                self.run.prefetch.bytes_loaded += self.config.block_bytes
            else:
                self.run.prefetch.rejected += 1

    # -- serving ---------------------------------------------------------------------------------

    def serve(self, r: Request) -> Served:
        self.advance(r.at_ms)
        c, now = self.config, r.at_ms
        for i, b in enumerate(r.blocks):
            self._parent.setdefault(b, r.blocks[i - 1] if i else None)
        if self.policy is None:
            served = Served(now, c.base_ms + r.input_tokens * c.prefill_ms_per_token, len(r.blocks),
                            0, 0, 0, r.input_tokens, r.turn)  # fmt: skip
            self.run.served.append(served)
            return served
        where: list[str] = []
        for b in r.blocks:
            if b in self._pending:  # a request cannot wait for a background load: it loads itself
                del self._pending[b]
                self.run.prefetch.overtaken += 1
            tier = "gpu" if b in self.policy else "l2" if b in self.l2 else "l3" if b in self.l3 else ""
            if not tier:
                break
            where.append(tier)
        reused = len(where)
        loads_ms = sum(c.load_ms(t) for t in where if t != "gpu")
        prefill_tokens = max(0, r.input_tokens - reused * c.block_tokens)
        prefill_ms = prefill_tokens * c.prefill_ms_per_token
        if c.layerwise_overlap:
            layers = c.shape.layers
            ftl = c.base_ms + max(loads_ms, prefill_ms) + min(loads_ms, prefill_ms) / layers
        else:
            ftl = c.base_ms + loads_ms + prefill_ms
        computed_ms = prefill_ms / max(1, len(r.blocks) - reused)
        events: list[Event] = []
        for i, b in enumerate(r.blocks):
            tier = where[i] if i < reused else ""
            hit = tier == "gpu"
            latency = 0.0 if hit else c.load_ms(tier) if tier else computed_ms
            if tier in ("gpu", "l2") and b in self._prefetched:  # read where warmup put it
                self._prefetched.discard(b)
                self.run.prefetch.read += 1
            if tier in ("l2", "l3"):
                (self.l2 if tier == "l2" else self.l3).touch(b)
            # Checked again: this request's own admissions may have pushed a later block out.
            if b in self.policy:
                self.policy.on_hit(b, now, AccessMeta(trace_id=r.trace_id, parent=self._parent[b]))
            else:
                self._admit(b, now, r.trace_id)
            self._windows.add(now, b, hit, latency)
            if self.planner is not None:
                events.append(self._accessed(r, b, hit, latency, now))
        if self.planner is not None:
            for b in r.blocks[reused:]:
                events.append(
                    KvBlockStored(
                        block_hash=str(b),
                        parent_block_hash=None if self._parent[b] is None else str(self._parent[b]),
                        block_size_tokens=c.block_tokens,
                        size_bytes=c.block_bytes,
                        medium="gpu",
                        trace_id=r.trace_id,
                        node_id=NODE,
                        occurred_at_ms=now,
                    )
                )
            if reused < len(r.blocks):
                events.append(
                    RequestPenetrated(
                        shard=ALL_NODES,
                        key=str(r.blocks[reused]),
                        trace_id=r.trace_id,
                        latency_ms=prefill_ms,
                        occurred_at_ms=now,
                    )
                )
            self._tell(events)
        if self.end_signal and r.last and r.trace_id is not None:
            self._ended(r.trace_id, now)
        self.run.fragmentation.append(self.l2.fragmentation())
        hits = where.count("gpu")
        served = Served(now, ftl, len(r.blocks), hits, where.count("l2"), where.count("l3"),
                        prefill_tokens, r.turn)  # fmt: skip
        self.run.served.append(served)
        return served

    def _ended(self, trace_id: str, now: int) -> None:
        ended = getattr(self.policy, "ended", None)
        if callable(ended):  # a policy that reads the lifecycle ranks the blocks last; they stay resident
            ended(trace_id)
        self._tell([ConversationEnded(trace_id=trace_id, occurred_at_ms=now)])

    def _accessed(self, r: Request, b: int, hit: bool, latency: float, now: int) -> CacheAccessed:
        return CacheAccessed(
            key=str(b),
            hit=hit,
            kind="kv_block",
            latency_ms=latency,
            token_count=self.config.block_tokens,
            size_bytes=self.config.block_bytes,
            trace_id=r.trace_id,
            node_id=NODE,
            occurred_at_ms=now,
        )

    def _admit(self, block: int, now: int, trace_id: str | None = None) -> bool:
        """Put `block` in the GPU tier; what leaves (the block itself, if rejected) spills to L2."""
        assert self.policy is not None
        evictions = self.policy.on_miss(
            block, now, 1, AccessMeta(trace_id=trace_id, parent=self._parent[block])
        )
        admitted = True
        removed: list[Event] = []
        for e in evictions:
            key = int(e.key)  # type: ignore[call-overload]
            if key == block and e.reason == "rejected":
                admitted = False
            elif self.planner is not None:
                removed.append(
                    KvBlockRemoved(block_hash=str(key), medium="gpu", node_id=NODE, occurred_at_ms=now)
                )
            if key in self._prefetched:
                self._prefetched.discard(key)
                self.run.prefetch.evicted_unread += 1
            self._spill(key)
        if removed:
            self._tell(removed)
        return admitted

    def _spill(self, block: int) -> None:
        for old in self.l2.put(block):
            self.l3.put(old)
            # Warmed up to L2 and pushed back down before a request read it (a copy on the GPU still counts).
            if old in self._prefetched and (self.policy is None or old not in self.policy):
                self._prefetched.discard(old)
                self.run.prefetch.evicted_unread += 1
            if self.planner is not None:  # as an offloading engine reports it (vLLM's medium="cpu")
                self._tell(
                    [
                        KvBlockRemoved(
                            block_hash=str(old), medium="cpu", node_id=NODE, occurred_at_ms=self._clock_ms
                        )
                    ]
                )

    # -- the planner -----------------------------------------------------------------------------

    def _tell(self, events: Iterable[Event]) -> None:
        if self.planner is None:
            return
        for e in events:
            self._execute(self.planner.apply(e), e.occurred_at_ms)

    def _execute(self, out: list[Event], now_ms: int) -> None:
        """Carry out `WarmupRequested` commands: queue each block's load on its source tier's link."""
        assert self.policy is not None
        stats = self.run.prefetch
        for cmd in out:
            if isinstance(cmd, WarmupMeasured):
                self.run.measured.append(cmd)
            elif isinstance(cmd, WarmupDecided) and cmd.action == "hold":
                self.run.holds[hold_cause(cmd.reason)] += 1
            if not isinstance(cmd, WarmupRequested):
                continue
            stats.commands += 1
            start = max(now_ms, cmd.start_at_ms or now_ms)
            for key in cmd.keys:
                stats.keys += 1
                block = int(key)
                # A command for l2 brings a block from L3 up to the host/peer pool (L2), leaving the GPU
                # tier alone; one for l1 brings it into the GPU tier (the serving engine's own cache).
                to_gpu = cmd.tier == "l1"
                if block in self.policy or block in self._pending or (not to_gpu and block in self.l2):
                    stats.already_present += 1
                    continue
                tier = "l2" if block in self.l2 else "l3" if block in self.l3 else ""
                if not tier:
                    stats.missing += 1
                    continue
                begin = max(float(start), self._link_free[tier])
                done = begin + self.config.load_ms(tier)
                self._link_free[tier] = done
                self._pending[block] = done
                heapq.heappush(self._loads, (done, block, "gpu" if to_gpu else "l2"))
