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


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether `port` can be bound on `host` now, as the services' servers bind (SO_REUSEADDR, so a
    port left in TIME_WAIT by the previous run counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


SHARED_DATA_ENV = "CACHEMESH_SHARED_DATA"
_REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The public traces and paraphrase pairs (read in place, never copied in): `$CACHEMESH_SHARED_DATA`,
    else `../shared/data` beside the checkout, else `/work/shared/data` (where a clone made elsewhere,
    such as CI's temporary one, still finds it on these machines)."""
    configured = env.get(SHARED_DATA_ENV)
    candidates = [Path(configured)] if configured else []
    candidates += [_REPO_ROOT.parent / "shared" / "data", Path("/work/shared/data")]
    for candidate in candidates:
        if (candidate / "traces").is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"shared evaluation data not found (tried {tried}); set {SHARED_DATA_ENV}")
