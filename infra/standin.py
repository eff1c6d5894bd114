"""A stand-in OpenAI-compatible model server: the gateway's upstream when `cachemesh up` has no model
server to put behind it, and in the gateway's tests and bench/gateway.py. Deterministic answers, every
call counted, and it can be told to fail (any status), to be slow, or to break a stream off.
In-process (`serving_upstream()`) or as its own process (`python -m infra.standin --port N`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Generator
from dataclasses import dataclass, field
from typing import Any

import typer
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "stub-model"


@dataclass
class UpstreamDouble:
    calls: Counter[str] = field(default_factory=Counter)
    fail_status: int | None = None  # answer every completion with this status
    delay_s: float = 0.0  # before answering (streams: before the first chunk)
    chunk_delay_s: float = 0.0
    break_stream: bool = False  # stop a stream half-way, without [DONE]
    url: str = ""
    server: uvicorn.Server | None = None

    @property
    def completions(self) -> int:
        return self.calls["chat"] + self.calls["completion"]


def answer_for(prompt: str) -> str:
    return f"Answer to: {prompt.strip()} (from {MODEL})"


def _usage(prompt: str, text: str) -> dict[str, int]:
    p, c = len(prompt.split()), len(text.split())
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def create_upstream(double: UpstreamDouble) -> FastAPI:
    app = FastAPI(title="OpenAI-compatible upstream double")

    async def complete(route: str, request: Request) -> Response:
        double.calls[route] += 1
        body = await request.json()
        if double.delay_s:
            await asyncio.sleep(double.delay_s)
        if double.fail_status is not None:
            error = {"message": f"upstream failure {double.fail_status}", "type": "server_error"}
            return JSONResponse({"error": error}, status_code=double.fail_status)
        if route == "chat":
            prompt = str(body["messages"][-1].get("content") or "")
        else:
            prompt = str(body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0])
        text = answer_for(prompt)
        rid, created, model = f"up-{double.completions}", int(time.time()), body.get("model", MODEL)
        usage = _usage(prompt, text)
        if not body.get("stream"):
            if route == "chat":
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "finish_reason": "stop"}
                obj = "text_completion"
            return JSONResponse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _stream(double, route, text, rid, created, model, usage if include_usage else None),
            media_type="text/event-stream",
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await complete("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete("completion", request)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        double.calls["models"] += 1
        return {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "stub"}],
        }

    return app


async def _stream(
    double: UpstreamDouble,
    route: str,
    text: str,
    rid: str,
    created: int,
    model: str,
    usage: dict[str, int] | None,
) -> AsyncIterator[bytes]:
    chat = route == "chat"
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created}
    head["model"] = model

    def event(choice: dict[str, Any], **extra: Any) -> bytes:
        return f"data: {json.dumps({**head, 'choices': [choice], **extra})}\n\n".encode()

    if chat:
        yield event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    words = text.split(" ")
    for i, word in enumerate(words):
        if double.chunk_delay_s:
            await asyncio.sleep(double.chunk_delay_s)
        if double.break_stream and i == len(words) // 2:
            raise RuntimeError("stream broken off on purpose")
        piece = word if i == len(words) - 1 else word + " "
        yield event({"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece})
    done = (
        {"index": 0, "delta": {}, "finish_reason": "stop"}
        if chat
        else {"index": 0, "text": "", "finish_reason": "stop"}
    )
    yield event(done)
    if usage is not None:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n".encode()
    yield b"data: [DONE]\n\n"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serving_upstream(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[UpstreamDouble]:
    """The double on `host:port` (0: a free port) in this event loop; `.url` is its OpenAI base URL."""
    double = UpstreamDouble()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    config = uvicorn.Config(
        create_upstream(double),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    config.load()
    server = _Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    double.url, double.server = f"http://{host}:{sock.getsockname()[1]}/v1", server
    try:
        yield double
    finally:
        server.should_exit = True
        server.force_exit = True
        await server.shutdown(sockets=[sock])


def main(
    port: int = typer.Option(8000, help="Port to listen on"),
    delay_ms: float = typer.Option(0.0, help="Latency added to every answer"),
) -> None:
    """Serve the double until interrupted (bench/gateway.py starts it as its own process)."""
    double = UpstreamDouble(delay_s=delay_ms / 1000)
    uvicorn.run(create_upstream(double), host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    typer.run(main)
