"""The consumer's decision on each record, as tables: what comes off the wire, what the handler did."""

from __future__ import annotations

import json

import pytest

from schemas.events import ConversationEnded
from schemas.wire import encode
from services.runtime.consume import (
    Abandon,
    Applied,
    Apply,
    Attempts,
    DeadLetter,
    Dedupe,
    Retry,
    RetryPolicy,
    Skip,
    admit,
    after_attempt,
    backoff_s,
)

MAX_BYTES = 4096
GOOD = ConversationEnded(trace_id="t", event_id="e-good")
GOOD_BYTES = encode(GOOD)


def _with(**fields: object) -> bytes:
    return json.dumps({**json.loads(GOOD_BYTES), **fields}).encode()


def _without(name: str) -> bytes:
    raw = json.loads(GOOD_BYTES)
    del raw[name]
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    ("value", "kind", "reason_has"),
    [
        (None, "malformed_json", "tombstone"),
        (b"{this is not json", "malformed_json", "not valid UTF-8 JSON"),
        (b"\xff\xfe", "malformed_json", "not valid UTF-8 JSON"),
        (b"[1, 2]", "not_an_object", "got list"),
        (_with(schema_version=7), "unsupported_schema_version", "schema_version 7"),
        (_with(type="nope.v1"), "unknown_type", "'nope.v1'"),
        (_without("event_id"), "invalid", "event_id"),
        (_with(occurred_at_ms="soon"), "invalid", "occurred_at_ms"),
        (_with(pad="x" * MAX_BYTES), "oversized", f"{MAX_BYTES}-byte limit"),
    ],
)
def test_records_that_cannot_be_decoded_are_dead_lettered(
    value: bytes | None, kind: str, reason_has: str
) -> None:
    decision = admit(value, MAX_BYTES, Dedupe(capacity=10))
    assert isinstance(decision, DeadLetter)
    assert decision.kind == kind
    assert reason_has in decision.reason
    assert decision.outcome == "dead_lettered"


def test_a_record_exactly_at_the_limit_is_applied() -> None:
    assert admit(GOOD_BYTES, len(GOOD_BYTES), Dedupe(capacity=10)) == Apply(GOOD)
    assert isinstance(admit(GOOD_BYTES, len(GOOD_BYTES) - 1, Dedupe(capacity=10)), DeadLetter)


@pytest.mark.parametrize(
    ("remembered", "decision"),
    [
        ((), Apply(GOOD)),
        (("other",), Apply(GOOD)),
        (("e-good",), Skip()),
    ],
)
def test_a_decoded_event_is_applied_unless_seen_before(remembered: tuple[str, ...], decision: object) -> None:
    dedupe = Dedupe(capacity=10)
    for event_id in remembered:
        dedupe.remember(event_id)
    assert admit(GOOD_BYTES, MAX_BYTES, dedupe) == decision


def test_admission_does_not_remember_the_event() -> None:
    # Remembered only once the handler is done with it: a crash mid-handler must not hide it.
    dedupe = Dedupe(capacity=10)
    assert admit(GOOD_BYTES, MAX_BYTES, dedupe) == Apply(GOOD)
    assert admit(GOOD_BYTES, MAX_BYTES, dedupe) == Apply(GOOD)


class Flaky(Exception):
    pass


POLICY = RetryPolicy(
    handler_max_attempts=3, transient_errors=(Flaky, OSError), first_backoff_s=0.05, max_backoff_s=5.0
)


@pytest.mark.parametrize(
    ("error", "before", "stopping", "verdict"),
    [
        # The handler returned.
        (None, Attempts(), False, Applied()),
        (None, Attempts(failures=2, transient_failures=9), True, Applied()),
        # Transient: retried without moving on, backoff doubling from 50 ms up to the cap.
        (Flaky(), Attempts(), False, Retry(0.05, Attempts(0, 1), transient=True)),
        (OSError(), Attempts(0, 1), False, Retry(0.1, Attempts(0, 2), transient=True)),
        (ConnectionResetError(), Attempts(0, 3), False, Retry(0.4, Attempts(0, 4), transient=True)),
        (Flaky(), Attempts(0, 7), False, Retry(5.0, Attempts(0, 8), transient=True)),
        (Flaky(), Attempts(0, 10_000), False, Retry(5.0, Attempts(0, 10_001), transient=True)),
        # Transient failures never count towards dead-lettering.
        (Flaky(), Attempts(2, 0), False, Retry(0.05, Attempts(2, 1), transient=True)),
        # Other failures: retried at once, dead-lettered on the last attempt.
        (ValueError("x"), Attempts(), False, Retry(0.0, Attempts(1, 0), transient=False)),
        (ValueError("x"), Attempts(1, 4), False, Retry(0.0, Attempts(2, 4), transient=False)),
        (
            ValueError("cannot apply"),
            Attempts(2, 0),
            False,
            DeadLetter("handler_failed", "ValueError: cannot apply"),
        ),
        (KeyError("k"), Attempts(2, 0), True, DeadLetter("handler_failed", "KeyError: 'k'")),
        # Stopping while the failure says "later": leave it uncommitted for the next consumer.
        (Flaky(), Attempts(0, 3), True, "abandon"),
    ],
)
def test_what_follows_one_call_of_the_handler(
    error: Exception | None, before: Attempts, stopping: bool, verdict: object
) -> None:
    got = after_attempt(error, before, POLICY, stopping=stopping)
    if verdict == "abandon":
        assert got == Abandon(error) and isinstance(got, Abandon) and got.error is error
    else:
        assert got == verdict


def test_one_attempt_allowed_dead_letters_on_the_first_failure() -> None:
    policy = RetryPolicy(handler_max_attempts=1, transient_errors=())
    assert after_attempt(OSError("disk"), Attempts(), policy, stopping=False) == DeadLetter(
        "handler_failed", "OSError: disk"
    )


def test_a_handler_retried_to_the_end_follows_the_table() -> None:
    """Driving the decision as the consumer loop does: two transient failures, two others, success."""
    errors: list[Exception | None] = [Flaky(), ValueError("a"), Flaky(), ValueError("b"), None]
    attempts, waits = Attempts(), []
    for error in errors:
        verdict = after_attempt(error, attempts, POLICY, stopping=False)
        if isinstance(verdict, Retry):
            waits.append(verdict.backoff_s)
            attempts = verdict.attempts
    assert verdict == Applied()
    assert waits == [0.05, 0.0, 0.1, 0.0]


@pytest.mark.parametrize(
    ("attempt", "first", "cap", "wait"),
    [
        (1, 0.1, 5.0, 0.1),
        (2, 0.1, 5.0, 0.2),
        (6, 0.1, 5.0, 3.2),
        (7, 0.1, 5.0, 5.0),
        (10**9, 0.1, 5.0, 5.0),
        # The first wait is never cut by the cap (as the loop always did).
        (1, 0.1, 0.01, 0.1),
        (2, 0.1, 0.01, 0.01),
    ],
)
def test_backoff_doubles_up_to_its_cap(attempt: int, first: float, cap: float, wait: float) -> None:
    assert backoff_s(attempt, first, cap) == pytest.approx(wait)
