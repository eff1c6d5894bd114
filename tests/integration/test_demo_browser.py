"""What a newcomer does after `make run`: `cachemesh up` (tansu, every service), then `cachemesh demo
--json`, then the dashboard in headless Chromium. Every service acts in the demo: warmups are applied,
drift forms clusters, invalidations cascade, heat decides, the gateway (in front of the stand-in model
server `cachemesh up` starts when none is named) answers repeats from the cache; and the dashboard's
warmup and drift panels fill from that run alone (no record published by the test). A screenshot is
kept in tmp_path."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.paths import port_is_free
from tests.integration.test_dashboard_browser import CHROMIUM, _chromium

pytestmark = [pytest.mark.integration, pytest.mark.tansu]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "infra.cli"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make setup installs it)")
@pytest.mark.timeout(420)
def test_the_demo_makes_every_service_act_and_the_dashboard_shows_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DATABASE_URL")}
    env.update(CACHEMESH_CACHE_DIR=str(tmp_path), CACHEMESH_BROKER="tansu", PYTHONPATH=str(REPO))
    # No model server named: the gateway gets the stand-in (unless one listens on :8000).
    env.pop("CACHEMESH_GATEWAY_UPSTREAM_URL", None)
    env.pop("CACHEMESH_GATEWAY_UPSTREAMS", None)
    standin = port_is_free(8000)
    launcher = subprocess.Popen(
        [*CLI, "up"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.extend(iter(launcher.stderr.readline, b"")))  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and launcher.poll() is None:
            if b"all up in" in b"".join(err_chunks) and b"dashboard" in b"".join(err_chunks):
                break
            time.sleep(1)
        err = b"".join(err_chunks).decode()
        assert launcher.poll() is None and "all up in" in err, err[-3000:]
        board = re.search(r"http://127\.0\.0\.1:\d+/dashboard/", err)
        assert board is not None, err[-3000:]

        demo = subprocess.run([*CLI, "demo", "--json"], env=env, cwd=REPO, capture_output=True, timeout=180)
        assert demo.returncode == 0, demo.stderr.decode()[-3000:]
        summary = json.loads(demo.stdout.decode().strip().splitlines()[-1])
        print(f"demo summary: {json.dumps(summary)}")
        assert summary["lookups"] > 0 and summary["hits"] > 0
        assert summary["writes_refused"] == 0
        assert summary["warmups_applied"] > 0, summary  # warmup's commands reached the node
        assert summary["warmup_delta_t_ms"], summary  # and were measured against the turns they served
        assert summary["drift_clusters"] > 0, summary
        assert summary["invalidations"] > 0 and summary["heat_decisions"] > 0, summary
        # The gateway acts too: each question asked a second time is answered from the cache, unless the
        # lookup did not answer within the gateway's budget (50 ms) on this loaded machine; any other
        # miss (a rule refused, nothing stored) fails.
        assert summary["chats"] == 40 and summary["chat_hits"] >= 5, summary
        assert set(summary["chat_misses"]) <= {"timeout", "hedged", "skipped"}, summary
        assert summary["chat_hits"] + sum(summary["chat_misses"].values()) >= 20, summary
        if standin:
            assert "stand-in model server (OpenAI base_url)" in err, err[-3000:]

        dom = asyncio.run(_chromium("--virtual-time-budget=4000", "--dump-dom", board.group(0)))
        shot = tmp_path / "dashboard-after-demo.png"
        asyncio.run(
            _chromium(
                "--virtual-time-budget=4000",
                "--window-size=1400,1800",
                f"--screenshot={shot}",
                board.group(0),
            )
        )
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        reader.join(timeout=30)
    assert launcher.returncode == 0, b"".join(err_chunks).decode()[-3000:]

    points = int(re.search(r'id="chart-warmup_delta" data-points="(\d+)"', dom).group(1))  # type: ignore[union-attr]
    assert points >= 1, "the warmup Δt chart stayed empty"
    for name in ("drift", "warmups", "heat", "nodes"):
        rows = int(re.search(rf'id="table-{name}" data-rows="(\d+)"', dom).group(1))  # type: ignore[union-attr]
        assert rows >= 1, f"table {name} is empty after the demo"
        assert f'id="hint-{name}" data-empty="0"' in dom, f"{name} is filled but still shows its hint"
    assert shot.exists() and shot.stat().st_size > 10_000
    print(f"dashboard screenshot after the demo: {shot}")
