"""infra/engines.py: how `cachemesh up --vllm N` points the gateway and the bridge at its instances."""

from __future__ import annotations

import json

import pytest

from infra.engines import wiring
from services.bridge.settings import BridgeSettings
from services.gateway.settings import GatewaySettings


def test_the_gateway_routes_among_the_instances_and_the_bridge_hears_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = wiring(
        ["http://127.0.0.1:9001", "http://127.0.0.1:9002"],
        [("ipc:///tmp/a.sock", "tcp://127.0.0.1:7001"), ("ipc:///tmp/b.sock", "tcp://127.0.0.1:7002")],
        "/models/small",
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gateway = GatewaySettings()
    assert [u.url for u in gateway.upstreams] == ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9002/v1"]
    assert str(gateway.routing_tokenizer_dir) == "/models/small" and gateway.routing_block_size == 32
    bridge = BridgeSettings()
    assert [p.endpoint for p in bridge.publishers] == ["ipc:///tmp/a.sock", "ipc:///tmp/b.sock"]
    # the gateway's instance and the bridge's engine are one name: routing reads the KV events by it
    assert [u.engine_id for u in gateway.upstreams] == [p.engine_id for p in bridge.publishers]
    assert json.loads(env["CACHEMESH_GATEWAY_UPSTREAMS"])[0]["name"] == "vllm-0"


def test_wiring_needs_an_events_pair_per_instance() -> None:
    with pytest.raises(ValueError, match="one events pair per instance"):
        wiring(["http://127.0.0.1:9001"], [], "/models/small")
    with pytest.raises(ValueError):
        wiring([], [], "/models/small")


def test_the_gateway_gets_the_stand_in_only_when_it_has_no_model_server() -> None:
    import socket

    from infra.launcher import upstream_configured
    from infra.paths import free_port

    port = free_port()
    assert not upstream_configured({}, default_port=port)
    assert upstream_configured({"CACHEMESH_GATEWAY_UPSTREAM_URL": "http://h:1/v1"}, default_port=port)
    assert upstream_configured({"CACHEMESH_GATEWAY_UPSTREAMS": '[{"name": "a"}]'}, default_port=port)
    with socket.socket() as listening:  # a model server on the default port (vllm serve --port 8000)
        listening.bind(("127.0.0.1", port))
        listening.listen()
        assert upstream_configured({}, default_port=port)
