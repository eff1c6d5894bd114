"""The running mesh as `cachemesh up` wrote it down (`infra.launcher.state_path()`): where the broker
is, the topic namespace, every service's health URL. What `status`, `demo` and the trace generator read
instead of asking for addresses."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.launcher import existing_launcher, state_path


@dataclass(frozen=True)
class MeshState:
    bootstrap: str
    namespace: str
    health_urls: dict[str, str] = field(default_factory=dict)
    dsn: str | None = None

    def base_url(self, service: str) -> str | None:
        """`http://host:port` of a service's metrics server (its /healthz without the path)."""
        url = self.health_urls.get(service)
        return None if url is None else url.rsplit("/", 1)[0]


def read_state() -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_path().read_text())
    except (OSError, ValueError):
        return None
    return state


def running_mesh() -> MeshState | None:
    """The mesh a live launcher started; None when none is up (no state file, or its launcher died)."""
    state = read_state()
    if state is None or existing_launcher() is None:
        return None
    return MeshState(
        bootstrap=str(state["broker"]["bootstrap"]),
        namespace=str(state.get("namespace") or ""),
        health_urls={s["name"]: s["health_url"] for s in state.get("services") or []},
        dsn=(state.get("postgres") or {}).get("dsn"),
    )


NOT_UP = "cachemesh is not up: start it with `make run` (or `cachemesh up`) in another terminal."


def kafka_address(env: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """(bootstrap, topic namespace): `KAFKA_BOOTSTRAP` / `KAFKA_TOPIC_NAMESPACE` when set, else the
    running mesh's, else the conventional local broker."""
    mesh = None if env.get("KAFKA_BOOTSTRAP") else running_mesh()
    bootstrap = env.get("KAFKA_BOOTSTRAP") or (mesh.bootstrap if mesh else "127.0.0.1:9092")
    namespace = env.get("KAFKA_TOPIC_NAMESPACE")
    return bootstrap, namespace if namespace is not None else (mesh.namespace if mesh else "")
