"""An ASGI app served by uvicorn inside a service's own event loop (the tier node's and the gateway's
APIs): one listening socket with Nagle off, no access log, no lifespan; signals stay with
`run_service`. `serve_in_loop` starts it, `InLoopServer.stop` shuts it down, `tick` keeps it fresh."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn
from starlette.types import ASGIApp


class InLoopServer(uvicorn.Server):
    """uvicorn without its own signal handling, on a socket bound before it starts."""

    port: int = 0
    _sockets: list[socket.socket]

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def tick(self) -> None:
        """Runs uvicorn's housekeeping (its cached Date header) until shutdown: a service loop."""
        await self.main_loop()

    async def stop(self) -> None:
        self.should_exit = True
        await self.shutdown(sockets=self._sockets)


async def serve_in_loop(app: ASGIApp, host: str, port: int, what: str, **options: Any) -> InLoopServer:
    """Listens on host:port (0: any free port, read back as `.port`) and serves `app`; `options` go
    to `uvicorn.Config` (e.g. `http="httptools"`). Raises OSError naming `what` if it cannot bind."""
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto says
    # TCP, and accepted sockets inherit it; with proto 0 every response waits ~40 ms for a delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"{what} cannot listen on {host}:{port}: {exc}") from exc
    defaults: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "off",
        "timeout_graceful_shutdown": 2,
        "server_header": False,
    }
    config = uvicorn.Config(app, **{**defaults, **options})
    config.load()
    server = InLoopServer(config)
    server.lifespan = config.lifespan_class(config)
    server.port, server._sockets = int(sock.getsockname()[1]), [sock]
    await server.startup(sockets=[sock])
    return server
