"""The streams worker's log, run as the launcher runs it (its own process, stdout and stderr to the
file) from a terminal that asks for colour, is JSON lines from start to stop, with no terminal escape
(faust's own Worker would print one at exit, from its spinner: the worker runs on the common lifecycle)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra.paths import free_port
from infra.process import ServerProcess

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(json.load(response).get("healthy"))
    except (OSError, ValueError):
        return False


@pytest.mark.timeout(180)
async def test_streams_log_is_json_lines_through_start_and_stop(
    kafka, namespace, topics_on, tmp_path: Path
) -> None:
    await topics_on(kafka)
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KAFKA_TOPIC_NAMESPACE": namespace,
        "CACHEMESH_STREAMS_METRICS_PORT": str(port),
        # what a colour terminal running `make run` hands down
        "TERM": "xterm-256color",
        "COLORTERM": "truecolor",
        "FORCE_COLOR": "1",
        "CLICOLOR_FORCE": "1",
    }
    log = tmp_path / "streams.log"
    proc = ServerProcess([sys.executable, "-m", "streams"], log_path=log, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(_healthy, f"http://127.0.0.1:{port}/healthz"):
            assert proc.is_alive(), log.read_text()[-3000:]
            assert time.monotonic() < deadline, "streams worker not healthy in 120 s"
            await asyncio.sleep(0.2)
    finally:
        await asyncio.to_thread(proc.stop, 30)
    raw = log.read_bytes()
    assert b"\x1b" not in raw, "a terminal escape in streams.log"
    lines = [line for line in raw.splitlines() if line.strip()]
    assert lines
    for line in lines:
        doc = json.loads(line)
        assert doc["service"] == "streams"
