"""A service's output line by line into JSON lines: JSON objects pass, anything else is wrapped as a
`stderr` record, terminal escapes and spinner redraws are gone."""

from __future__ import annotations

import json

import pytest

from infra.service_log import as_json_line, clean

NOW = 1_764_640_800.25  # 2025-12-02T02:00:00.250Z


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"plain\n", b"plain"),
        (b"\x1b[31mred\x1b[0m text\r\n", b"red text"),
        (b"\x1b[1;38;5;208mbold orange\x1b[39;49m", b"bold orange"),
        (b"\x1b]0;a title\x07after", b"after"),
        (b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", b"link"),
        (b"spin |\rspin /\rspin -\x1b[K", b"spin -"),
        (b"\x1b7saved\x1b8", b"saved"),
        (b"\x1b(Bcharset", b"charset"),
        (b"bell\x07 and nul\x00 and tab\tstay", b"bell and nul and tab\tstay"),
        (b"lone escape \x1b", b"lone escape "),
    ],
)
def test_clean_leaves_what_a_terminal_shows(raw: bytes, expected: bytes) -> None:
    assert clean(raw) == expected


def test_a_json_record_passes_as_written() -> None:
    record = b'{"ts": "x", "level": "info", "service": "tiers", "msg": "started"}'
    assert as_json_line(record + b"\n", "tiers", NOW) == record + b"\n"


@pytest.mark.parametrize(
    "raw",
    [
        b"nanobind: leaked 3 instances!\n",
        b' - leaked instance 0x7f3a of type "triton._C.libtriton.ir.context"\n',
        b"Traceback (most recent call last):\n",
        b"{not json at all\n",
        b"[1, 2, 3]\n",  # JSON, but not a record
        b'\x1b[33m{"msg": "coloured"}\x1b[0m\n',
        b"caf\xc3\xa9 and a broken byte \xff\n",
    ],
)
def test_anything_else_becomes_a_stderr_record(raw: bytes) -> None:
    out = as_json_line(raw, "tiers", NOW)
    assert out.endswith(b"\n") and out.count(b"\n") == 1 and b"\x1b" not in out
    doc = json.loads(out)
    if raw.startswith(b"\x1b[33m"):
        assert doc == {"msg": "coloured"}  # the escapes were all that kept it from being a record
        return
    assert doc == {
        "ts": "2025-12-02T02:00:00.250Z",
        "level": "warning",
        "service": "tiers",
        "logger": "stderr",
        "msg": clean(raw).decode("utf-8", errors="replace"),
    }


@pytest.mark.parametrize("raw", [b"\n", b"   \r\n", b"\x1b[2K\r", b""])
def test_blank_lines_are_dropped(raw: bytes) -> None:
    assert as_json_line(raw, "heat", NOW) == b""
