"""The broker the services talk to: one interface over Apache Kafka, tansu and an external cluster, chosen
from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from infra.kafka_broker import DEFAULT_KAFKA_VERSION, ApacheKafkaBroker, ensure_kafka_jars
from infra.kafka_probe import broker_count, split_bootstrap
from infra.process import InfraError, wait_until_answers
from infra.tansu_broker import TansuBroker

__all__ = [
    "ApacheKafkaBroker",
    "Broker",
    "ExternalBroker",
    "InfraError",
    "TansuBroker",
    "broker_from_env",
    "ensure_kafka_jars",
]


@runtime_checkable
class Broker(Protocol):
    """A Kafka-protocol broker a test or the launcher can start, stop and restart.

    `start()` blocks until a Metadata request lists the broker and is a no-op when it runs; `stop()` is
    idempotent; `restart()` comes back on the same `bootstrap`.
    """

    name: str

    @property
    def bootstrap(self) -> str: ...

    @property
    def start_seconds(self) -> float: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def restart(self) -> None: ...

    def halt(self) -> None: ...  # stop it keeping its data and port (`start()` brings it back)

    def is_alive(self) -> bool: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class ExternalBroker:
    """A cluster someone else runs (`KAFKA_BOOTSTRAP`): start waits until it answers, stop does nothing."""

    name = "external"

    def __init__(self, bootstrap: str, *, start_timeout_s: float = 30.0) -> None:
        split_bootstrap(bootstrap)  # fail on a malformed address now, not at first use
        self._bootstrap = bootstrap
        self.start_timeout_s = start_timeout_s
        self._start_seconds = 0.0

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    @property
    def start_seconds(self) -> float:
        return self._start_seconds

    def __repr__(self) -> str:
        return f"ExternalBroker(bootstrap={self._bootstrap!r})"

    def start(self) -> None:
        self._start_seconds = wait_until_answers(
            lambda: broker_count(self._bootstrap, timeout_s=2.0), (OSError,), self.start_timeout_s,
            f"Kafka at {self._bootstrap}",
        )  # fmt: skip

    def stop(self) -> None:
        pass

    def restart(self) -> None:
        self.start()  # not ours to restart; just wait until it answers

    def halt(self) -> None:
        raise InfraError(f"Kafka at {self._bootstrap} is not ours to stop")

    def is_alive(self) -> bool:
        try:
            return broker_count(self._bootstrap, timeout_s=2.0) >= 1
        except OSError:
            return False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def broker_from_env(env: Mapping[str, str] = os.environ) -> Broker:
    """`KAFKA_BOOTSTRAP` set: that cluster; `CACHEMESH_BROKER=tansu`: tansu; otherwise Apache Kafka.

    Nothing is started; call `start()` (or use it as a context manager).
    """
    bootstrap = env.get("KAFKA_BOOTSTRAP", "").strip()
    if bootstrap:
        return ExternalBroker(bootstrap)
    choice = env.get("CACHEMESH_BROKER", "kafka").strip().lower() or "kafka"
    if choice == "tansu":
        return TansuBroker()
    if choice in ("kafka", "apache-kafka"):
        return ApacheKafkaBroker(DEFAULT_KAFKA_VERSION)
    raise InfraError(f"CACHEMESH_BROKER={choice!r}: expected 'kafka' or 'tansu' (or set KAFKA_BOOTSTRAP)")
