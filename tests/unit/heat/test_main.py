"""`python -m services.heat` limits the BLAS and torch thread pools to `CACHEMESH_HEAT_THREADS` (its
matrices are tiny; bench/heat_scale.py measured the default pools costing half as much CPU again per
event). Checked in a fresh interpreter: the limits are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import json, torch
from threadpoolctl import threadpool_info
from services.heat.__main__ import _service
_service()
blas = sorted({p["num_threads"] for p in threadpool_info()})
print(json.dumps({"torch": torch.get_num_threads(), "blas": blas}))
"""


@pytest.mark.parametrize("threads", [1, 2])
def test_the_entry_point_sets_the_thread_pools(threads: int) -> None:
    env = {**os.environ, "CACHEMESH_HEAT_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["torch"] == threads
    assert seen["blas"] == [threads]
