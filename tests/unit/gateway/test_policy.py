"""What is cached: the sampling policies, tools, n, logprobs, the opt-out headers, storable answers."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.policy import CachePolicy, Directives, Plan
from services.gateway.requests import normalise_chat, normalise_completion


def req(**kw: Any):  # type: ignore[no-untyped-def]
    return normalise_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


@pytest.mark.parametrize(
    ("sampling", "params", "reason"),
    [
        ("unset_or_zero", {}, None),
        ("unset_or_zero", {"temperature": 0}, None),
        ("unset_or_zero", {"temperature": 0.7}, "temperature>0"),
        ("unset_or_zero", {"temperature": 0.7, "seed": 1}, None),
        ("deterministic", {}, "temperature unset"),
        ("deterministic", {"temperature": 0}, None),
        ("deterministic", {"seed": 5}, None),
        ("deterministic", {"temperature": 1.0}, "temperature>0"),
        ("all", {"temperature": 1.5}, None),
        ("all", {"n": 3}, "n>1"),
        ("unset_or_zero", {"logprobs": True}, "logprobs"),
        ("unset_or_zero", {"tools": [{"type": "function"}]}, "tools"),
    ],
)
def test_sampling_policy(sampling: Any, params: dict[str, Any], reason: str | None) -> None:
    assert CachePolicy(sampling).not_cacheable(req(**params)) == reason


def test_tools_when_allowed() -> None:
    assert CachePolicy(cache_tools=True).not_cacheable(req(tools=[{"type": "function"}])) is None


def test_several_prompts_never_cached() -> None:
    several = normalise_completion({"model": "m", "prompt": ["a", "b"]})
    assert CachePolicy("all").not_cacheable(several) == "several prompts"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, Directives(True, True, None)),
        ({"x-cachemesh-bypass": "1"}, Directives(False, False, "x-cachemesh-bypass")),
        ({"x-cachemesh-bypass": "TRUE"}, Directives(False, False, "x-cachemesh-bypass")),
        ({"x-cachemesh-bypass": "0"}, Directives(True, True, None)),
        ({"cache-control": "no-cache"}, Directives(False, True, "cache-control")),
        ({"cache-control": "max-age=0, no-store"}, Directives(True, False, "cache-control")),
        ({"cache-control": "No-Cache, no-store"}, Directives(False, False, "cache-control")),
    ],
)
def test_directives(headers: dict[str, str], expected: Directives) -> None:
    assert Directives.from_headers(headers) == expected


def test_plan() -> None:
    policy = CachePolicy()
    assert policy.plan(req(), Directives()) == Plan(True, True)
    assert policy.plan(req(temperature=1), Directives()) == Plan(False, False, "temperature>0")
    assert policy.plan(req(), Directives(False, True, "cache-control")).label == "bypass"
    assert policy.plan(req(), Directives()).label == "miss"


def _answer(**choice: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "finish_reason": "stop", **choice}]}


@pytest.mark.parametrize(
    ("answer", "storable"),
    [
        (_answer(message={"role": "assistant", "content": "Paris"}), True),
        (_answer(message={"role": "assistant", "content": "Par"}, finish_reason="length"), True),
        (_answer(message={"role": "assistant", "content": "x"}, finish_reason="content_filter"), False),
        (_answer(message={"role": "assistant", "content": "x"}, finish_reason=None), False),
        (_answer(message={"role": "assistant", "content": ""}), False),
        (_answer(message={"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}), False),
        (_answer(text="Paris"), True),
        (_answer(text=""), False),
        ({"choices": []}, False),
        ({}, False),
    ],
)
def test_storable(answer: dict[str, Any], storable: bool) -> None:
    assert CachePolicy().storable(answer) is storable


def test_storable_tool_call_when_allowed() -> None:
    answer = _answer(message={"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]})
    assert CachePolicy(cache_tools=True).storable(answer)
