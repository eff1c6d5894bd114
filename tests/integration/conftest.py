"""Session fixtures: the real Apache Kafka broker, tansu, and embedded Postgres with pgvector,
started once per test session (or taken from KAFKA_BOOTSTRAP / DATABASE_URL), plus a fresh topic
namespace per test so tests never see each other's events."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from pydantic import SecretStr

from infra.brokers import ApacheKafkaBroker, Broker, TansuBroker, broker_from_env
from infra.postgres import EmbeddedPostgres, postgres_from_env
from infra.vllm_env import unsupported_reason
from services.runtime.settings import KafkaSettings, PostgresSettings
from services.runtime.topics import ensure_topics
from services.tiers.settings import TiersSettings

pytestmark = pytest.mark.integration


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `vllm` run real engines; they skip only where vLLM cannot run at all (never for a
    missing install: the fixtures build what is missing), with the reason shown."""
    reason = unsupported_reason()
    if reason is not None:
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def kafka() -> Iterator[Broker]:
    broker = broker_from_env() if os.environ.get("KAFKA_BOOTSTRAP") else ApacheKafkaBroker()
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    broker = TansuBroker()
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    server = postgres_from_env() if os.environ.get("DATABASE_URL") else EmbeddedPostgres()
    server.start()
    yield server  # type: ignore[misc]
    server.stop()


@pytest.fixture(params=["kafka", pytest.param("tansu", marks=pytest.mark.tansu)])
def any_broker(request: pytest.FixtureRequest) -> Broker:
    """Parametrises a test over Apache Kafka and tansu."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


def kafka_settings_for(broker: Broker, namespace: str, **overrides: object) -> KafkaSettings:
    return KafkaSettings(bootstrap=broker.bootstrap, topic_namespace=namespace, **overrides)  # type: ignore[arg-type]


@pytest.fixture
async def topics_on(namespace: str):  # type: ignore[no-untyped-def]
    """Call with a broker to create the catalogue topics under this test's namespace."""

    async def create(broker: Broker) -> str:
        await ensure_topics(broker.bootstrap, namespace)
        return namespace

    return create


@pytest.fixture
def pg_settings(postgres: EmbeddedPostgres) -> PostgresSettings:
    return PostgresSettings(database_url=SecretStr(postgres.dsn), pg_retry_deadline_s=60)


@pytest.fixture
def node_settings(kafka, namespace, pg_settings) -> Callable[..., TiersSettings]:  # type: ignore[no-untyped-def]
    """Settings for an in-process tier node on this test's namespace (ephemeral ports)."""

    def make(node_id: str, **kw: object) -> TiersSettings:
        base: dict[str, object] = {
            "node_id": f"{node_id}-{namespace}",
            "api_port": 0,
            "block_port": 0,
            "metrics_port": 0,
            "embedder_preload": False,
            "l1_max_entries": 10_000,
            "l2_pages": 64,
            "kafka": kafka_settings_for(kafka, namespace),
            "postgres": pg_settings,
        }
        return TiersSettings(**{**base, **kw})  # type: ignore[arg-type]

    return make
