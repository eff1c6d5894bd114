"""The request bodies of the gateway's routes, as JSON Schema for its OpenAPI document (/docs and the
fuzz test read them). The routes parse bodies themselves (services/gateway/requests.py: bounded depth,
no NaN or Infinity, OpenAI's error shape) and pass any parameter they do not know to the upstream; these
schemas describe what OpenAI's API accepts for the parameters the gateway looks at."""

from __future__ import annotations

from typing import Any

from services.gateway.requests import MAX_MODEL_CHARS

_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}
_SAMPLING: dict[str, Any] = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 8},
    "seed": {"type": "integer"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "user": {"type": "string"},
}
_MODEL = {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_CHARS}

CHAT: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": _MODEL,
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                    "content": {
                        "anyOf": [
                            {"type": "string"},
                            {"type": "array", "items": _TEXT_PART, "minItems": 1},
                            {"type": "null"},
                        ]
                    },
                    "name": {"type": "string"},
                },
            },
        },
        **_SAMPLING,
    },
}

COMPLETION: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": _MODEL,
        "prompt": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
            ]
        },
        **_SAMPLING,
    },
}

FEEDBACK: dict[str, Any] = {
    "type": "object",
    "properties": {
        "response_id": {"type": "string", "description": "the `id` of an answer the cache served"},
        "key": {"type": "string", "description": "or the entry's key (x-cachemesh-key) ..."},
        "text": {"type": "string", "description": "... and the request's text"},
        "correct": {"type": "boolean", "default": False},
        "evict": {"type": "boolean", "description": "remove the entry (default: a wrong exact hit)"},
    },
}


def body(schema: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `schema`."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
