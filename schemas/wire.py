"""Events to bytes and back, with a precise reason for everything that cannot be decoded.

Dead-letter records keep the original key, value and headers byte for byte and add the reason as
headers (the Kafka Connect convention), so a DLQ record is never larger than what failed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import ValidationError

from schemas.events import EVENT_ADAPTER, EVENT_TYPES, SUPPORTED_SCHEMA_VERSIONS, Event

DEFAULT_MAX_EVENT_BYTES = 256 * 1024

FailureKind = Literal[
    "oversized",
    "malformed_json",
    "not_an_object",
    "unsupported_schema_version",
    "unknown_type",
    "invalid",
    "handler_failed",
]

# Header names on dead-letter records.
DLQ_REASON = "dlq.reason"
DLQ_KIND = "dlq.kind"
DLQ_SOURCE_TOPIC = "dlq.source.topic"
DLQ_SOURCE_PARTITION = "dlq.source.partition"
DLQ_SOURCE_OFFSET = "dlq.source.offset"
DLQ_CONSUMER_GROUP = "dlq.consumer.group"
DLQ_FAILED_AT_MS = "dlq.failed_at_ms"
MAX_DLQ_REASON_CHARS = 1000


def dead_letter_headers(
    original: Sequence[tuple[str, bytes]] | None,
    *,
    kind: str,
    reason: str,
    topic: str,
    partition: int,
    offset: int,
    group: str,
    failed_at_ms: int,
) -> list[tuple[str, bytes]]:
    """The headers of a dead-letter record: the original ones, then why and where it failed."""
    return [
        *(original or ()),
        (DLQ_REASON, reason[:MAX_DLQ_REASON_CHARS].encode()),
        (DLQ_KIND, kind.encode()),
        (DLQ_SOURCE_TOPIC, topic.encode()),
        (DLQ_SOURCE_PARTITION, str(partition).encode()),
        (DLQ_SOURCE_OFFSET, str(offset).encode()),
        (DLQ_CONSUMER_GROUP, group.encode()),
        (DLQ_FAILED_AT_MS, str(failed_at_ms).encode()),
    ]


class DecodeError(ValueError):
    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind: FailureKind = kind
        self.reason = reason


def encode(event: Event) -> bytes:
    # `model_dump_json(exclude_none=True).encode()` without the round trip through `str`.
    return event.__pydantic_serializer__.to_json(event, exclude_none=True)


def decode(data: bytes | None, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> Event:
    if data is None:
        raise DecodeError("malformed_json", "record has no value (tombstone)")
    if len(data) > max_bytes:
        raise DecodeError("oversized", f"{len(data)} bytes exceeds the {max_bytes}-byte limit")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DecodeError("malformed_json", f"not valid UTF-8 JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise DecodeError("not_an_object", f"expected a JSON object, got {type(raw).__name__}")
    version = raw.get("schema_version")
    # Membership tests hash the value: a list or an object there is refused, not a TypeError.
    if isinstance(version, list | dict) or version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = sorted(SUPPORTED_SCHEMA_VERSIONS)
        raise DecodeError(
            "unsupported_schema_version", f"schema_version {version!r} is not one of {supported}"
        )
    event_type = raw.get("type")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise DecodeError("unknown_type", f"unknown event type {event_type!r}")
    # Defaults are a convenience for producers in Python; on the wire both are required, since
    # de-duplication and windows depend on them.
    missing = [name for name in ("event_id", "occurred_at_ms") if name not in raw]
    if missing:
        raise DecodeError("invalid", f"{event_type}: missing required field(s) {', '.join(missing)}")
    try:
        return EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '<root>'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        raise DecodeError("invalid", f"{event_type}: {problems}") from None
