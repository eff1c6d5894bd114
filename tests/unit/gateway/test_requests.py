"""Request normalisation: what makes two requests one exact key, what keeps paraphrase matching within
one context, and which inputs are refused."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.requests import (
    BadRequest,
    check_tenant,
    normalise_chat,
    normalise_completion,
    parse_body,
)


def chat(content: str = "How do I reset my password?", **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **kw}


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (chat(), chat(stream=True)),
        (chat(), chat(user="alice", metadata={"x": "1"}, stream_options={"include_usage": True})),
        (chat(temperature=0), chat(temperature=0.0)),
        (chat(), chat(n=1)),
        (chat("  How do I reset my password?\n"), chat()),
        (
            chat(),
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": chat()["messages"][0]["content"]}]}
                ],
            },
        ),
        (chat(max_tokens=5, top_p=1), chat(top_p=1.0, max_tokens=5)),
        (chat(), chat(seed=None)),
    ],
)
def test_same_request_same_key(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert normalise_chat(a).key == normalise_chat(b).key


@pytest.mark.parametrize(
    "b",
    [
        chat("How do I not reset my password?"),
        chat(temperature=0.7),
        chat(temperature=0),  # unset is the engine's default (1.0), not 0
        chat(max_tokens=10),
        {**chat(), "model": "other"},
        {"model": "m", "messages": [{"role": "system", "content": "be terse"}, *chat()["messages"]]},
    ],
)
def test_different_request_different_key(b: dict[str, Any]) -> None:
    assert normalise_chat(chat()).key != normalise_chat(b).key


def test_tenant_changes_key_and_namespace() -> None:
    a, b = normalise_chat(chat()), normalise_chat(chat(), tenant="acme")
    assert a.key != b.key and a.namespace != b.namespace
    assert b.namespace.startswith("m@acme#")


def test_paraphrase_shares_the_context_but_not_the_key() -> None:
    a, b = normalise_chat(chat()), normalise_chat(chat("How can I reset my password?"))
    assert a.key != b.key
    assert a.namespace == b.namespace
    assert b.prompt == "How can I reset my password?"


def test_context_includes_earlier_turns_and_params() -> None:
    base = normalise_chat(chat())
    system = normalise_chat(
        {"model": "m", "messages": [{"role": "system", "content": "pirate"}, *chat()["messages"]]}
    )
    assert system.context != base.context
    assert normalise_chat(chat(max_tokens=3)).context != base.context


def test_prompt_is_the_last_user_message_only() -> None:
    assistant_last = {
        "model": "m",
        "messages": [*chat()["messages"], {"role": "assistant", "content": "Sure"}],
    }
    assert normalise_chat(assistant_last).prompt is None
    image = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
    }
    assert normalise_chat(image).prompt is None


def test_flags() -> None:
    req = normalise_chat(
        chat(stream=True, stream_options={"include_usage": True}, temperature=0.5, seed=3, n=2)
    )
    assert (req.stream, req.include_usage, req.temperature, req.seed, req.n) == (True, True, 0.5, 3, 2)
    assert normalise_chat(chat(tools=[{"type": "function"}])).uses_tools
    tool_msg = {
        "model": "m",
        "messages": [*chat()["messages"], {"role": "tool", "content": "42", "tool_call_id": "1"}],
    }
    assert normalise_chat(tool_msg).uses_tools
    assert normalise_chat(chat(logprobs=True)).logprobs


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ([], 400, "JSON object"),
        ({"messages": chat()["messages"]}, 400, "model"),
        ({"model": "", "messages": chat()["messages"]}, 400, "model"),
        ({"model": "m" * 201, "messages": chat()["messages"]}, 400, "limit"),
        ({"model": "m"}, 400, "messages"),
        ({"model": "m", "messages": []}, 400, "messages"),
        ({"model": "m", "messages": ["hi"]}, 400, r"messages\[0\] is not"),
        ({"model": "m", "messages": [{"content": "hi"}]}, 400, "role"),
        (chat(stream="yes"), 400, "stream"),
        (chat(n=0), 400, "n must"),
        (chat(temperature="hot"), 400, "temperature"),
        (chat(seed=1.5), 400, "seed"),
        (chat(stream_options=3), 400, "stream_options must be an object"),
        (chat(stream_options={"include_usage": "yes"}), 400, "include_usage"),
        (chat(max_tokens="ten"), 400, "max_tokens must be an integer"),
        (chat(max_tokens=True), 400, "max_tokens must be an integer"),
        (chat(stop=[1, 2]), 400, "stop must be a string or a list of strings"),
        (chat(user=7), 400, "user must be a string"),
        ({"model": "m", "messages": [{"role": "user", "content": 123}]}, 400, r"messages\[0\]\.content"),
        ({"model": "m", "messages": chat()["messages"] * 5}, 413, "limit is 4"),
    ],
)
def test_bad_chat_input(body: Any, status: int, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment) as caught:
        normalise_chat(body, max_messages=4)
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"model": "m", "temperature": Infinity}', "Infinity is not a JSON number"),
        (b'{"model": "m", "temperature": NaN}', "NaN is not a JSON number"),
        (b"[" * 1000 + b"]" * 1000, "nests deeper than 64"),
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64"),
        (b'{"a": ' * 70 + b"1" + b"}" * 70, "nests deeper than 64"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_bodies_that_are_not_plain_json_are_refused(raw: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment) as caught:
        parse_body(raw)
    assert caught.value.status == 400


def test_plain_json_within_the_depth_passes() -> None:
    assert parse_body(b'{"a": [[{"b": 1.5}]]}') == {"a": [[{"b": 1.5}]]}
    assert parse_body(b"[" * 64 + b"]" * 64) is not None


def test_completion() -> None:
    a = normalise_completion({"model": "m", "prompt": "Say hi"})
    assert a.route == "completion" and a.prompt == "Say hi"
    assert normalise_completion({"model": "m", "prompt": ["Say hi"]}).key == a.key
    assert normalise_completion({"model": "m", "prompt": "Say hi", "echo": True}).key != a.key
    assert normalise_completion({"model": "m", "prompt": ["a", "b"]}).several_prompts
    tokens = normalise_completion({"model": "m", "prompt": [1, 2, 3]})
    assert tokens.prompt is None and not tokens.several_prompts
    assert a.key != normalise_chat(chat("Say hi")).key
    for bad in ({"model": "m"}, {"model": "m", "prompt": "  "}, {"model": "m", "prompt": []}):
        with pytest.raises(BadRequest):
            normalise_completion(bad)


def test_tenant_header() -> None:
    assert check_tenant(None) is None and check_tenant("") is None
    assert check_tenant("acme-1.eu") == "acme-1.eu"
    for bad in ("a b", "x" * 65, "a/b"):
        with pytest.raises(BadRequest):
            check_tenant(bad)
