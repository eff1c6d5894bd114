"""A service started as the launcher starts it (`ServiceProcess`) writes only JSON lines to its log, even
when it prints raw lines to stdout and stderr, colours them, and writes to fd 2 at interpreter exit, past
logging (what triton's nanobind leak report did in tiers.log)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from infra.launcher import ServiceProcess

pytestmark = pytest.mark.integration

NOISY = """
import atexit, json, logging, os, sys

from services.runtime.logs import configure_logging

configure_logging("noisy")
logging.getLogger("noisy").info("started", extra={"port": 1})
print("a plain print on stdout", flush=True)
sys.stderr.write("\\x1b[31mcoloured\\x1b[0m warning on stderr\\n")
sys.stderr.write("spin |\\rspin /\\rdone\\n")
sys.stderr.write(json.dumps({"already": "json"}) + "\\n")
sys.stderr.flush()
# Straight to fd 2 at exit, past logging, as native code does while the interpreter finalizes.
atexit.register(lambda: os.write(2, b"nanobind: leaked 2 instances!\\n - leaked instance of type x\\n"))
atexit.register(lambda: logging.getLogger("noisy").info("stopping"))
"""


@pytest.mark.timeout(60)
def test_every_line_of_a_noisy_services_log_is_json(tmp_path: Path) -> None:
    package = tmp_path / "noisy"
    package.mkdir()
    (package / "__main__.py").write_text(NOISY)
    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)]),
        "TERM": "xterm-256color",
        "FORCE_COLOR": "1",
    }
    log = tmp_path / "noisy.log"
    service = ServiceProcess("noisy", env, log, metrics_port=0)
    service.start()
    assert service.proc is not None
    deadline = time.monotonic() + 30
    while service.proc.is_alive():
        assert time.monotonic() < deadline, "the noisy service did not exit"
        time.sleep(0.05)
    assert service.proc.returncode == 0, log.read_text()
    service.stop()  # reaps it and waits for the last lines to reach the log

    raw = log.read_bytes()
    assert b"\x1b" not in raw
    docs = [json.loads(line) for line in raw.splitlines()]  # every line parses
    assert all(isinstance(d, dict) for d in docs)
    wrapped = [d["msg"] for d in docs if d.get("logger") == "stderr"]
    assert wrapped == [
        "a plain print on stdout",
        "coloured warning on stderr",
        "done",
        "nanobind: leaked 2 instances!",
        " - leaked instance of type x",
    ]
    for doc in docs:
        if doc.get("logger") == "stderr":
            assert doc["service"] == "noisy" and doc["level"] == "warning"
    assert {"already": "json"} in docs
    assert [d["msg"] for d in docs if d.get("logger") == "noisy"] == ["started", "stopping"]
