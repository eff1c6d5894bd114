"""The launcher's fixed metrics ports: one per service, distinct, clear of the other fixed ports, the
same ones deploy/prometheus.yml lists; a taken default falls back, the env variable overrides; and
`deploy.targets` writes only the services the static list cannot name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deploy.targets import targets
from infra.launcher import METRICS_PORTS, discover_services, metrics_port_for
from services.dashboard.settings import DashboardSettings
from services.gateway.settings import GatewaySettings
from services.tiers.settings import TiersSettings

PROMETHEUS = Path(__file__).resolve().parents[3] / "deploy" / "prometheus.yml"


def _default(settings: type, field: str) -> int:
    value = settings.model_fields[field].default
    assert isinstance(value, int)
    return value


def test_every_service_has_its_own_fixed_port_clear_of_the_others() -> None:
    assert set(METRICS_PORTS) == set(discover_services())
    ports = list(METRICS_PORTS.values())
    assert len(ports) == len(set(ports))
    fixed_elsewhere = {
        _default(TiersSettings, "api_port"),
        _default(TiersSettings, "block_port"),
        _default(GatewaySettings, "api_port"),
        _default(DashboardSettings, "http_port"),
    }
    assert fixed_elsewhere == {8700, 8701, 8780, 8790}
    assert not fixed_elsewhere & set(ports)
    assert all(1024 < p < 32768 for p in ports)  # unprivileged, below Linux's ephemeral range


def test_the_scrape_config_lists_exactly_the_fixed_ports() -> None:
    (job,) = yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]
    listed = {}
    for group in job["static_configs"]:
        (target,) = group["targets"]
        host, port = target.split(":")
        assert host == "127.0.0.1"
        listed[group["labels"]["service"]] = int(port)
    assert listed == METRICS_PORTS
    for port in METRICS_PORTS.values():
        assert str(port) in PROMETHEUS.read_text()


def test_a_free_default_is_used() -> None:
    assert metrics_port_for("tiers", {}, is_free=lambda _: True, pick_free=lambda: 1) == (8716, "default")


def test_a_taken_default_falls_back_to_a_free_port() -> None:
    taken = {METRICS_PORTS["heat"]}
    got = metrics_port_for("heat", {}, is_free=lambda p: p not in taken, pick_free=lambda: 40123)
    assert got == (40123, "fallback")


def test_a_service_without_a_default_gets_a_free_port() -> None:
    assert metrics_port_for("newcomer", {}, is_free=lambda _: True, pick_free=lambda: 40124) == (
        40124,
        "fallback",
    )


@pytest.mark.parametrize(("value", "expected"), [("9999", 9999), ("0", 40125)])
def test_the_env_variable_overrides(value: str, expected: int) -> None:
    env = {"CACHEMESH_STREAMS_METRICS_PORT": value}

    def never(_: int) -> bool:
        raise AssertionError("an overridden port is not probed")

    assert metrics_port_for("streams", env, is_free=never, pick_free=lambda: 40125) == (expected, "env")


def test_targets_leave_out_services_on_their_fixed_port() -> None:
    state = {
        "namespace": "",
        "services": [
            {"name": "tiers", "health_url": f"http://127.0.0.1:{METRICS_PORTS['tiers']}/healthz"},
            {"name": "heat", "health_url": "http://127.0.0.1:40002/healthz"},
            {"name": "streams", "health_url": f"http://127.0.0.1:{METRICS_PORTS['heat']}/healthz"},
        ],
    }
    assert [g["labels"]["service"] for g in targets(state)] == ["heat", "streams"]  # type: ignore[index]
