"""A stored answer (pure): the upstream's whole, non-streamed response as the cache keeps it (the text
value of a `prompt` entry), and the response a hit gives back under a fresh id and time."""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from collections.abc import Mapping
from typing import Any

FORMAT = "cachemesh.gateway.answer.v1"
# What a stored answer keeps of the response: the id and time are the request's own, every time.
_KEPT = ("object", "model", "choices", "usage", "system_fingerprint")


def encode_answer(answer: Mapping[str, Any]) -> str:
    kept = {k: answer[k] for k in _KEPT if answer.get(k) is not None}
    return json.dumps({"format": FORMAT, "response": kept}, separators=(",", ":"), ensure_ascii=False)


def decode_answer(text: str | None) -> dict[str, Any] | None:
    """The stored response, or None when the value is not a gateway answer (written by something else,
    or by a later format): then it is a miss, never a wrong answer."""
    if not text:
        return None
    try:
        stored = json.loads(text)
    except ValueError:
        return None
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        return None
    response = stored.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
        return None
    return response


def response_id(route: str) -> str:
    prefix = "chatcmpl" if route == "chat" else "cmpl"
    return f"{prefix}-cm{secrets.token_hex(12)}"


def as_served(answer: Mapping[str, Any], *, rid: str, created: int) -> dict[str, Any]:
    return {"id": rid, **{k: v for k, v in answer.items() if k != "id"}, "created": created}


def error_body(
    message: str, *, kind: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An error in the OpenAI shape, so clients raise their usual exceptions with the message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def answer_text(answer: Mapping[str, Any]) -> str | None:
    """The first choice's text (a chat message's content or a completion's text), or None."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


_WORD = re.compile(r"\w+", re.UNICODE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def answers_agree(fresh: str, cached: str, min_f1: float = 0.8) -> bool:
    """Whether the model's fresh answer says what the cached one says: the same words after casefolding
    (punctuation and spacing aside), or a word overlap F1 of at least `min_f1` with the same numbers.
    A cheap check, strict on purpose: a disagreement only costs the entry an exploration label."""
    a, b = _WORD.findall(fresh.casefold()), _WORD.findall(cached.casefold())
    if a == b:
        return True
    if not a or not b or sorted(_NUMBER.findall(fresh)) != sorted(_NUMBER.findall(cached)):
        return False
    common = sum((Counter(a) & Counter(b)).values())
    precision, recall = common / len(a), common / len(b)
    return common > 0 and 2 * precision * recall / (precision + recall) >= min_f1
