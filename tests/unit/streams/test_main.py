"""`python -m streams` sets the young-generation GC threshold to `CACHEMESH_STREAMS_GC_THRESHOLD` (the
stages allocate a few objects per access; at Python's 700 the collector took a third of their CPU,
bench/streams_stages.py). Checked in a fresh interpreter: the setting is process-wide."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROBE = "import gc; from streams.__main__ import _service; _service(); print(gc.get_threshold()[0])"


@pytest.mark.parametrize(
    ("setting", "expected"), [("20000", 20_000), (None, 50_000), ("0", gc.get_threshold()[0])]
)
def test_the_entry_point_sets_the_gc_threshold(setting: str | None, expected: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CACHEMESH_STREAMS_GC_THRESHOLD"}
    env["PYTHONPATH"] = str(REPO)
    if setting is not None:
        env["CACHEMESH_STREAMS_GC_THRESHOLD"] = setting
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(out.stdout.strip().splitlines()[-1]) == expected
