"""The unsampled fast path of `tracing` gives what the OpenTelemetry SDK would: the same trace
continuity and flags in `traceparent`, the same trace id for the handler; sampled traces, trace state
and baggage go through the SDK."""

from __future__ import annotations

import re

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context

from services.runtime import tracing

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@pytest.fixture(params=["fast", "sdk"])
def path(request, monkeypatch) -> str:
    tracing.configure_tracing("unit")
    if tracing._fast_ids is None:
        pytest.skip("a sampler is configured (OTEL_TRACES_SAMPLER): only the SDK path runs")
    if request.param == "sdk":
        monkeypatch.setattr(tracing, "_fast_ids", None)
    return request.param


def _parts(headers: list[tuple[str, bytes]]) -> tuple[str, str, str]:
    match = TRACEPARENT.fullmatch(dict(headers)["traceparent"].decode())
    assert match is not None
    trace_id, span_id, flags = match.groups()
    return trace_id, span_id, flags


def test_a_root_publish_starts_a_new_unsampled_trace(path: str) -> None:
    first, second = (_parts(tracing.publish_headers("t", [("event_type", b"x")])) for _ in range(2))
    assert first[0] != second[0]
    assert first[2] == second[2] == "02"  # not sampled, random trace id (W3C level 2)


def test_a_publish_inside_a_span_continues_its_trace(path: str) -> None:
    with trace.get_tracer("unit").start_as_current_span("request") as parent:
        headers = tracing.publish_headers("t")
    trace_id, span_id, flags = _parts(headers)
    ctx = parent.get_span_context()
    assert trace_id == format(ctx.trace_id, "032x") and span_id != format(ctx.span_id, "016x")
    assert flags == "02"
    assert headers[0][0] == "traceparent" and len(headers) == 1


@pytest.mark.parametrize("flags", ["00", "02"])
def test_the_handler_continues_the_producers_trace(path: str, flags: str) -> None:
    producer = f"00-{'ab' * 16}-{'cd' * 8}-{flags}".encode()
    with tracing.consumer_span("t", [("event_type", b"x"), ("traceparent", producer)]) as span:
        assert tracing.trace_id_of(span) == tracing.current_trace_id() == "ab" * 16
        assert not span.is_recording()
        onward = _parts(tracing.publish_headers("next"))
    assert onward[0] == "ab" * 16 and onward[1] not in (
        "cd" * 8,
        format(span.get_span_context().span_id, "016x"),
    )
    assert onward[2] == flags
    assert tracing.current_trace_id() is None  # the handler's context is gone again


@pytest.mark.parametrize(
    "header",
    [
        None,
        b"",
        b"garbage",
        b"00-" + b"0" * 32 + b"-" + b"cd" * 8 + b"-00",
        b"ff-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-00",
    ],
)
def test_a_record_without_a_usable_traceparent_gets_a_trace_of_its_own(
    path: str, header: bytes | None
) -> None:
    headers = [] if header is None else [("traceparent", header)]
    with tracing.consumer_span("t", headers) as span:
        trace_id = tracing.trace_id_of(span)
    assert trace_id is not None and trace_id not in ("ab" * 16, "0" * 32)


def test_a_future_traceparent_version_is_read_as_the_sdk_reads_it(path: str) -> None:
    header = b"01-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-00-extra"
    with tracing.consumer_span("t", [("traceparent", header)]) as span:
        assert tracing.trace_id_of(span) == "ab" * 16


def test_sampled_parents_and_trace_state_take_the_sdk_path() -> None:
    tracing.configure_tracing("unit")
    sampled = f"00-{'ab' * 16}-{'cd' * 8}-01".encode()
    with tracing.consumer_span("t", [("traceparent", sampled)]) as span:
        assert span.is_recording()  # ParentBased follows the sampled parent
        assert tracing.trace_id_of(span) == "ab" * 16
        assert _parts(tracing.publish_headers("next"))[2] in ("01", "03")
    unsampled = f"00-{'ab' * 16}-{'cd' * 8}-00".encode()
    with tracing.consumer_span("t", [("traceparent", unsampled), ("tracestate", b"k=v")]) as span:
        assert span.get_span_context().trace_state.get("k") == "v"
        assert (b"k=v") in dict(tracing.publish_headers("next")).values()


def test_baggage_travels_with_the_record() -> None:
    tracing.configure_tracing("unit")
    token = otel_context.attach(baggage.set_baggage("tenant", "a"))
    try:
        headers = dict(tracing.publish_headers("t"))
    finally:
        otel_context.detach(token)
    assert headers["baggage"] == b"tenant=a"
    assert "traceparent" in headers


def test_a_span_started_in_the_handler_is_a_child_of_the_records_span(path: str) -> None:
    producer = f"00-{'ab' * 16}-{'cd' * 8}-02".encode()
    with tracing.consumer_span("t", [("traceparent", producer)]) as span:
        with trace.get_tracer("unit").start_as_current_span("work") as child:
            inner = _parts(tracing.publish_headers("next"))
        token = otel_context.attach(baggage.set_baggage("tenant", "a"))
        try:
            with_baggage = dict(tracing.publish_headers("next"))
        finally:
            otel_context.detach(token)
    record_ctx, child_ctx = span.get_span_context(), child.get_span_context()
    assert record_ctx.is_valid and record_ctx.trace_id == child_ctx.trace_id == int("ab" * 16, 16)
    assert record_ctx.span_id not in (0, int("cd" * 8, 16)) and not child.is_recording()
    assert inner[0] == "ab" * 16 and inner[2] == "02"
    assert with_baggage["baggage"] == b"tenant=a"
    assert _parts(list(with_baggage.items()))[0] == "ab" * 16
