"""Finding the running mesh from the launcher's state file: `demo` says how to start it when it is
down, `status --json` stays JSON, and the trace generator takes the broker from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.demo import DemoPlan, main
from infra.mesh_state import NOT_UP, kafka_address, running_mesh


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CACHEMESH_CACHE_DIR", str(tmp_path))
    return tmp_path


def _write_state(cache_dir: Path, pid: int) -> None:
    run = cache_dir / "run"
    run.mkdir(parents=True, exist_ok=True)
    state = {
        "launcher_pid": pid,
        "broker": {"name": "kafka", "bootstrap": "127.0.0.1:19092"},
        "postgres": {"dsn": None, "dsn_redacted": "postgresql://x"},
        "namespace": "ns.",
        "services": [
            {"name": "tiers", "health_url": "http://127.0.0.1:1234/healthz", "log": "tiers.log"},
            {"name": "dashboard", "health_url": "http://127.0.0.1:1235/healthz", "log": "dashboard.log"},
        ],
    }
    (run / "state.json").write_text(json.dumps(state))


def test_demo_says_how_to_start_the_mesh_when_it_is_down(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(DemoPlan(seconds=1)) == 3
    assert "make run" in capsys.readouterr().err.replace("\n", " ")
    assert "make run" in NOT_UP


def test_status_json_prints_json_when_the_mesh_is_down(cache_dir: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 3
    assert json.loads(result.stdout) == []


def test_the_running_mesh_is_read_from_the_state_file(cache_dir: Path) -> None:
    _write_state(cache_dir, os.getpid())  # a live "launcher": this process
    mesh = running_mesh()
    assert mesh is not None
    assert (mesh.bootstrap, mesh.namespace) == ("127.0.0.1:19092", "ns.")
    assert mesh.base_url("dashboard") == "http://127.0.0.1:1235"
    assert kafka_address({}) == ("127.0.0.1:19092", "ns.")
    assert kafka_address({"KAFKA_BOOTSTRAP": "b:1"}) == ("b:1", "")
    assert kafka_address({"KAFKA_BOOTSTRAP": "b:1", "KAFKA_TOPIC_NAMESPACE": "x."}) == ("b:1", "x.")


def test_a_state_file_left_by_a_dead_launcher_is_not_a_running_mesh(cache_dir: Path) -> None:
    _write_state(cache_dir, 2**22 + 12345)  # above the default pid_max: no such process
    assert running_mesh() is None
    assert kafka_address({}) == ("127.0.0.1:9092", "")
