from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from policies.admission.sketch import FrequencySketch, stable_hash


def test_stable_hash_is_process_independent_for_strings() -> None:
    # Other interpreters, each with its own PYTHONHASHSEED (Python's str hash differs between them).
    code = "from policies.admission.sketch import stable_hash; print(stable_hash('prompt:abc'))"
    root = str(Path(__file__).resolve().parents[3])
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert int(out.stdout) == stable_hash("prompt:abc")
    assert stable_hash("a") != stable_hash("b")
    assert stable_hash(7, seed=1) != stable_hash(7, seed=2)


def test_doorkeeper_absorbs_the_first_sighting() -> None:
    sketch = FrequencySketch(64)
    assert sketch.frequency("k") == 0
    sketch.increment("k")
    assert sketch.frequency("k") == 1  # doorkeeper only
    sketch.increment("k")
    assert sketch.frequency("k") == 2  # sketch 1 + doorkeeper


def test_counts_saturate_at_15_plus_doorkeeper() -> None:
    sketch = FrequencySketch(64)
    for _ in range(40):
        sketch.increment(1)
    assert sketch.frequency(1) == 16


def test_aging_halves_counts_and_clears_the_doorkeeper() -> None:
    sketch = FrequencySketch(16, sample_factor=10)  # resets after 160 additions
    for _ in range(9):
        sketch.increment("hot")
    before = sketch.frequency("hot")
    for i in range(160):
        sketch.increment(("cold", i))
    assert sketch.resets >= 1
    assert sketch.frequency("hot") <= before // 2


def test_without_doorkeeper_first_sighting_counts() -> None:
    sketch = FrequencySketch(64, doorkeeper=False)
    sketch.increment("k")
    assert sketch.frequency("k") == 1
