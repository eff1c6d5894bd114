"""Where bring-up keeps its downloads, and how it picks loopback ports."""

from __future__ import annotations

import os
import random
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


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PICK = 10_000
_handed_out: set[int] = set()


def pick_range(ephemeral: tuple[int, int] | None) -> tuple[int, int] | None:
    """The ports to pick test and bring-up servers from: below the kernel's ephemeral range, where no
    outgoing connection is given a local port (one that is can make a later bind of that port fail, even
    with SO_REUSEADDR). None when that range leaves too little room below it."""
    if ephemeral is None or ephemeral[0] - _LOWEST_PICK < 1_000:
        return None
    return _LOWEST_PICK, ephemeral[0] - 1


def _ephemeral_range() -> tuple[int, int] | None:
    try:
        low, high = _EPHEMERAL_RANGE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` right now, and not one this process has handed out before.

    Picked at random below the ephemeral range where the kernel says what that is (a port taken from inside
    it can be given to some outgoing connection before the server binds it, or while a killed server is
    down). The port is released before it is returned; callers bind it promptly, and the servers here bind
    with SO_REUSEADDR, so a restart on the same port is not blocked by TIME_WAIT.
    """
    span = pick_range(_ephemeral_range())
    if span is not None:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randint(*span)
            if port not in _handed_out and _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
    _handed_out.add(picked)
    return picked


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
