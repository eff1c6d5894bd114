"""`cachemesh up`: one command that brings the mesh up on one machine and takes it down again.

Starts the broker and Postgres (embedded unless KAFKA_BOOTSTRAP / DATABASE_URL say otherwise),
creates the catalogue's topics, applies migrations, then runs every service that exists
(`services/<name>/__main__.py`) as its own process on its fixed metrics port, its output kept as JSON
lines in its log, restarting one that dies. A state file lets `cachemesh status` find every component.
Ctrl-C stops services first, then Postgres, then the broker. With `vllm` > 0 (`cachemesh up --vllm N`)
it also serves N local vLLM instances (infra/engines.py) behind the gateway, their KV events through
the bridge and their KV blocks through the tier node; they start beside the services (a minute or
more on a CPU) and stop before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
from pydantic import SecretStr

from infra.brokers import Broker, broker_from_env
from infra.paths import cache_dir, free_port, port_is_free
from infra.postgres import Postgres, postgres_from_env
from infra.process import ServerProcess
from infra.service_log import json_lines_for
from services.runtime.postgres import Database, apply_migrations, redact_dsn
from services.runtime.settings import PostgresSettings
from services.runtime.topics import ensure_topics

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVICES_DIR = REPO_ROOT / "services"
NOT_SERVICES = {"runtime"}
# Services started by default only once configured (any of these variables set): the vLLM bridge has
# nothing to listen to without an engine's endpoint. Named with --service they always start.
OPT_IN_SERVICES = {"bridge": ("CACHEMESH_BRIDGE_ENDPOINT", "CACHEMESH_BRIDGE_PUBLISHERS")}
# Each service's metrics port (/metrics, /healthz) under `cachemesh up`, fixed so that a scrape config
# can name it (deploy/prometheus.yml lists these): a block of cachemesh's own 87xx range, clear of the
# tier node's API and block ports (8700, 8701), the gateway (8780) and the dashboard page (8790).
# CACHEMESH_<SERVICE>_METRICS_PORT overrides one; a default found taken falls back to a free port.
METRICS_PORTS = {
    "bridge": 8710,
    "dashboard": 8711,
    "gateway": 8712,
    "heat": 8713,
    "invalidation": 8714,
    "streams": 8715,
    "tiers": 8716,
    "warmup": 8717,
}


def metrics_port_env(name: str) -> str:
    return f"CACHEMESH_{name.upper()}_METRICS_PORT"


def metrics_port_for(
    name: str,
    env: dict[str, str],
    is_free: Callable[[int], bool] = port_is_free,
    pick_free: Callable[[], int] = free_port,
) -> tuple[int, str]:
    """The metrics port a service gets, and where it came from: `env` (the variable; 0 there picks a
    free one), `default` (METRICS_PORTS), or `fallback` (the default was taken, or there is none)."""
    configured = env.get(metrics_port_env(name), "").strip()
    if configured:
        port = int(configured)
        return (port or pick_free()), "env"
    default = METRICS_PORTS.get(name)
    if default is not None and is_free(default):
        return default, "default"
    return pick_free(), "fallback"


def run_dir() -> Path:
    return cache_dir() / "run"


def state_path() -> Path:
    return run_dir() / "state.json"


def discover_services(services_dir: Path = SERVICES_DIR) -> list[str]:
    """Every `services/<name>/` with a `__main__.py` is a service the launcher runs, and so is a
    top-level package whose `__main__.py` runs the common lifecycle (`run_service`), as the faust
    worker in `streams/` does."""
    names = {
        p.parent.name
        for p in services_dir.glob("*/__main__.py")
        if p.parent.name not in NOT_SERVICES and not p.parent.name.startswith("_")
    }
    names.update(
        p.parent.name
        for p in services_dir.parent.glob("*/__main__.py")
        if p.parent != services_dir and "run_service(" in p.read_text()
    )
    return sorted(names)


def default_services(env: dict[str, str], services_dir: Path = SERVICES_DIR) -> list[str]:
    """The services `cachemesh up` runs when none are named: every one, less the unconfigured opt-ins."""

    def wanted(name: str) -> bool:
        needs = OPT_IN_SERVICES.get(name)
        return needs is None or any(env.get(var) for var in needs)

    return [name for name in discover_services(services_dir) if wanted(name)]


def module_for(name: str, services_dir: Path = SERVICES_DIR) -> str:
    return f"services.{name}" if (services_dir / name / "__main__.py").exists() else name


@dataclass
class ServiceProcess:
    """A service as a child process, restarted with backoff when it dies."""

    name: str
    env: dict[str, str]
    log_path: Path
    metrics_port: int
    metrics_port_source: str = "default"
    proc: ServerProcess | None = None
    restarts: int = 0
    started_at: float = 0.0
    healthy: bool = False  # up: healthy or degraded
    state: str = "starting"  # from its /healthz: healthy, degraded or unhealthy
    detail: str = "starting"
    endpoints: dict[str, str] = field(default_factory=dict)  # from its /healthz
    _next_start: float = 0.0

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/healthz"

    def start(self) -> None:
        self.proc = ServerProcess(
            [sys.executable, "-m", module_for(self.name)],
            log_path=self.log_path,
            env=self.env,
            cwd=REPO_ROOT,
            line_filter=json_lines_for(self.name),
        )
        self.started_at = time.monotonic()
        self.detail = f"pid {self.proc.pid}"

    def supervise(self) -> None:
        """Restarts a dead process, waiting longer after each crash (1 s, 2 s, ... 30 s)."""
        if self.proc is None or self.proc.is_alive():
            return
        now = time.monotonic()
        if self._next_start == 0.0:
            code = self.proc.returncode
            self.healthy = False
            self.detail = f"exited ({code}); restarting; log {self.log_path}"
            log.warning("service exited", extra={"service": self.name, "code": code})
            self._next_start = now + min(30.0, 2.0**self.restarts)
        elif now >= self._next_start:
            self._next_start = 0.0
            self.restarts += 1
            self.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is not None:
            self.proc.stop(timeout_s)


@dataclass
class Mesh:
    broker: Broker
    postgres: Postgres
    service_names: list[str]
    namespace: str = ""
    services: list[ServiceProcess] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    # What a person starting the mesh should read once it is up (a metrics port that moved).
    notices: list[str] = field(default_factory=list)
    vllm: int = 0  # local vLLM instances to serve behind the gateway
    engines: list[Any] = field(default_factory=list)  # their VllmServer, once up() made them
    engine_error: str | None = None
    standin: ServerProcess | None = None  # the gateway's stand-in model server, when it has no other
    standin_url: str = ""

    async def up(self, on_progress: Callable[[str], None] = lambda _: None) -> None:
        began = time.monotonic()
        on_progress("starting broker and Postgres")
        await asyncio.gather(asyncio.to_thread(self.broker.start), asyncio.to_thread(self.postgres.start))
        self.timings["broker_start_s"] = self.broker.start_seconds
        self.timings["postgres_start_s"] = self.postgres.start_seconds
        on_progress("creating topics")
        await ensure_topics(self.broker.bootstrap, self.namespace)
        on_progress("applying migrations")
        settings = PostgresSettings(database_url=SecretStr(self.postgres.dsn))
        db = Database(settings)
        await db.start()
        try:
            await apply_migrations(db, settings.cachemesh_embedding_dim)
        finally:
            await db.stop()
        self.timings["infra_ready_s"] = time.monotonic() - began
        logs = run_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        wired: dict[str, str] = {}
        if self.vllm:
            from infra.engines import engines, wiring_for
            from services.tiers.settings import TiersSettings

            on_progress("preparing the vLLM instances (venv, model)")
            self.engines = engines(self.vllm, f"http://127.0.0.1:{TiersSettings().api_port}")
            wired = await asyncio.to_thread(wiring_for, self.engines)
            if "bridge" not in self.service_names:
                self.service_names.append("bridge")
        if "gateway" in self.service_names and not self.vllm and not upstream_configured(dict(os.environ)):
            port = free_port()
            self.standin = ServerProcess(
                [sys.executable, "-m", "infra.standin", "--port", str(port)],
                log_path=logs / "standin.log",
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                cwd=REPO_ROOT,
            )
            self.standin_url = f"http://127.0.0.1:{port}/v1"
            wired["CACHEMESH_GATEWAY_UPSTREAM_URL"] = self.standin_url
        for name in self.service_names:
            port, source = metrics_port_for(name, dict(os.environ))
            if source == "fallback":
                self.notices.append(
                    f"{name}: metrics port {METRICS_PORTS.get(name)} is taken, using {port} "
                    "(deploy/prometheus.yml finds it after `python -m deploy.targets`)"
                )
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
                "KAFKA_BOOTSTRAP": self.broker.bootstrap,
                "KAFKA_TOPIC_NAMESPACE": self.namespace,
                "DATABASE_URL": self.postgres.dsn,
                metrics_port_env(name): str(port),
                **wired,
            }
            service = ServiceProcess(name, env, logs / f"{name}.log", port, source)
            service.start()
            self.services.append(service)
        for engine in self.engines:  # threads of their own: a Ctrl-C meanwhile need not wait for them
            threading.Thread(target=self._start_engine, args=(engine,), daemon=True).start()
        self.write_state()

    def _start_engine(self, engine: Any) -> None:
        try:
            engine.start()
        except Exception as exc:  # shown in the status table: the mesh stays up without it
            self.engine_error = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            log.warning("a vLLM instance failed to start", extra={"error": str(exc)[-2000:]})

    async def poll_health(self, session: aiohttp.ClientSession) -> None:
        for service in self.services:
            service.supervise()
            if service.proc is None or not service.proc.is_alive():
                service.healthy = False
                continue
            service.state, service.detail, service.endpoints = await http_health(
                session, service.health_url, service.detail
            )
            service.healthy = service.state != "unhealthy"  # degraded is up: it serves what it can

    def all_healthy(self) -> bool:
        infra = self.broker.is_alive() and self.postgres.is_alive()
        return (
            infra
            and all(s.healthy for s in self.services)
            and all(self._engine_ready(e) for e in self.engines)
        )

    def _engine_ready(self, engine: Any) -> bool:
        return engine.is_alive() and engine.start_seconds > 0

    def addresses(self) -> list[tuple[str, str]]:
        from infra.engines import engine_id

        engines = [
            (engine_id(i), {f"{engine_id(i)}, vLLM (OpenAI base_url)": f"{e.url}/v1"})
            for i, e in enumerate(self.engines)
        ]
        if self.standin is not None:
            engines.append(("stand-in", {"stand-in model server (OpenAI base_url)": self.standin_url}))
        return addresses([(s.name, s.endpoints) for s in self.services] + engines)

    def rows(self) -> list[tuple[str, str, str]]:
        rows = [
            ("broker", _state(self.broker.is_alive()), f"{self.broker.name} at {self.broker.bootstrap}"),
            ("postgres", _state(self.postgres.is_alive()), redact_dsn(self.postgres.dsn)),
        ]
        for s in self.services:
            state = s.state if s.healthy else ("starting" if s.proc and s.proc.is_alive() else "down")
            extra = f" restarts={s.restarts}" if s.restarts else ""
            moved = "" if s.metrics_port_source == "default" else f" ({s.metrics_port_source})"
            rows.append((s.name, state, f"{s.detail} metrics :{s.metrics_port}{moved}{extra}"))
        for i, e in enumerate(self.engines):
            state = "healthy" if self._engine_ready(e) else "down" if self.engine_error else "starting"
            detail = self.engine_error or f"{e.model} at {e.url}/v1"
            rows.append((f"vllm-{i}", state, detail))
        if self.standin is not None:
            what = f"{STANDIN_MODEL}: canned answers (CACHEMESH_GATEWAY_UPSTREAM_URL names a real server)"
            rows.append(("stand-in", _state(self.standin.is_alive()), what))
        return rows

    def write_state(self) -> None:
        raw = self.postgres.dsn
        state = {
            "launcher_pid": os.getpid(),
            "started_at": time.time(),
            "broker": {"name": self.broker.name, "bootstrap": self.broker.bootstrap},
            # A DSN with a password is not written down; `status` then reads DATABASE_URL.
            "postgres": {"dsn": raw if redact_dsn(raw) == raw else None, "dsn_redacted": redact_dsn(raw)},
            "namespace": self.namespace,
            "services": [
                {
                    "name": s.name,
                    "health_url": s.health_url,
                    "log": str(s.log_path),
                    "metrics_port": s.metrics_port,
                    # default (deploy/prometheus.yml names it), env or fallback (deploy.targets does)
                    "metrics_port_source": s.metrics_port_source,
                }
                for s in self.services
            ],
            # `cachemesh status` asks each vLLM instance's /health itself
            "engines": [
                {"name": f"vllm-{i}", "url": e.url, "model": e.model} for i, e in enumerate(self.engines)
            ]
            + (
                [{"name": "stand-in", "url": self.standin_url.removesuffix("/v1"), "model": STANDIN_MODEL}]
                if self.standin is not None
                else []
            ),
        }
        path = state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)

    def down(self) -> None:
        """vLLM instances and services first (they flush and commit), then Postgres, then the broker.
        Idempotent."""
        for engine in self.engines:
            if not self._engine_ready(engine) and engine.pid is not None:
                with contextlib.suppress(ProcessLookupError):  # still starting: its start then gives up
                    os.kill(engine.pid, signal.SIGTERM)
            engine.stop()
        for service in reversed(self.services):
            service.stop()
        if self.standin is not None:
            self.standin.stop(5.0)
        self.postgres.stop()
        self.broker.stop()
        with contextlib.suppress(FileNotFoundError):
            state_path().unlink()


STANDIN_MODEL = "stub-model"  # infra/standin.py's


def upstream_configured(env: dict[str, str], default_port: int = 8000) -> bool:
    """Whether the gateway has a model server to talk to: one named in its settings, or one listening
    on its default upstream's port (`vllm serve --port 8000`). Otherwise `cachemesh up` starts the
    stand-in for it."""
    named = env.get("CACHEMESH_GATEWAY_UPSTREAM_URL") or env.get("CACHEMESH_GATEWAY_UPSTREAMS")
    return bool(named) or not port_is_free(default_port)


def _state(alive: bool) -> str:
    return "healthy" if alive else "down"


class Health(NamedTuple):
    state: str  # healthy, degraded or unhealthy
    detail: str
    endpoints: dict[str, str]  # what a person opens (API, docs, dashboard, metrics) -> URL


async def http_health(session: aiohttp.ClientSession, url: str, fallback: str) -> Health:
    """A service's /healthz read: `healthy`; `degraded` (up, but a client does not get everything: the
    detail names why); `unhealthy` (with `fallback` as the detail when it does not answer at all);
    with the endpoints it lists."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
            body: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return Health("unhealthy", fallback, {})
    listed = body.get("endpoints") if isinstance(body, dict) else None
    endpoints = {str(k): str(v) for k, v in listed.items()} if isinstance(listed, dict) else {}
    if response.status != 200 or not body.get("healthy"):
        return Health("unhealthy", f"unhealthy: {json.dumps(body)[:120]}", endpoints)
    reasons = body.get("degraded") or []
    if body.get("status") == "degraded" and isinstance(reasons, list):
        return Health("degraded", "; ".join(str(r) for r in reasons)[:240], endpoints)
    return Health("healthy", "ok", endpoints)


def addresses(endpoints_by_service: list[tuple[str, dict[str, str]]]) -> list[tuple[str, str]]:
    """(what, URL) a person opens, the services' own first (API, docs, gateway, dashboard), then every
    metrics page."""
    first = [
        (name, url) for _, found in endpoints_by_service for name, url in found.items() if name != "metrics"
    ]
    metrics = [
        (f"{svc} metrics", found["metrics"]) for svc, found in endpoints_by_service if "metrics" in found
    ]
    return first + metrics


def existing_launcher() -> int | None:
    """The pid of a launcher that is still running, from the state file."""
    try:
        pid = int(json.loads(state_path().read_text())["launcher_pid"])
    except (OSError, ValueError, KeyError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def mesh_from_env(broker: str | None, services: list[str] | None, vllm: int = 0) -> Mesh:
    env = dict(os.environ)
    if broker:
        env["CACHEMESH_BROKER"] = broker
    return Mesh(
        broker=broker_from_env(env),
        postgres=postgres_from_env(env, durable=True),
        service_names=default_services(env) if services is None else services,
        namespace=env.get("KAFKA_TOPIC_NAMESPACE", ""),
        vllm=vllm,
    )
