"""SSE: the parser, text cut into pieces, a stream assembled into the whole answer, and a cached answer
streamed back in chunks that assemble into the same answer."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.answers import as_served, decode_answer, encode_answer
from services.gateway.sse import DONE, SseParser, assemble, frame, replay, split_text


def test_parser_across_chunk_boundaries() -> None:
    parser = SseParser()
    stream = b'data: {"a":1}\n\n: comment\n\ndata: line1\ndata: line2\r\n\r\ndata: [DONE]\n\n'
    out: list[str] = []
    for i in range(0, len(stream), 3):
        out += parser.feed(stream[i : i + 3])
    assert out == ['{"a":1}', "line1\nline2", DONE]


def test_parser_overflow_stops_parsing() -> None:
    parser = SseParser(max_event_bytes=10)
    assert parser.feed(b"data: " + b"x" * 20) == []
    assert parser.overflowed


@given(st.text(), st.integers(min_value=1, max_value=40))
def test_split_text_joins_back(text: str, size: int) -> None:
    pieces = split_text(text, size)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= size for p in pieces)


def test_split_text_cuts_after_spaces() -> None:
    assert split_text("one two three four", 8) == ["one two ", "three ", "four"]


def _events(frames: list[bytes]) -> list[str]:
    parser = SseParser()
    return [e for f in frames for e in parser.feed(f)]


CHAT: dict[str, Any] = {
    "id": "up-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Click 'Forgot password' on the sign-in page."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10},
}


def test_replay_chat_in_chunks_then_done() -> None:
    frames = list(replay(CHAT, response_id="r", created=5, chunk_chars=8, include_usage=True))
    events = _events(frames)
    assert events[-1] == DONE
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(
        c["id"] == "r" and c["object"] == "chat.completion.chunk" and c["created"] == 5 for c in chunks
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len(pieces) > 3 and all(len(p) <= 8 for p in pieces)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"] == CHAT["usage"] and chunks[-1]["choices"] == []
    again = assemble(chunks)
    assert again is not None
    assert again["choices"] == CHAT["choices"] and again["usage"] == CHAT["usage"]


def test_replay_without_usage() -> None:
    chunks = [json.loads(e) for e in _events(list(replay(CHAT, response_id="r", created=5)))[:-1]]
    assert all("usage" not in c for c in chunks)


def test_replay_completion_roundtrip() -> None:
    answer = {
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": "Hello there, world", "finish_reason": "length"}],
    }
    chunks = [
        json.loads(e) for e in _events(list(replay(answer, response_id="c", created=1, chunk_chars=5)))[:-1]
    ]
    assert all(c["object"] == "text_completion" for c in chunks)
    again = assemble(chunks)
    assert again is not None and again["choices"] == answer["choices"]


def test_assemble_tool_calls_and_several_choices() -> None:
    base = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "get", "arguments": '{"a"'},
                            }
                        ],
                    },
                }
            ],
        },
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}}
            ],
        },
        {**base, "choices": [{"index": 1, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    answer = assemble(chunks)
    assert answer is not None
    first, second = answer["choices"]
    assert first["message"]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}
    ]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert second["message"]["content"] == "hi"
    assert assemble([]) is None


def test_frame() -> None:
    assert frame(DONE) == b"data: [DONE]\n\n"
    assert frame({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()


def test_stored_answer_roundtrip() -> None:
    stored = decode_answer(encode_answer(CHAT))
    assert stored is not None and "id" not in stored and "created" not in stored
    served = as_served(stored, rid="new", created=9)
    assert served["id"] == "new" and served["created"] == 9 and served["choices"] == CHAT["choices"]
    for bad in (
        None,
        "",
        "not json",
        '{"format": "other"}',
        '{"format": "cachemesh.gateway.answer.v1"}',
        "plain answer",
    ):
        assert decode_answer(bad) is None
