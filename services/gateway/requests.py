"""What a request asks, normalised (pure): its exact cache key (model, messages or prompt and the
parameters that change the answer, hashed), the prompt text a paraphrase is matched on, and the context
fingerprint that keeps paraphrase matching among requests with the same system prompt, earlier turns and
parameters. Bad input raises `BadRequest` with the status and the reason."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

Route = Literal["chat", "completion"]

# Parameters that never change what the model answers: left out of the key.
IGNORED_PARAMS = frozenset(
    {"stream", "stream_options", "user", "metadata", "store", "service_tier", "request_id", "priority"}
)
_FLOAT_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
MAX_MODEL_CHARS = 200
MAX_DEPTH = 64  # JSON nesting a request may have (OpenAI's bodies need fewer than 10 levels)
TENANT = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")


class BadRequest(ValueError):
    """The request cannot be served as given: `status` (400, 413) and a reason for the caller."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def _no_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON number")


def parse_body(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON of a request body: standard JSON only (no NaN or Infinity), nested at most `max_depth`
    deep (a deeper body is refused before anything walks it recursively)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest(f"the body nests deeper than {max_depth} levels") from None
    except BadRequest:
        raise
    except ValueError:
        raise BadRequest("the body is not valid JSON") from None
    level, depth = [body], 0
    while level:
        depth += 1
        if depth > max_depth:
            raise BadRequest(f"the body nests deeper than {max_depth} levels")
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
    return body


@dataclass(frozen=True, slots=True)
class Normalised:
    route: Route
    model: str
    tenant: str | None
    stream: bool
    include_usage: bool
    key: str  # exact key of the whole request
    context: str  # fingerprint of everything but the prompt: the namespace of paraphrase matching
    prompt: str | None  # the last user message (chat) or the prompt (completion); None: exact only
    n: int
    temperature: float | None
    seed: int | None
    uses_tools: bool
    logprobs: bool
    several_prompts: bool

    @property
    def namespace(self) -> str:
        """The `model` the entry is stored and matched under: model, tenant and context, so that no
        paraphrase is served across tenants or conversations that differ before the question."""
        tenant = f"@{self.tenant}" if self.tenant else ""
        return f"{self.model}{tenant}#{self.context}"


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _text_of(content: Any) -> str | None:
    """A message's text: a string, or a list of parts that are all text; None for images and the like."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) == len(content) and all(p.get("type") == "text" for p in content):
            return "\n".join(texts)
    return None


def _message(raw: Any, i: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BadRequest(f"messages[{i}] is not an object", param=f"messages[{i}]")
    role = raw.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"messages[{i}] has no role", param=f"messages[{i}].role")
    out = {k: v for k, v in raw.items() if v is not None}
    content = raw.get("content")
    if content is not None and not isinstance(content, str | list):
        raise BadRequest(
            f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content"
        )
    text = _text_of(content)
    if text is not None:
        out["content"] = text.strip()  # surrounding whitespace never changes the question
    return out


def _params(body: dict[str, Any], exclude: frozenset[str]) -> dict[str, Any]:
    params = {k: v for k, v in body.items() if k not in exclude and k not in IGNORED_PARAMS and v is not None}
    for name in _FLOAT_PARAMS:
        value = params.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"{name} must be a number", param=name)
            params[name] = float(value)  # 0 and 0.0 are one request
    if params.get("n") == 1:
        del params["n"]
    return params


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_stop(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


# Types of the other parameters OpenAI's API checks (a wrong one is a 400 there too, never forwarded).
_TYPES: dict[str, tuple[Any, str]] = {
    "max_tokens": (_is_int, "an integer"),
    "max_completion_tokens": (_is_int, "an integer"),
    "logprobs": (lambda v: isinstance(v, bool) or _is_int(v), "true, false or an integer"),
    "top_logprobs": (_is_int, "an integer"),
    "stop": (_is_stop, "a string or a list of strings"),
    "user": (lambda v: isinstance(v, str), "a string"),
}


def _check_types(body: dict[str, Any]) -> None:
    for name, (ok, what) in _TYPES.items():
        value = body.get(name)
        if value is not None and not ok(value):
            raise BadRequest(f"{name} must be {what}", param=name)


def _common(body: Any) -> tuple[str, bool, bool, int, float | None, int | None]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("model is required", param="model")
    if len(model) > MAX_MODEL_CHARS:
        raise BadRequest(f"model has {len(model)} characters; the limit is {MAX_MODEL_CHARS}", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    if not isinstance(options.get("include_usage", False), bool):
        raise BadRequest("stream_options.include_usage must be true or false", param="stream_options")
    include_usage = bool(options.get("include_usage"))
    _check_types(body)
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadRequest("n must be a positive integer", param="n")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise BadRequest("temperature must be a number", param="temperature")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed must be an integer", param="seed")
    return model, stream, include_usage, n, None if temperature is None else float(temperature), seed


def normalise_chat(body: Any, tenant: str | None = None, max_messages: int = 1_024) -> Normalised:
    model, stream, include_usage, n, temperature, seed = _common(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list", param="messages")
    if len(raw) > max_messages:
        raise BadRequest(f"{len(raw)} messages; the limit is {max_messages}", status=413, param="messages")
    messages = [_message(m, i) for i, m in enumerate(raw)]
    params = _params(body, frozenset({"model", "messages"}))
    last = messages[-1]
    prompt = last.get("content") if last["role"] == "user" and isinstance(last.get("content"), str) else None
    before = messages[:-1] if prompt is not None else messages
    uses_tools = any(k in body for k in ("tools", "functions", "tool_choice", "function_call")) or any(
        m["role"] in ("tool", "function") or "tool_calls" in m for m in messages
    )
    return Normalised(
        route="chat",
        model=model,
        tenant=tenant,
        stream=stream,
        include_usage=include_usage,
        key="gw:chat:" + _digest({"model": model, "tenant": tenant, "messages": messages, "params": params}),
        context=_digest({"model": model, "tenant": tenant, "before": before, "params": params})[:16],
        prompt=prompt or None,
        n=n,
        temperature=temperature,
        seed=seed,
        uses_tools=uses_tools,
        logprobs=bool(body.get("logprobs")) or body.get("top_logprobs") is not None,
        several_prompts=False,
    )


def normalise_completion(body: Any, tenant: str | None = None) -> Normalised:
    model, stream, include_usage, n, temperature, seed = _common(body)
    raw = body.get("prompt")
    several = isinstance(raw, list) and len(raw) > 1 and not all(isinstance(t, int) for t in raw)
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, str):
        prompt: Any = raw.strip()
        if not prompt:
            raise BadRequest("prompt is empty", param="prompt")
    elif isinstance(raw, list) and raw:
        prompt = raw  # token ids, or several prompts: matched by exact key only, if at all
    else:
        raise BadRequest("prompt must be a string or a non-empty list", param="prompt")
    params = _params(body, frozenset({"model", "prompt"}))
    return Normalised(
        route="completion",
        model=model,
        tenant=tenant,
        stream=stream,
        include_usage=include_usage,
        key="gw:completion:"
        + _digest({"model": model, "tenant": tenant, "prompt": prompt, "params": params}),
        context=_digest({"model": model, "tenant": tenant, "params": params})[:16],
        prompt=prompt if isinstance(prompt, str) else None,
        n=n,
        temperature=temperature,
        seed=seed,
        uses_tools=False,
        logprobs=body.get("logprobs") is not None,
        several_prompts=several,
    )


def check_tenant(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not TENANT.match(value):
        raise BadRequest("x-cachemesh-tenant must be 1-64 letters, digits, '.', '_' or '-'")
    return value
