"""What the consumer does with each record, decided without I/O: apply it, skip a duplicate, retry
the handler without moving on, or dead-letter it with a kind and a reason. `kafka.py` carries it out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import ClassVar

from schemas.events import Event
from schemas.wire import DecodeError, FailureKind
from services.runtime.codec import decode_event


@dataclass
class Dedupe:
    """The last `capacity` event ids seen, oldest forgotten first."""

    capacity: int
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def seen(self, event_id: str) -> bool:
        if event_id in self._seen:
            self._seen.move_to_end(event_id)
            return True
        return False

    def remember(self, event_id: str) -> None:
        if self.capacity == 0:
            return
        self._seen[event_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard a handler is tried: transient failures forever with capped exponential backoff,
    any other failure `handler_max_attempts` times in a row, at once."""

    handler_max_attempts: int
    transient_errors: tuple[type[BaseException], ...]
    first_backoff_s: float = 0.05
    max_backoff_s: float = 5.0


# --- decisions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Apply:
    """Hand the event to the handler."""

    event: Event


@dataclass(frozen=True, slots=True)
class Skip:
    """Seen before (by event_id): move past it, apply nothing."""

    outcome: ClassVar[str] = "duplicate"


@dataclass(frozen=True, slots=True)
class Applied:
    """The handler is done with it: the offset may be committed."""

    outcome: ClassVar[str] = "applied"


@dataclass(frozen=True, slots=True)
class Attempts:
    """Failures so far of one record's handler: non-transient ones count towards dead-lettering."""

    failures: int = 0
    transient_failures: int = 0


@dataclass(frozen=True, slots=True)
class Retry:
    """Call the handler again after `backoff_s`, without moving on."""

    backoff_s: float
    attempts: Attempts
    transient: bool


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Publish the original bytes to the dead-letter topic, then move on."""

    kind: FailureKind
    reason: str
    outcome: ClassVar[str] = "dead_lettered"


@dataclass(frozen=True, slots=True)
class Abandon:
    """Stopping while the failure still says "later": leave the record uncommitted and re-raise
    `error`, so whoever consumes next gets it again."""

    error: BaseException


Admission = Apply | Skip | DeadLetter
Verdict = Applied | Retry | DeadLetter | Abandon


def backoff_s(attempt: int, first_s: float, max_s: float) -> float:
    """The wait before retry number `attempt` (1-based): `first_s`, then doubling up to `max_s`."""
    if attempt <= 1:
        return first_s
    # The exponent is bounded so that a week-long outage cannot overflow the float.
    return min(first_s * 2 ** min(attempt - 1, 64), max_s)


def admit(value: bytes | None, max_event_bytes: int, dedupe: Dedupe) -> Admission:
    """A record's value as it came off the wire: apply it, skip it, or dead-letter it."""
    try:
        event = decode_event(value, max_event_bytes)
    except DecodeError as exc:
        return DeadLetter(exc.kind, exc.reason)
    if dedupe.seen(event.event_id):
        return Skip()
    return Apply(event)


def after_attempt(
    error: BaseException | None, attempts: Attempts, policy: RetryPolicy, *, stopping: bool
) -> Verdict:
    """What follows one call of the handler that raised `error` (None: it returned)."""
    if error is None:
        return Applied()
    if isinstance(error, policy.transient_errors):
        if stopping:
            return Abandon(error)
        transient = attempts.transient_failures + 1
        wait = backoff_s(transient, policy.first_backoff_s, policy.max_backoff_s)
        return Retry(wait, Attempts(attempts.failures, transient), transient=True)
    failures = attempts.failures + 1
    if failures < policy.handler_max_attempts:
        return Retry(0.0, Attempts(failures, attempts.transient_failures), transient=False)
    return DeadLetter("handler_failed", f"{type(error).__name__}: {error}")
