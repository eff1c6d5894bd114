"""Where bring-up keeps its downloads, and how it picks loopback ports."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

CACHE_DIR_ENV = "CACHEMESH_CACHE_DIR"
LOOPBACK = "127.0.0.1"


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The download cache (Kafka jars): `$CACHEMESH_CACHE_DIR` or `~/.cache/cachemesh`; created on demand."""
    configured = env.get(CACHE_DIR_ENV)
    path = Path(configured).expanduser() if configured else Path.home() / ".cache" / "cachemesh"
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` right now.

    The port is released before it is returned, so another process can take it in between; callers bind it
    promptly, and the servers here bind with SO_REUSEADDR, so a restart on the same port is not blocked by
    TIME_WAIT.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
