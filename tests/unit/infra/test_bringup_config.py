"""Bring-up choices that need no server: which broker/Postgres the environment selects, the download
cache, DSN redaction, the Kafka probe's wire format, and the sweep of folders left by killed runs."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pytest

from infra.brokers import ApacheKafkaBroker, Broker, ExternalBroker, TansuBroker, broker_from_env
from infra.kafka_broker import ensure_kafka_jars, new_cluster_id
from infra.kafka_probe import _broker_count, _metadata_request, split_bootstrap
from infra.paths import cache_dir
from infra.postgres import EmbeddedPostgres, ExternalPostgres, Postgres, postgres_from_env, redact_dsn
from infra.process import InfraError, make_temp_dir


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({}, ApacheKafkaBroker),
        ({"CACHEMESH_BROKER": "kafka"}, ApacheKafkaBroker),
        ({"CACHEMESH_BROKER": "tansu"}, TansuBroker),
        ({"CACHEMESH_BROKER": "tansu", "KAFKA_BOOTSTRAP": "kafka.example:9092"}, ExternalBroker),
        ({"KAFKA_BOOTSTRAP": "  "}, ApacheKafkaBroker),
    ],
)
def test_broker_from_env(env: dict[str, str], kind: type) -> None:
    assert type(broker_from_env(env)) is kind


def test_external_broker_keeps_the_given_bootstrap() -> None:
    broker = broker_from_env({"KAFKA_BOOTSTRAP": "a:1,b:2"})
    assert broker.bootstrap == "a:1,b:2" and broker.name == "external"


def test_unknown_broker_choice_is_an_error() -> None:
    with pytest.raises(InfraError, match="redpanda"):
        broker_from_env({"CACHEMESH_BROKER": "redpanda"})


def test_every_broker_and_postgres_meets_its_protocol() -> None:
    # Ports given: reading `bootstrap`/`dsn` would otherwise pick a free port with a socket.
    for broker in (ApacheKafkaBroker(port=9092), TansuBroker(port=9093), ExternalBroker("h:1")):
        assert isinstance(broker, Broker)
    for server in (EmbeddedPostgres(port=5432), ExternalPostgres("postgresql://h/db")):
        assert isinstance(server, Postgres)


def test_postgres_from_env() -> None:
    assert isinstance(postgres_from_env({}), EmbeddedPostgres)
    external = postgres_from_env({"DATABASE_URL": "postgresql://u:p@db:5432/c"})
    assert isinstance(external, ExternalPostgres) and external.dsn == "postgresql://u:p@db:5432/c"


def test_embedded_dsn_is_loopback_with_the_chosen_port() -> None:
    assert EmbeddedPostgres(port=5433).dsn == "postgresql://cachemesh@127.0.0.1:5433/cachemesh"


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://u:secret@db:5432/c", "postgresql://u:***@db:5432/c"),
        ("postgresql://u:p%40ss@db/c?sslmode=require", "postgresql://u:***@db/c?sslmode=require"),
        ("postgresql://u@db/c", "postgresql://u@db/c"),
        ("postgresql://db/c", "postgresql://db/c"),
    ],
)
def test_redact_dsn(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
    assert "secret" not in repr(ExternalPostgres(dsn))


@pytest.mark.parametrize(
    ("bootstrap", "address"),
    [("127.0.0.1:9092", ("127.0.0.1", 9092)), ("a:1, b:2", ("a", 1)), ("[::1]:9092", ("::1", 9092))],
)
def test_split_bootstrap(bootstrap: str, address: tuple[str, int]) -> None:
    assert split_bootstrap(bootstrap) == address


@pytest.mark.parametrize("bad", ["localhost", ":9092", "host:port"])
def test_split_bootstrap_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        split_bootstrap(bad)


@pytest.mark.parametrize(
    ("version", "request_bytes"),
    [
        (1, b"\x00\x00\x00\x00"),
        (4, b"\x00\x00\x00\x00\x00"),
        (8, b"\x00\x00\x00\x00\x00\x00\x00"),
    ],
)
def test_metadata_request_layout(version: int, request_bytes: bytes) -> None:
    assert _metadata_request(version) == request_bytes


@pytest.mark.parametrize(
    ("version", "prefix"), [(1, b""), (2, b""), (3, struct.pack(">i", 0)), (8, b"\0" * 4)]
)
def test_broker_count_reads_the_broker_array(version: int, prefix: bytes) -> None:
    body = prefix + struct.pack(">i", 1) + struct.pack(">ih9si", 1, 9, b"127.0.0.1", 9092)
    assert _broker_count(body, version) == 1


def test_cluster_ids_look_like_kafkas() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") and "=" not in i for i in ids)


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache_dir({"CACHEMESH_CACHE_DIR": str(tmp_path / "c")}) == tmp_path / "c"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir({}) == tmp_path / ".cache" / "cachemesh"
    assert (tmp_path / ".cache" / "cachemesh").is_dir()


def test_jar_fetch_is_skipped_once_complete_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHEMESH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(InfraError, match="mvn"):
        ensure_kafka_jars("9.9.9")
    (tmp_path / "kafka-9.9.9").mkdir(exist_ok=True)
    (tmp_path / "kafka-9.9.9" / ".complete").write_text("9.9.9\n")
    assert ensure_kafka_jars("9.9.9") == tmp_path / "kafka-9.9.9" / "libs"


def test_temp_dirs_of_dead_owners_are_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, live, unmarked = (tmp_path / f"cm-test-{name}" for name in ("dead", "live", "unmarked"))
    for folder in (dead, live, unmarked):
        folder.mkdir()
    (dead / ".cachemesh-owner-pid").write_text("999999999")  # above pid_max: never a live process
    (live / ".cachemesh-owner-pid").write_text("1")
    fresh = make_temp_dir("cm-test-")
    kept = make_temp_dir("cm-test-", keep=True)
    assert not dead.exists() and live.exists() and unmarked.exists()
    assert (fresh / ".cachemesh-owner-pid").exists() and not (kept / ".cachemesh-owner-pid").exists()
