"""Pure pieces of the runtime and launcher: no sockets, no servers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from opentelemetry import trace

from infra.launcher import default_services, discover_services, module_for
from services.runtime.consume import Dedupe
from services.runtime.logs import JsonFormatter
from services.runtime.postgres import _choose, load_migrations, redact_dsn
from services.runtime.settings import KafkaSettings, PostgresSettings
from services.runtime.tracing import configure_tracing, headers_carrier


def test_dedupe_remembers_a_bounded_window() -> None:
    dedupe = Dedupe(capacity=2)
    for event_id in ("a", "b"):
        assert not dedupe.seen(event_id)
        dedupe.remember(event_id)
    assert dedupe.seen("a")  # refreshes "a": "b" is now the oldest
    dedupe.remember("c")
    assert dedupe.seen("a") and dedupe.seen("c") and not dedupe.seen("b")


def test_dedupe_window_zero_remembers_nothing() -> None:
    dedupe = Dedupe(capacity=0)
    dedupe.remember("a")
    assert not dedupe.seen("a")


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://h/db", "postgresql://h/db"),
    ],
)
def test_dsn_passwords_never_show(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown


def test_migrations_are_numbered_and_version_two_has_both_variants() -> None:
    migrations = load_migrations()
    assert sorted(migrations) == list(range(1, len(migrations) + 1))
    assert _choose(migrations[2], has_vector=True).variant == "vector"
    assert _choose(migrations[2], has_vector=False).variant == "plain"
    assert "__EMBEDDING_DIM__" in _choose(migrations[2], has_vector=True).sql


def test_settings_read_conventional_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "10.0.0.1:9092")
    monkeypatch.setenv("KAFKA_MAX_EVENT_BYTES", "1024")
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:pw@db/x")
    kafka, pg = KafkaSettings(), PostgresSettings()
    assert kafka.bootstrap == "10.0.0.1:9092" and kafka.max_event_bytes == 1024
    assert pg.database_url.get_secret_value() == "postgresql://u:pw@db/x"
    assert "pw" not in repr(pg)


def test_json_logs_carry_the_trace_id() -> None:
    configure_tracing("unit")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.topic = "cache.access.v1"
    with trace.get_tracer("unit").start_as_current_span("op") as span:
        doc = json.loads(JsonFormatter("svc").format(record))
    assert doc["msg"] == "hello world"
    assert doc["service"] == "svc" and doc["topic"] == "cache.access.v1"
    assert doc["trace_id"] == format(span.get_span_context().trace_id, "032x")


def test_only_trace_headers_reach_the_propagator() -> None:
    carrier = headers_carrier([("traceparent", b"00-ab-cd-01"), ("event_type", b"x"), ("tracestate", b"k=v")])
    assert carrier == {"traceparent": "00-ab-cd-01", "tracestate": "k=v"}


def test_services_are_folders_with_a_main(tmp_path: Path) -> None:
    for name, has_main in (("heat", True), ("runtime", True), ("notes", False), ("_private", True)):
        (tmp_path / name).mkdir()
        if has_main:
            (tmp_path / name / "__main__.py").write_text("")
    assert discover_services(tmp_path) == ["heat"]


def test_a_top_level_package_on_the_service_lifecycle_is_a_service(tmp_path: Path) -> None:
    services = tmp_path / "services"
    (services / "heat").mkdir(parents=True)
    (services / "heat" / "__main__.py").write_text("")
    for name, body in (("worker", "run_service(lambda: W())\n"), ("bench", "print('tables')\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__main__.py").write_text(body)
    assert discover_services(services) == ["heat", "worker"]
    assert [module_for(n, services) for n in ("heat", "worker")] == ["services.heat", "worker"]


def test_the_bridge_runs_by_default_only_once_an_endpoint_is_configured(tmp_path: Path) -> None:
    for name in ("heat", "bridge"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__main__.py").write_text("")
    assert default_services({}, tmp_path) == ["heat"]
    assert default_services({"CACHEMESH_BRIDGE_ENDPOINT": "tcp://vllm:5557"}, tmp_path) == ["bridge", "heat"]
