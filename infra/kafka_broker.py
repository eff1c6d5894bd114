"""The real Apache Kafka broker for local runs and tests: jars fetched once with Maven, one KRaft node."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.kafka_probe import broker_count
from infra.paths import LOOPBACK, cache_dir, free_port
from infra.process import InfraError, ManagedServer, ServerProcess

log = logging.getLogger(__name__)

DEFAULT_KAFKA_VERSION = "4.1.1"
_POM = Path(__file__).parent / "kafka" / "pom.xml"
_MARKER = ".complete"
_NODE_ID = 1


def _require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise InfraError(f"`{name}` is not on PATH; {hint}")
    return path


def java_executable() -> str:
    """`$JAVA_HOME/bin/java` when set, else `java` on PATH; a clear error when neither exists."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    return _require_tool("java", "Apache Kafka needs Java 17+ (e.g. apt-get install openjdk-17-jre-headless)")


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    # flock, not a lock file's existence: the kernel drops it if the holder dies mid-download.
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_kafka_jars(version: str = DEFAULT_KAFKA_VERSION, *, timeout_s: float = 900.0) -> Path:
    """The folder holding the broker's runtime jars for `version`, fetched with Maven on first use.

    The cache is `cache_dir()/kafka-<version>/libs`; a marker written after a complete fetch makes later
    calls free, and an inter-process lock lets parallel test runs and the launcher share one download.
    """
    root = cache_dir() / f"kafka-{version}"
    libs = root / "libs"
    if (root / _MARKER).exists():
        return libs
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".lock"):
        if (root / _MARKER).exists():  # another process finished it while we waited
            return libs
        mvn = _require_tool("mvn", "fetching the Kafka jars needs Maven (e.g. apt-get install maven)")
        java_executable()
        shutil.rmtree(libs, ignore_errors=True)
        # Maven runs on a copy of the pom so it never writes next to the installed package.
        pom = root / "pom.xml"
        shutil.copyfile(_POM, pom)
        command = [
            mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}", "-DincludeScope=runtime", f"-Dkafka.version={version}",
        ]  # fmt: skip
        began = time.monotonic()
        log.info("fetching Apache Kafka %s jars into %s", version, libs)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=root)
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"Maven did not fetch Kafka {version} within {timeout_s:.0f} s") from exc
        if done.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
            output = (done.stdout + done.stderr).strip().splitlines()[-30:]
            raise InfraError(
                f"Maven could not fetch Kafka {version} (exit {done.returncode}):\n" + "\n".join(output)
            )
        (root / _MARKER).write_text(f"{version}\n")
        log.info("fetched Kafka %s jars in %.1f s", version, time.monotonic() - began)
    return libs


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, never starting with '-' (as Kafka's own)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


# Console appender: the JVM's stdout is already redirected to logs/server.log, so broker logs and JVM
# crashes (which bypass log4j) land in the one file whose tail a failed start reports.
_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""

# SIDE: a second listener that tells its clients to come back through another port (`side_door`), where
# a proxy can stand to cut one client off the broker alone (bench/consistency.py's partition scenario).
# Single-node sizing: replication 1 everywhere, few partitions in the internal topics (50 by default,
# which makes the first consumer group wait while they are created), no rebalance delay for tests.
_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={node_id}@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},SIDE://{host}:{side_port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port},SIDE://{host}:{side_advertised_port}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SIDE:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs={log_dirs}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
"""


class ApacheKafkaBroker(ManagedServer):
    """One Apache Kafka KRaft node (broker + controller) on loopback, data in a temp dir unless given one.

    `restart()` keeps the port and the data (topics, offsets, committed groups survive). A temp data dir is
    deleted by `stop()` unless `keep_data=True`; a `data_dir` you pass is never deleted.
    """

    name = "kafka"
    temp_prefix = "cachemesh-kafka-"

    def __init__(
        self,
        version: str = DEFAULT_KAFKA_VERSION,
        port: int | None = None,
        data_dir: Path | str | None = None,
        heap_mb: int = 512,
        *,
        controller_port: int | None = None,
        keep_data: bool = False,
        start_timeout_s: float = 90.0,
    ) -> None:
        super().__init__(port, data_dir, keep_data=keep_data)
        self.version = version
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.fetch_seconds = 0.0
        self._controller_port = controller_port
        self._side_ports: tuple[int, int] | None = None  # (listening, advertised)
        self._cds_dump: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def side_door(self) -> tuple[str, str]:
        """(advertised, listening) addresses of the SIDE listener: a client bootstrapped at the first is
        told to reach the broker there, so a proxy at the first, forwarding to the second, carries all
        its traffic (and can cut it: infra/tcp_proxy.py). Known once the broker has started."""
        if self._side_ports is None:
            raise RuntimeError("the broker has not started")
        listening, advertised = self._side_ports
        return f"{LOOPBACK}:{advertised}", f"{LOOPBACK}:{listening}"

    def __repr__(self) -> str:
        return f"ApacheKafkaBroker(version={self.version!r}, bootstrap={self.bootstrap!r})"

    def _prepare(self) -> None:
        began = time.monotonic()
        self._libs = ensure_kafka_jars(self.version)
        self.fetch_seconds = time.monotonic() - began
        self._java = java_executable()

    def _launch(self, deadline: float) -> ServerProcess:
        if self._controller_port is None:
            self._controller_port = free_port()
        if self._side_ports is None:
            self._side_ports = (free_port(), free_port())
        data = self.data_dir
        (data / "logs").mkdir(parents=True, exist_ok=True)
        log_dirs = data / "kraft"
        (data / "log4j2.properties").write_text(_LOG4J2)
        config = data / "server.properties"
        config.write_text(
            _SERVER_PROPERTIES.format(
                node_id=_NODE_ID,
                host=LOOPBACK,
                port=self.port,
                controller_port=self._controller_port,
                side_port=self._side_ports[0],
                side_advertised_port=self._side_ports[1],
                log_dirs=log_dirs,
            )
        )
        java_opts = [
            *self._class_data_sharing(),
            f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
            "-cp", f"{self._libs}/*",
        ]  # fmt: skip
        if not (log_dirs / "meta.properties").exists():
            self._format(java_opts, config, data, deadline)
        if not self._cds_archive.exists():
            self._cds_dump = self._cds_archive.with_name(
                f"{self._cds_archive.name}.{os.getpid()}-{id(self)}.tmp"
            )
            java_opts.append(f"-XX:ArchiveClassesAtExit={self._cds_dump}")
        jvm = [
            f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m",
            # kafka-run-class.sh's defaults
            "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
        ]  # fmt: skip
        return ServerProcess(
            [self._java, *jvm, *java_opts, "kafka.Kafka", str(config)],
            log_path=data / "logs" / "server.log",
            cwd=data,
        )

    def _class_data_sharing(self) -> list[str]:
        # Loading Kafka's classes is most of a start. The first orderly stop dumps them into a CDS archive
        # next to the jars; later starts (and the format tool) map it, about twice as fast on 2 cores. The
        # archive is keyed by the java binary, and -Xshare:auto (the default) ignores one that no longer
        # matches.
        java = Path(self._java).resolve()
        key = hashlib.sha256(f"{java}:{java.stat().st_mtime_ns}".encode()).hexdigest()[:12]
        self._cds_archive = self._libs.parent / f"classes-{key}.jsa"
        self._cds_dump = None
        if self._cds_archive.exists():
            return [f"-XX:SharedArchiveFile={self._cds_archive}"]
        return []

    def _after_stop(self, proc: ServerProcess) -> None:
        dump, self._cds_dump = self._cds_dump, None
        if dump is None:
            return
        if proc.returncode in (0, 143) and dump.exists():  # 143: exited on our SIGTERM
            os.replace(dump, self._cds_archive)
        else:
            dump.unlink(missing_ok=True)

    def _format(self, java_opts: list[str], config: Path, data: Path, deadline: float) -> None:
        # A one-shot tool: C1 only and a small serial heap start the JVM faster.
        command = [
            self._java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *java_opts,
            "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config),
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                cwd=data,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired as exc:
            raise InfraError(f"formatting Kafka storage in {data} timed out") from exc
        if done.returncode != 0:
            raise InfraError(
                f"formatting Kafka storage in {data} failed:\n{(done.stdout + done.stderr)[-4000:]}"
            )

    def _probe(self) -> bool:
        return broker_count(self.bootstrap, timeout_s=1.0) >= 1
