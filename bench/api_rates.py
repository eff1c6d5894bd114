"""CPU per exact lookup against the request rate: where bench/api.py's "<= 100 us per lookup at the paced
rate" goes. One tier node (bench/api.py's, in its own process), exact-key lookups in L1 from a load
generator in another process: open loops at several rates and a closed loop at one client, with and
without the node publishing its cache.access events. Each row gives the node's user and system CPU per
lookup from /proc, above its idle share (measured first, with no requests).

A cost per lookup that grows as the rate falls is a cost per wake-up (a request that arrives alone), not
per lookup of work; the closed loop is the floor the code itself sets.

    python -m bench.api_rates [--rates 250,1000,4000] [--seconds 5]
    (KAFKA_BOOTSTRAP / DATABASE_URL: a broker and Postgres, as for bench/api.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.api import KEYS, REPO, _request, run_load


def _ticks(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / hz, int(fields[12]) / hz


def measure(rates: list[float], seconds: float, drop_access: bool) -> list[dict[str, float | str]]:
    prefix = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "KAFKA_TOPIC_NAMESPACE": f"brates{prefix}.",
        "CACHEMESH_TIERS_LOG_LEVEL": "WARNING",
    }
    cmd = [sys.executable, "-m", "bench.api", "--serve", prefix]
    if drop_access:
        cmd.append("--drop-access-events")
    node = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rows: list[dict[str, float | str]] = []
    try:
        assert node.stdout is not None
        info = json.loads(node.stdout.readline())
        url, pid = info["url"], info["pid"]
        host = url.removeprefix("http://")
        bodies = [
            _request(host, "/v1/lookup", json.dumps({"key": f"{prefix}-{i}"}).encode()) for i in range(KEYS)
        ]
        run_load("closed", url, bodies, 1, 1.0)  # warm up both sides
        u0, s0 = _ticks(pid)
        time.sleep(seconds)
        u1, s1 = _ticks(pid)
        idle_user, idle_sys = (u1 - u0) / seconds, (s1 - s0) / seconds
        loads = [(f"open loop {r:,.0f}/s", "open", r) for r in rates]
        loads.append(("closed loop, 1 client", "closed", 1))
        for name, kind, arg in loads:
            u0, s0, t0 = *_ticks(pid), time.perf_counter()
            r = run_load(kind, url, bodies, arg, seconds)
            u1, s1 = _ticks(pid)
            dt, n = time.perf_counter() - t0, max(int(r["requests"]), 1)
            rows.append(
                {
                    "load": name,
                    "per_s": float(r["per_s"]),
                    "user_us": (u1 - u0 - idle_user * dt) / n * 1e6,
                    "sys_us": (s1 - s0 - idle_sys * dt) / n * 1e6,
                    "idle_pct": 100 * (idle_user + idle_sys),
                }
            )
    finally:
        if node.stdin is not None:
            node.stdin.close()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="250,1000,4000", help="open-loop lookups/s, comma-separated")
    p.add_argument("--seconds", type=float, default=5.0, help="per row")
    args = p.parse_args()
    for var in ("KAFKA_BOOTSTRAP", "DATABASE_URL"):
        if not os.environ.get(var):
            sys.exit(f"{var} is not set: point it at a broker and Postgres")
    rates = [float(r) for r in args.rates.split(",") if r]
    with_events = measure(rates, args.seconds, drop_access=False)
    without = measure(rates, args.seconds, drop_access=True)
    cores = os.cpu_count()
    print(f"\nnode CPU per exact lookup above its idle share; {args.seconds:g} s per row, {cores} cores")
    head = f"{'load':26} {'lookups/s':>10} {'user us':>9} {'sys us':>8}"
    print(f"{head} {'no access events: user':>23} {'sys':>6}")
    for a, b in zip(with_events, without, strict=True):
        print(
            f"{a['load']:26} {a['per_s']:10,.0f} {a['user_us']:9.0f} {a['sys_us']:8.0f}"
            f" {b['user_us']:23.0f} {b['sys_us']:6.0f}"
        )
    print(f"idle node: {with_events[0]['idle_pct']:.1f}% of a core; target: <= 100 us per exact lookup")


if __name__ == "__main__":
    main()
