import json
from pathlib import Path

from bench.report import render, write


def test_the_page_shows_every_result_file_and_says_so_when_there_is_none(tmp_path: Path) -> None:
    assert "No results yet" in render(tmp_path / "missing")
    (tmp_path / "gateway.json").write_text(json.dumps({"hit": {"p50_ms": 1.23456, "rows": [1, 2]}}))
    (tmp_path / "tiers.csv").write_text("system,hit_rate\ncachemesh,0.5\nredis,0.25\n")
    page = write(tmp_path, tmp_path / "page.md").read_text()
    assert (
        "## gateway.json" in page and "| `hit.p50_ms` | 1.235 |" in page and "| `hit.rows` | [1, 2] |" in page
    )
    assert "## tiers.csv" in page and "| system | hit_rate |" in page and "| redis | 0.25 |" in page
    assert "No results yet" not in page
