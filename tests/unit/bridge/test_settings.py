"""The bridge's settings: one engine from the single-engine fields, several from PUBLISHERS, ids unique,
and the model named (block keys are computed from it)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.bridge.settings import BridgeSettings, PublisherConfig


def test_the_single_engine_fields_make_one_publisher_named_after_the_node_by_default() -> None:
    s = BridgeSettings(
        node_id="host-1", endpoint="tcp://vllm:5557", replay_endpoint="tcp://vllm:5558", model="m"
    )
    assert s.engines() == [
        PublisherConfig(
            engine_id="host-1", endpoint="tcp://vllm:5557", replay_endpoint="tcp://vllm:5558", model="m"
        )
    ]
    assert BridgeSettings().engines() == []


def test_several_engines_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "CACHEMESH_BRIDGE_PUBLISHERS",
        '[{"engine_id": "a", "endpoint": "tcp://a:5557", "topic": "kv-events", "model": "m1"},'
        ' {"engine_id": "b", "endpoint": "tcp://b:5557", "model": "m2"}]',
    )
    assert [(p.engine_id, p.topic, p.model) for p in BridgeSettings().engines()] == [
        ("a", "kv-events", "m1"),
        ("b", "", "m2"),
    ]


def test_an_engine_without_its_model_is_refused() -> None:
    with pytest.raises(ValidationError, match="MODEL is required"):
        BridgeSettings(endpoint="tcp://a:5557")
    with pytest.raises(ValidationError, match="model"):
        PublisherConfig(engine_id="a", endpoint="tcp://a:5557")  # type: ignore[call-arg]


def test_engine_ids_must_be_unique() -> None:
    with pytest.raises(ValidationError, match="unique"):
        BridgeSettings(
            endpoint="tcp://a:5557",
            engine_id="a",
            model="m",
            publishers=[PublisherConfig(engine_id="a", endpoint="tcp://b:5557", model="m")],
        )
