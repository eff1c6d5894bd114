"""A TCP proxy that can cut its clients off: a network partition between one process and a server,
for fault tests (bench/consistency.py's partition scenario, with the Kafka broker's SIDE listener).

`cut()` turns it into a black hole, as a partition is: connections stay open and whatever either side
sends is dropped, so a client waits out its own timeouts instead of hearing a refusal. `heal()` closes
what was open during the cut (its streams lost bytes) and forwards again. It runs on a thread of its
own, so a busy event loop in the caller does not slow the traffic it carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType
from typing import Self

from infra.paths import LOOPBACK

_CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, listen_port: int, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.listen_port = listen_port
        self.target = (host, int(port))
        self._cut = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.listen_port}"

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        """Forward again; the connections open during the cut are closed (the clients reconnect)."""
        asyncio.run_coroutine_threadsafe(self._drop_open(), self._loop).result(10)
        self._cut.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, self.listen_port, reuse_address=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._drop_open()
        serving = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in serving:  # the loop stops next: no connection's task is left pending
            task.cancel()
        await asyncio.gather(*serving, return_exceptions=True)

    async def _drop_open(self) -> None:
        writers, self._open = self._open, set()
        for writer in writers:
            writer.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._open.add(client_writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self._cut.is_set():  # nothing reaches the server: the client's bytes go nowhere
                while await client_reader.read(_CHUNK):
                    pass
                return
            server_reader, upstream = await asyncio.open_connection(*self.target)
            self._open.add(upstream)
            await asyncio.gather(
                self._pipe(client_reader, upstream), self._pipe(server_reader, client_writer)
            )
        except OSError:
            pass
        finally:
            for writer in (client_writer, upstream):
                if writer is not None:
                    self._open.discard(writer)
                    writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(_CHUNK):
                if self._cut.is_set():
                    continue  # dropped on the floor, as a partitioned network does
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()
