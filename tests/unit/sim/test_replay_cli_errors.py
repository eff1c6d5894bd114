"""`cachemesh replay` of a file in the wrong format ends with a clear message and exit code 2, not a
traceback."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app


@pytest.mark.parametrize(
    ("name", "content", "extra"),
    [
        ("notes.txt", b"this is not a trace\nat all\n", []),
        ("requests.jsonl", b'{"timestamp": 0}\n', ["--format", "mooncake"]),
        ("blocks.trace", b"1\n2\n3\n", ["--format", "mooncake"]),
        ("keys.trace.gz", b"not gzip at all", []),
        ("bad.arc", b"one two three four\n", ["--format", "arc"]),
    ],
)
def test_a_trace_in_the_wrong_format_is_a_clear_error(
    tmp_path: Path, name: str, content: bytes, extra: list[str]
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    result = CliRunner().invoke(app, ["replay", str(path), "-p", "lru", "--out", str(tmp_path), *extra])
    assert result.exit_code == 2, result.output
    assert "cannot read" in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_good_trace_still_replays(tmp_path: Path) -> None:
    path = tmp_path / "keys.trace.gz"
    path.write_bytes(gzip.compress(b"\n".join(str(k % 7).encode() for k in range(200))))
    result = CliRunner().invoke(app, ["replay", str(path), "-p", "lru", "-c", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
