"""Server-sent events the OpenAI way (pure): a parser for the upstream's stream, the assembly of its
chunks into the whole answer that is stored, and a cached answer cut back into chunks for a caller that
asked for `stream: true`. Each event is `data: <json>` and a blank line; the stream ends `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

DONE = "[DONE]"


class SseParser:
    """Bytes in, the `data` of each complete event out (multi-line data joined by newlines)."""

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        self._buffer = b""
        self._max = max_event_bytes
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        events = []
        while (end := self._buffer.find(b"\n\n")) >= 0:
            raw, self._buffer = self._buffer[:end], self._buffer[end + 2 :]
            data = [line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
            if data:
                events.append(b"\n".join(data).decode("utf-8", errors="replace"))
        if len(self._buffer) > self._max:  # one event without end: stop parsing, keep relaying
            self._buffer = b""
            self.overflowed = True
        return events


def frame(data: Mapping[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def split_text(text: str, size: int) -> list[str]:
    """Pieces of about `size` characters, cut after whitespace where there is some; they join back to
    `text` exactly."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            if cut > start:
                end = cut + 1
        pieces.append(text[start:end])
        start = end
    return pieces


# --- upstream chunks -> the whole answer ----------------------------------------------------------


def _merge_tool_calls(into: list[dict[str, Any]], deltas: list[Any]) -> None:
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = delta.get("index", len(into))
        while len(into) <= index:
            into.append({"type": "function", "function": {"name": "", "arguments": ""}})
        call = into[index]
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        fn = delta.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""


def assemble(chunks: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The non-streamed answer the chunks of a `chat.completion.chunk` or streamed `text_completion`
    add up to; None when there are none."""
    if not chunks:
        return None
    first = chunks[0]
    chat = first.get("object") == "chat.completion.chunk"
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            choice = choices.setdefault(int(c.get("index", 0)), {"text": "", "finish_reason": None})
            if chat:
                delta = c.get("delta") or {}
                choice.setdefault("role", delta.get("role") or "assistant")
                choice["text"] += delta.get("content") or ""
                if delta.get("tool_calls"):
                    _merge_tool_calls(choice.setdefault("tool_calls", []), delta["tool_calls"])
            else:
                choice["text"] += c.get("text") or ""
            if c.get("finish_reason") is not None:
                choice["finish_reason"] = c["finish_reason"]
    out: dict[str, Any] = {
        "id": first.get("id"),
        "object": "chat.completion" if chat else "text_completion",
        "created": first.get("created"),
        "model": first.get("model"),
        "choices": [],
    }
    if first.get("system_fingerprint") is not None:
        out["system_fingerprint"] = first["system_fingerprint"]
    for index in sorted(choices):
        c = choices[index]
        if chat:
            message: dict[str, Any] = {"role": c["role"], "content": c["text"] or None}
            if c.get("tool_calls"):
                message["tool_calls"] = c["tool_calls"]
            out["choices"].append({"index": index, "message": message, "finish_reason": c["finish_reason"]})
        else:
            out["choices"].append({"index": index, "text": c["text"], "finish_reason": c["finish_reason"]})
    if usage is not None:
        out["usage"] = usage
    return out


# --- a cached answer -> chunks --------------------------------------------------------------------


def replay(
    answer: Mapping[str, Any],
    *,
    response_id: str,
    created: int,
    chunk_chars: int = 16,
    include_usage: bool = False,
) -> Iterator[bytes]:
    """The SSE frames of a stored (non-streamed) answer, as the upstream would have streamed it: the
    role first, the text in pieces, the finish reason, the usage when asked, then [DONE]."""
    chat = answer.get("object") == "chat.completion"
    head: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": answer.get("model"),
    }
    if answer.get("system_fingerprint") is not None:
        head["system_fingerprint"] = answer["system_fingerprint"]

    def chunk(index: int, body: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": index, **body, "finish_reason": finish}
        if chat:
            choice.setdefault("logprobs", None)
        return frame({**head, "choices": [choice]})

    for choice in answer.get("choices") or ():
        index = int(choice.get("index", 0))
        if chat:
            message = choice.get("message") or {}
            yield chunk(index, {"delta": {"role": message.get("role", "assistant"), "content": ""}})
            for piece in split_text(message.get("content") or "", chunk_chars):
                yield chunk(index, {"delta": {"content": piece}})
            if message.get("tool_calls"):
                calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
                yield chunk(index, {"delta": {"tool_calls": calls}})
            yield chunk(index, {"delta": {}}, choice.get("finish_reason"))
        else:
            for piece in split_text(choice.get("text") or "", chunk_chars):
                yield chunk(index, {"text": piece})
            yield chunk(index, {"text": ""}, choice.get("finish_reason"))
    if include_usage and answer.get("usage") is not None:
        yield frame({**head, "choices": [], "usage": answer["usage"]})
    yield frame(DONE)
