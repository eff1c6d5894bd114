"""The consistency checker over a real mesh (issue 14): three tier nodes (one in a subprocess) and the
invalidation service on real Kafka and Postgres, writers and readers recording a history
(bench/consistency.py), judged by sim/consistency.py: no stale read once the propagation window has
passed, no phantom, no acknowledged write lost or left diverged, quiet and with a fault mid-load.

The broker and Postgres restarts need servers of their own: those tests skip when KAFKA_BOOTSTRAP /
DATABASE_URL point at shared ones (run them without the shared env)."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg
import pytest

from bench.consistency import (
    BROKER_OUTAGE_WINDOW_MS,
    SKEW_MS,
    Mesh,
    Outcome,
    Workload,
    mesh,
    run_scenario,
    scenario_mesh,
)
from schemas.events import CacheInvalidated
from schemas.topics import qualified

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Generous: the assertion is about correctness; the measured p99 is the bench's business.
WINDOW_MS = 2000.0
# Across a broker restart the window is the hearing lease plus the producers' reconnect: the
# invalidations written while the broker was away are delivered only once they reconnect, and CI runs
# saw nodes serve the replaced value up to 2.4 s after the newer write's acknowledgement.
BROKER_RESTART_WINDOW_MS = BROKER_OUTAGE_WINDOW_MS


def _workload(**overrides: float) -> Workload:
    base: dict[str, float] = {
        "window_ms": WINDOW_MS,
        "duration_s": 4.0,
        "fault_after_s": 1.0,
        "after_fault_s": 2.5,
    }
    return Workload(**{**base, **overrides})  # type: ignore[arg-type]


async def _outbox_drained(m: Mesh, dsn: str, timeout_s: float = 20.0) -> None:
    """Until the broker has acknowledged every invalidation the mesh's writes recorded in L3's outbox."""
    topic = qualified(CacheInvalidated.topic, m.services[0].settings.kafka.topic_namespace)
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while (left := await conn.fetchval("SELECT count(*) FROM cache_outbox WHERE topic = $1", topic)) > 0:
            assert time.monotonic() < deadline, f"{left} invalidations never reached the broker"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


def _assert_consistent(outcome: Outcome) -> None:
    r = outcome.report
    assert r.writes_ok >= 10 and r.reads_ok >= 50, f"too little load to judge: {r}"
    assert (r.stale, r.phantoms, r.lost, r.diverged) == (0, 0, 0, 0), outcome.explain()


async def test_quiet_run_is_consistent(kafka, postgres) -> None:
    async with mesh(kafka.bootstrap, postgres.dsn) as m:
        outcome = await run_scenario("quiet", m, _workload())
    _assert_consistent(outcome)
    assert outcome.report.reads_failed == 0
    assert outcome.report.propagation_ms, "probes saw writes reach every node"


async def test_a_node_killed_and_restarted_mid_load_stays_consistent(kafka, postgres) -> None:
    async with mesh(kafka.bootstrap, postgres.dsn) as m:
        outcome = await run_scenario("kill-node", m, _workload())
        assert m.process.restarts == 1
    _assert_consistent(outcome)
    assert outcome.report.reads_failed > 0, "the kill landed under load"


@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP")), reason="restarts the broker: needs its own")
async def test_a_broker_restart_mid_load_stays_consistent(kafka, postgres) -> None:
    async with mesh(kafka.bootstrap, postgres.dsn) as m:
        # Load goes on past the window, so a read it would call stale is still made.
        workload = _workload(window_ms=BROKER_RESTART_WINDOW_MS, after_fault_s=6.0)
        outcome = await run_scenario("restart-broker", m, workload, broker=kafka)
    _assert_consistent(outcome)


@pytest.mark.skipif(bool(os.environ.get("KAFKA_BOOTSTRAP")), reason="stops the broker: needs its own")
async def test_scenario_broker_away_past_the_send_timeout_loses_no_invalidation(kafka, postgres) -> None:
    """The broker stays down past the producers' send timeout under load: what they buffered expires,
    and reaches every node all the same (re-sent, and relayed from L3's outbox)."""
    async with scenario_mesh("broker-away", kafka, postgres.dsn) as m:
        workload = _workload(window_ms=BROKER_RESTART_WINDOW_MS, after_fault_s=6.0)
        outcome = await run_scenario("broker-away", m, workload, broker=kafka)
        stats = [await n.stats() for n in m.nodes]
        await _outbox_drained(m, postgres.dsn)
    _assert_consistent(outcome)
    assert (
        outcome.fault_s is not None
        and outcome.fault_s * 1000 > 2 * m.services[0].settings.kafka.request_timeout_ms
    )
    assert sum(s["outbox"]["send_failures"] for s in stats) > 0, "sends timed out while the broker was away"


@pytest.mark.skipif(
    bool(os.environ.get("KAFKA_BOOTSTRAP")), reason="needs the embedded broker's SIDE listener"
)
async def test_scenario_partition_of_one_node_from_the_broker_stays_consistent(kafka, postgres) -> None:
    """Node c loses the broker (a black hole) while clients, Postgres and its peers still reach it: its
    acknowledged writes reach the other nodes through the outbox, relayed by them; c, deaf, reads L3."""
    async with scenario_mesh("partition", kafka, postgres.dsn) as m:
        outcome = await run_scenario("partition", m, _workload(after_fault_s=3.0), broker=kafka)
        relayed = sum([(await n.stats())["outbox"]["relayed"] for n in m.nodes[:2]])
        await _outbox_drained(m, postgres.dsn)
    _assert_consistent(outcome)
    c_writes = [op for op in outcome.history if op.kind == "write" and op.node == "c" and op.status == "ok"]
    assert c_writes and relayed > 0, (len(c_writes), relayed)


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="restarts Postgres: needs its own")
async def test_scenario_postgres_restart_mid_load_stays_consistent(kafka, postgres) -> None:
    async with mesh(kafka.bootstrap, postgres.dsn) as m:
        outcome = await run_scenario("restart-postgres", m, _workload(), postgres=postgres)
    _assert_consistent(outcome)


