from __future__ import annotations

import csv
from pathlib import Path

from sim.cli import replay


def test_replay_writes_csv_and_plot(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "tiny.txt"
    trace.write_text("\n".join(str(k % 7) for k in range(200)) + "\n")
    replay(trace, policy=["lru", "heat", "opt"], capacity=[2, 4], out=tmp_path / "out", fmt=None, seed=0)
    rows = list(csv.DictReader((tmp_path / "out" / "tiny_replay.csv").open()))
    assert [(r["policy"], r["capacity"]) for r in rows] == [
        ("lru", "2"),
        ("lru", "4"),
        ("heat", "2"),
        ("heat", "4"),
        ("opt", "2"),
        ("opt", "4"),
    ]
    assert (tmp_path / "out" / "tiny_replay.png").stat().st_size > 0
    assert "tiny" in capsys.readouterr().out
