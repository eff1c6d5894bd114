"""A dashboard run on the real broker reads the records it shows and leaves no consumer group behind
(each run used to commit offsets in a fresh group of its own, kept by the broker for a week)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from schemas.events import WindowComputed
from services.dashboard.service import DashboardService
from services.dashboard.settings import DashboardSettings
from services.runtime.publisher import EventPublisher
from tests.integration.conftest import kafka_settings_for
from tests.integration.nodes import serving, until

pytestmark = pytest.mark.integration


async def _groups(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {str(group[0]) for group in await admin.list_consumer_groups()}
    finally:
        await admin.close()


@pytest.mark.timeout(120)
async def test_a_dashboard_start_and_stop_leaves_no_group(
    kafka, namespace, topics_on, tmp_path: Path
) -> None:
    await topics_on(kafka)
    kafka_s = kafka_settings_for(kafka, namespace)
    node_id = f"dash-{namespace.rstrip('.')}"
    before = await _groups(kafka.bootstrap)
    publisher = EventPublisher(kafka_s)
    await publisher.start()
    try:
        for _ in range(2):  # a second run too: nothing accumulates
            dash = DashboardService(
                DashboardSettings(
                    kafka=kafka_s, node_id=node_id, http_port=None, state_file=tmp_path / "no-mesh.json"
                )
            )
            async with serving(dash):
                health = await dash.health()
                assert health["reading"] and health["records"]["group"] is None
                assert health["records"]["assigned"], "every partition of the records topics is read"
                seen = dash.board.totals["windows"]
                now = int(time.time() * 1000)
                await publisher.publish(
                    WindowComputed(
                        shard="s0",
                        window="tumbling_1s",
                        window_start_ms=now - 1000,
                        window_end_ms=now,
                        requests=10,
                        qps=10.0,
                        entropy_bits=1.0,
                        hit_rate=0.5,
                    )
                )
                # Published after start: read from the log end on, with no group to keep a position.
                await until(lambda: dash.board.totals["windows"] > seen, timeout_s=30, step_s=0.05)  # noqa: B023
    finally:
        await publisher.stop()
    left = await _groups(kafka.bootstrap) - before
    # Other tests may share this broker and add groups of their own: none may be the dashboard's.
    assert not [g for g in left if g.startswith("dashboard") or node_id in g], left