async def test_scenario_clock_skew_nodes_seconds_apart_stay_consistent(kafka, postgres) -> None:
    """Node a's clock 3 s behind, c's 4 s ahead: writes are ordered by causal stamps, so a write made
    after hearing of another node's write is the newer one everywhere (by wall clocks a's writes would
    lose to older ones in L3 and be fenced out of its own memory)."""
    async with mesh(kafka.bootstrap, postgres.dsn, skew_ms=SKEW_MS) as m:
        outcome = await run_scenario("clock-skew", m, _workload())
        ahead = [(await n.stats())["clock_ahead_ms"] for n in m.nodes]
    _assert_consistent(outcome)
    # a and b stamp past what they heard from c (whose clock is ahead); c, the fastest clock, never runs
    # ahead of itself
    assert ahead[0] > 0 and ahead[1] > 0 and ahead[2] == 0, ahead


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="stops Postgres: needs its own")
async def test_scenario_sigkill_write_behind_loses_no_acknowledged_write(kafka, postgres) -> None:
    """Postgres goes away under load, node c is SIGKILLed while L3 cannot take writes, then both come
    back: a write is acknowledged only once L3 holds it (durable by default), so none is lost — the
    writes L3 could not take were refused, not acknowledged from memory."""
    async with mesh(kafka.bootstrap, postgres.dsn) as m:
        outcome = await run_scenario(
            "sigkill-write-behind", m, _workload(after_fault_s=3.0), postgres=postgres
        )
        assert m.process.restarts == 1
    _assert_consistent(outcome)
    refused = sum(op.kind == "write" and op.status != "ok" for op in outcome.history)
    assert refused > 0, "writes were tried while L3 was away, and refused"
