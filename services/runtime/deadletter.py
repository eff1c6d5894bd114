"""One dead-letter path for every consumer (the services' `EventConsumer` and the streams app): the
headers of a record's dead-letter copy (the reason, where it came from; its bytes stay untouched),
logged and counted once."""

from __future__ import annotations

import logging
import time
from typing import Any

from schemas.wire import dead_letter_headers
from services.runtime import metrics

log = logging.getLogger(__name__)


def dead_letter(record: Any, kind: str, reason: str, group: str) -> list[tuple[str, bytes]]:
    """The headers to send `record` (an aiokafka or faust record: topic, partition, offset, headers)
    to its dead-letter topic with; the caller sends `record.key` and `record.value` as they are."""
    headers = dead_letter_headers(
        record.headers,
        kind=kind,
        reason=reason,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        group=group,
        failed_at_ms=time.time_ns() // 1_000_000,
    )
    log.warning(
        "dead-lettered a record",
        extra={"topic": record.topic, "offset": record.offset, "kind": kind, "reason": reason[:200]},
    )
    metrics.child(metrics.EVENTS_DEAD_LETTERED, record.topic, kind).inc()
    return headers
