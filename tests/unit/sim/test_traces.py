from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sim.traces import detect_format, from_requests, read_arc, read_lirs, read_mooncake, read_trace


def test_lirs_skips_markers_and_reads_gzip(tmp_path: Path) -> None:
    path = tmp_path / "tiny.trace.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("3\r\n*\n4\n\n3\n")
    trace = read_lirs(path)
    assert trace.keys.tolist() == [3, 4, 3]
    assert trace.times_ms.tolist() == [0, 1, 2]
    assert trace.name == "tiny"
    assert not trace.prefix
    assert trace.distinct == 2


def test_arc_lines_expand_to_consecutive_blocks(tmp_path: Path) -> None:
    path = tmp_path / "oltp.lis"
    path.write_text("10 3 0 1\n5 1 0 2\n11 2 0 3\n")
    assert read_arc(path).keys.tolist() == [10, 11, 12, 5, 11, 12]


def test_mooncake_requests_are_prefix_chains(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 7, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 2]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    trace = read_mooncake(path)
    assert trace.prefix
    assert trace.keys.tolist() == [0, 1, 0, 1, 2]
    assert trace.times_ms.tolist() == [0, 0, 7, 7, 7]
    assert trace.starts.tolist() == [0, 2, 5]
    assert trace.requests == 2


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("1\n2\n", "lirs"), ("*\n7\n", "lirs"), ("0 4 0 1\n", "arc"), ('{"hash_ids": [1]}\n', "mooncake")],
)
def test_detect_format(tmp_path: Path, text: str, fmt: str) -> None:
    path = tmp_path / "t.txt"
    path.write_text(text)
    assert detect_format(path) == fmt
    assert len(read_trace(path)) > 0


def test_from_requests_defaults_to_one_ms_per_request() -> None:
    trace = from_requests("r", [[1, 2], [1]])
    assert trace.times_ms.tolist() == [0, 0, 1]
