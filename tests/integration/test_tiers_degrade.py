"""Degrade to local-only (docs/design.md §4.4) on real Kafka and Postgres: two tier nodes, B reading A's L2
as a peer, B with a small degrade window. Misses drive B's hit rate under 85%: B reports local_only, the
`TierModeChanged` event arrives on `tier.status.v1`, B stops asking A (A's block server sees no more FINDs,
B counts the skipped lookups, a value only A holds is not served) while L3 still answers. Hits bring it back
to normal after the hold, with an event, and A is asked again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Self

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from prometheus_client import REGISTRY

from schemas.events import TierModeChanged
from schemas.topics import qualified
from schemas.wire import decode
from services.tiers.edge.client import AsyncTiersClient
from tests.integration.nodes import running, until

pytestmark = pytest.mark.integration

DEGRADE = {
    "degrade_window_ms": 1_000,
    "degrade_min_lookups": 20,
    "degrade_hold_ms": 300,
    "degrade_min_dwell_ms": 0,
    "expire_interval_ms": 20,  # the housekeeping tick that feeds the guard
}


class ModeEvents:
    """Reads `tier.status.v1` from the start while the test runs."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.seen: list[TierModeChanged] = []
        self._reader = AIOKafkaConsumer(
            qualified(TierModeChanged.topic, namespace),
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            group_id=None,
        )
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._reader.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()

    async def _read(self) -> None:
        while True:
            for records in (await self._reader.getmany(timeout_ms=100)).values():
                for record in records:
                    event = decode(record.value)
                    assert isinstance(event, TierModeChanged)
                    self.seen.append(event)

    def of(self, node_id: str) -> list[TierModeChanged]:
        return [e for e in self.seen if e.node_id == node_id]


async def lookups_until(lookup: Callable[[], Awaitable[Any]], condition: Callable[[], bool]) -> int:
    """Keep looking up until `condition()` holds (the guard needs traffic to decide); how many it took."""
    n = 0
    while not condition():
        await lookup()
        n += 1
        if n > 20_000:
            raise AssertionError("condition not met after 20000 lookups")
    return n


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_low_hit_rate_degrades_to_local_only_and_hits_bring_it_back(
    kafka, topics_on, namespace, node_settings, postgres
) -> None:
    await topics_on(kafka)
    run = uuid.uuid4().hex[:8]
    async with (
        running(node_settings("a")) as a,
        ModeEvents(kafka.bootstrap, namespace) as events,
    ):
        assert a.block_server is not None and a.cache is not None
        async with (
            running(node_settings("b", l2_peers=a.block_server.address, **DEGRADE)) as b,
            AsyncTiersClient(a.api_url) as ca,
            AsyncTiersClient(b.api_url) as cb,
            httpx.AsyncClient(base_url=b.api_url) as http,
        ):
            assert b.cache is not None and b.peers is not None
            node = b.settings.node_id
            only_a, in_l3, hot = f"only-a-{run}", f"in-l3-{run}", f"hot-{run}"
            await ca.put(only_a, "held by A alone", model="m")
            await ca.put(in_l3, "in L3", model="m")
            conn = await asyncpg.connect(postgres.dsn)
            try:  # leave `only_a` in A's memory only: B can get it from A's L2 or not at all
                await conn.execute("DELETE FROM cache_descriptors WHERE key = $1", only_a)
            finally:
                await conn.close()
            cache_b = b.cache

            # --- misses: the hit rate falls, B goes local-only ---------------------------------
            misses = iter(range(1_000_000))
            took = await lookups_until(
                lambda: cb.get(f"absent-{run}-{next(misses)}"), lambda: cache_b.mode == "local_only"
            )
            assert took >= DEGRADE["degrade_min_lookups"]
            stats = (await http.get("/v1/stats")).json()
            assert stats["mode"] == "local_only" and stats["local_only"]["window_hit_rate"] < 0.85
            await until(lambda: len(events.of(node)) == 1, timeout_s=30)
            [down] = events.of(node)
            assert (down.mode, down.previous_mode, down.changes) == ("local_only", "normal", 1)
            assert down.hit_rate < 0.85 and down.lookups >= 20 and "< 85%" in down.reason
            assert down.window_ms == 1_000 and (down.enter_below, down.exit_at) == (0.85, 0.9)
            assert sample("cachemesh_tiers_local_only", node=node) == 1
            assert sample("cachemesh_tiers_mode_changes_total", node=node, mode="local_only") == 1
            health = await b.health()
            assert health["healthy"] and health["tiers"]["mode"] == "local_only"
            assert health["tiers"]["window_hit_rate"] < 0.85

            # --- local-only: A is not asked; L3 still serves ------------------------------------
            finds = a.block_server.requests["FIND"]
            asked = b.peers.stats()["peer_totals"]
            skipped = b.cache.counters.peers_skipped
            for i in range(10):
                assert not (await cb.get(f"absent-{run}-local-{i}")).hit
            assert not (await cb.get(only_a)).hit, "A's L2 was not asked"
            from_l3 = await cb.get(in_l3)
            assert (from_l3.tier, from_l3.remote) == ("l3", False)
            assert a.block_server.requests["FIND"] == finds
            assert b.peers.stats()["peer_totals"] == asked
            assert b.cache.counters.peers_skipped == skipped + 12

            # --- hits: the rate holds at 90% for the hold, B comes back --------------------------
            await cb.put(hot, "hot answer", model="m")
            await lookups_until(lambda: cb.get(hot), lambda: cache_b.mode == "normal")
            await until(lambda: len(events.of(node)) == 2, timeout_s=30)
            up = events.of(node)[1]
            assert (up.mode, up.previous_mode, up.changes) == ("normal", "local_only", 2)
            assert up.hit_rate >= 0.9 and "held for" in up.reason
            assert up.local_only_ms == up.in_previous_ms > 0
            assert sample("cachemesh_tiers_local_only", node=node) == 0
            assert sample("cachemesh_tiers_mode_changes_total", node=node, mode="normal") == 1

            # --- normal again: A is asked, and serves what only it holds -------------------------
            got = await cb.get(only_a)
            assert (got.hit, got.tier, got.remote) == (True, "l2", True)
            assert a.block_server.requests["FIND"] > finds
            stats = (await http.get("/v1/stats")).json()
            local = stats["local_only"]
            assert stats["mode"] == "normal" and local["changes"] == 2
            assert local["local_only_ms"] == up.local_only_ms and local["peers_skipped"] == skipped + 12
            assert (await b.health())["tiers"]["local_only_ms"] == up.local_only_ms
