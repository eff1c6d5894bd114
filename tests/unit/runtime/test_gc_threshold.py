"""Every `python -m <service>` sets the young-generation GC threshold to its `gc_threshold` setting
(`CACHEMESH_<SERVICE>_GC_THRESHOLD`; the services allocate a few objects per event, and at Python's 700
the collector took a third of the streams stages' CPU, bench/streams_stages.py). Checked in a fresh
interpreter: the setting is process-wide."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import gc, importlib, sys
from services.runtime.service import configure_gc
module, name = sys.argv[1].rsplit(".", 1)
configure_gc(getattr(importlib.import_module(module), name)())
print(gc.get_threshold()[0])
"""
SETTINGS = {
    "STREAMS": "streams.settings.StreamsSettings",
    "TIERS": "services.tiers.settings.TiersSettings",
    "HEAT": "services.heat.settings.HeatSettings",
}


@pytest.mark.parametrize("service", sorted(SETTINGS))
@pytest.mark.parametrize(
    ("setting", "expected"), [("20000", 20_000), (None, 50_000), ("0", gc.get_threshold()[0])]
)
def test_a_service_process_sets_its_gc_threshold(service: str, setting: str | None, expected: int) -> None:
    variable = f"CACHEMESH_{service}_GC_THRESHOLD"
    env = {k: v for k, v in os.environ.items() if k != variable}
    env["PYTHONPATH"] = str(REPO)
    if setting is not None:
        env[variable] = setting
    out = subprocess.run(
        [sys.executable, "-c", PROBE, SETTINGS[service]],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(out.stdout.strip().splitlines()[-1]) == expected
