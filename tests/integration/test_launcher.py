"""`cachemesh up` end to end (the quick-start path, on tansu): everything comes up healthy,
`cachemesh status` says so, and Ctrl-C takes it all down leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra.paths import free_port

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
    # No model server behind the gateway (a port nothing listens on): it is up, and says it is degraded.
    env["CACHEMESH_GATEWAY_UPSTREAM_URL"] = f"http://127.0.0.1:{free_port()}/v1"
    launcher = subprocess.Popen(
        [*CLI, "up"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    # The launcher's stderr is read as it comes: `cachemesh status` can see every component healthy
    # a poll before the launcher's own loop does, and a Ctrl-C in between would stop it before it
    # says so. The test waits for both.
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.extend(iter(launcher.stderr.readline, b"")))  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 180
        code, rows = 3, []
        while time.monotonic() < deadline and launcher.poll() is None:
            code, rows = _status(env)
            if code == 0 and b"all up in" in b"".join(err_chunks):
                break
            time.sleep(1)
        assert launcher.poll() is None, b"".join(err_chunks).decode()[-3000:]
        assert code == 0, rows
        components = {r["component"] for r in rows}
        assert {"broker", "postgres"} <= components
        gateway = next(r for r in rows if r["component"] == "gateway")
        assert gateway["state"] == "degraded" and "upstream unreachable" in gateway["detail"], gateway
        # Where a person goes: each service lists what it serves, with its URL.
        tiers = next(r for r in rows if r["component"] == "tiers")
        assert tiers["endpoints"]["API docs"].endswith("/docs") and "metrics" in tiers["endpoints"], tiers
        assert gateway["endpoints"]["gateway (OpenAI base_url)"].endswith("/v1"), gateway
        dashboard = next(r for r in rows if r["component"] == "dashboard")
        assert dashboard["endpoints"]["dashboard"].endswith("/dashboard/"), dashboard
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert children, "broker, Postgres and services run as child processes"

        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=120)  # its stdout is one line of JSON: no pipe fills meanwhile
        out = launcher.stdout.read()  # type: ignore[union-attr]
    finally:
        if launcher.poll() is None:
            launcher.kill()
        reader.join(timeout=30)
    err = b"".join(err_chunks).decode()
    assert launcher.returncode == 0, err[-3000:]
    assert "all up in" in err and "gateway degraded: upstream unreachable" in err
    assert tiers["endpoints"]["cache API"] in err and dashboard["endpoints"]["dashboard"] in err, err[-3000:]
    timings = json.loads(out.decode().strip().splitlines()[-1])["timings"]
    assert timings["all_healthy_s"] > 0
    # Reaped or exited (a zombie has exited; reaping it is init's job), waited for, not slept on.
    _, running = psutil.wait_procs(children, timeout=30)
    alive = [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left behind: {[(p.pid, p.name()) for p in alive]}"
    assert _status(env)[0] == 3  # not up any more
