"""`cachemesh up` end to end (the quick-start path, on tansu): everything comes up healthy,
`cachemesh status` says so, and Ctrl-C takes it all down leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.tansu]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "infra.cli"]


def _status(env: dict[str, str]) -> tuple[int, list[dict[str, str]]]:
    done = subprocess.run([*CLI, "status", "--json"], env=env, cwd=REPO, capture_output=True, timeout=60)
    rows = json.loads(done.stdout) if done.stdout.strip() else []
    return done.returncode, rows


@pytest.mark.timeout(300)
def test_up_status_and_ctrl_c_leave_nothing_behind(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DATABASE_URL")}
    env.update(CACHEMESH_CACHE_DIR=str(tmp_path), CACHEMESH_BROKER="tansu", PYTHONPATH=str(REPO))
    launcher = subprocess.Popen(
        [*CLI, "up"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 180
        code, rows = 3, []
        while time.monotonic() < deadline and launcher.poll() is None:
            code, rows = _status(env)
            if code == 0:
                break
            time.sleep(1)
        assert launcher.poll() is None, launcher.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        assert code == 0, rows
        components = {r["component"] for r in rows}
        assert {"broker", "postgres"} <= components
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert children, "broker, Postgres and services run as child processes"

        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, err.decode()[-3000:]
    assert "all healthy in" in err.decode()
    timings = json.loads(out.decode().strip().splitlines()[-1])["timings"]
    assert timings["all_healthy_s"] > 0
    # Reaped or exited (a zombie has exited; reaping it is init's job), waited for, not slept on.
    _, running = psutil.wait_procs(children, timeout=30)
    alive = [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left behind: {[(p.pid, p.name()) for p in alive]}"
    assert _status(env)[0] == 3  # not up any more
