"""The lookups answered at the HTTP wire: uvicorn's httptools protocol, with POST /v1/lookup and
/v1/lookup/batch taken out of its ASGI request cycle, which costs more server CPU per request than an
exact L1 lookup does (docs/benchmarks.md).

A plain lookup (HTTP/1.1 keep-alive, one of the two paths with no query, a Content-Length within the
body limit, no Expect or Transfer-Encoding, the right bearer token where one is required, nothing else
in flight on the connection) goes straight to `LookupAnswers` and its response straight to the
transport: within the read that brought it when this node's memory settles it, else from a task once
the peers or L3 have answered. Anything else (an error to answer, a pipelined request behind another)
goes through uvicorn and the ASGI app as before, with the same answer. Responses stay in order: a
request behind a fast one waits in uvicorn's own pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from services.tiers.edge.asgi import LookupAnswers, bearer_matches

_FAST = {path.encode(): path for path in LookupAnswers.PATHS}  # the raw URL a plain request names
_HEAD_JSON = b"content-type: application/json\r\ncontent-length: "


class _Event:
    def set(self) -> None:  # uvicorn sets its cycle's event on disconnect; nothing waits on this one
        pass


class FastCycle:
    """What uvicorn's protocol sees as the request in flight (`response_complete`, `keep_alive`,
    `disconnected`, `message_event` are the attributes it reads), while the lookup is answered."""

    __slots__ = ("body", "disconnected", "keep_alive", "path", "response_complete", "started_ns")
    message_event = _Event()

    def __init__(self, path: str, started_ns: int) -> None:
        self.path = path
        self.started_ns = started_ns
        self.body = bytearray()
        self.response_complete = False
        self.keep_alive = True
        self.disconnected = False


class LookupWireProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the plain lookups answered below the ASGI cycle."""

    answers: LookupAnswers | None = None  # set per server by `protocol_for`
    answered = 0  # lookups answered here, per server (its class): tests and benches read it

    def on_headers_complete(self) -> None:
        answers = self.answers
        path = _FAST.get(self.url)
        if answers is None or path is None or not self._plain(answers):
            super().on_headers_complete()
            return
        self.cycle = FastCycle(path, time.perf_counter_ns())  # type: ignore[assignment]

    def _plain(self, answers: LookupAnswers) -> bool:
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
            or parser.should_upgrade()
            or self.expect_100_continue
            or self.limit_concurrency is not None
            or self.root_path
            or self.pipeline
            or not (self.cycle is None or self.cycle.response_complete)
        ):
            return False
        length = None
        auth = b""
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding" or name == b"expect":
                return False
            elif name == b"authorization":
                auth = value
        if length is None or not length.isdigit() or int(length) > answers.max_bytes:
            return False
        return answers.bearer is None or bearer_matches(auth, answers.bearer)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if isinstance(cycle, FastCycle):
            cycle.body += body  # bounded: its Content-Length was checked against the limit
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if not isinstance(cycle, FastCycle):
            super().on_message_complete()
            return
        assert self.answers is not None
        got = self.answers.answer_now(cycle.path, bytes(cycle.body))
        if isinstance(got, tuple):  # settled in memory (or refused): answered here, no task, no wait
            self._respond(cycle, *got)
            return
        task = self.loop.create_task(self._answer(cycle, got))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _answer(self, cycle: FastCycle, pending: Awaitable[tuple[int, bytes]]) -> None:
        self._respond(cycle, *await pending)

    def _respond(self, cycle: FastCycle, status: int, raw: bytes) -> None:
        assert self.answers is not None
        cycle.response_complete = True
        if cycle.disconnected or self.transport.is_closing():
            return
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:  # the Date header, as uvicorn sends it
            head += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:  # the server is shutting down (`shutdown` cleared it)
            head.append(b"connection: close\r\n")
        head += [_HEAD_JSON, b"%d\r\n\r\n" % len(raw), raw]
        self.transport.write(b"".join(head))
        self.answers.observe(cycle.path, cycle.started_ns)
        type(self).answered += 1
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()


def protocol_for(answers: LookupAnswers) -> type[LookupWireProtocol]:
    """The protocol class for one server (uvicorn takes a class; the answers ride on it)."""
    return type("LookupWire", (LookupWireProtocol,), {"answers": answers})


def wire_options(app: Any) -> dict[str, Any]:
    """uvicorn options for `app`: the wire fast path where the app has lookup answers, else httptools."""
    answers = getattr(app, "lookup_answers", None)
    return {"http": "httptools" if answers is None else protocol_for(answers)}
