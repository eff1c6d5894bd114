"""`cachemesh up --vllm 1`: the whole stack in one command, with a real vLLM instance on this CPU
behind the gateway (its KV events through the bridge, its blocks through the tier node's connector):
a chat completion is served by the engine, then from the cache; Ctrl-C takes it all down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.tansu, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "infra.cli"]


@pytest.mark.timeout(600)
def test_up_with_a_local_vllm_serves_and_caches_chat_completions(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DATABASE_URL")}
    env.update(CACHEMESH_CACHE_DIR=str(tmp_path), CACHEMESH_BROKER="tansu", PYTHONPATH=str(REPO))
    up = [*CLI, "up", "--vllm", "1", "-s", "tiers", "-s", "gateway"]
    launcher = subprocess.Popen(up, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.extend(iter(launcher.stderr.readline, b"")))  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline and launcher.poll() is None:
            said = b"".join(err_chunks)
            if b"all up in" in said and b"vllm-0, vLLM (OpenAI base_url)" in said:  # the where table follows
                break
            time.sleep(1)
        err = b"".join(err_chunks).decode()
        assert launcher.poll() is None and "all up in" in err, err[-3000:]
        assert "vllm-0, vLLM (OpenAI base_url)" in err, err[-3000:]  # where it is
        status = subprocess.run(
            [*CLI, "status", "--json"], env=env, cwd=REPO, capture_output=True, timeout=60
        )
        engine = next(r for r in json.loads(status.stdout) if r["component"] == "vllm-0")
        assert engine["state"] == "healthy" and engine["detail"] == "cachemesh-small", engine
        assert engine["endpoints"]["vllm-0, vLLM (OpenAI base_url)"].endswith("/v1"), engine
        children = psutil.Process(launcher.pid).children(recursive=True)
        # greedy: a second miss (before the first answer is stored) gets the same answer from the engine
        body = {
            "model": "cachemesh-small",
            "messages": [{"role": "user", "content": "Hello there, engine!"}],
            "temperature": 0,
            "max_tokens": 16,
        }
        with httpx.Client(base_url="http://127.0.0.1:8780/v1", timeout=120) as http:
            first = http.post("/chat/completions", json=body)
            assert first.status_code == 200, first.text
            assert first.headers["x-cachemesh-cache"] == "miss"
            assert first.headers["x-cachemesh-instance"] == "vllm-0"  # routed to the engine by the gateway
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the answer is stored in the background
                again = http.post("/chat/completions", json=body)
                if again.headers["x-cachemesh-cache"] == "hit":
                    break
                time.sleep(0.2)
            assert again.headers["x-cachemesh-cache"] == "hit"
            assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=180)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        reader.join(timeout=30)
    assert launcher.returncode == 0, b"".join(err_chunks).decode()[-3000:]
    _, running = psutil.wait_procs(children, timeout=60)
    alive = [p for p in running if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left behind: {[(p.pid, p.name()) for p in alive]}"
    assert json.loads(launcher.stdout.read().decode().strip().splitlines()[-1])["timings"]  # type: ignore[union-attr]
