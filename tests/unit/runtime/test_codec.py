"""The consumers' fast decode agrees with `schemas.wire.decode` on every input: same event, or the
same failure kind and reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import CacheInvalidated
from schemas.export import GOLDEN_DIR
from schemas.wire import DecodeError, decode, encode
from services.runtime.codec import decode_event

GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
BASE = {
    "type": "cache.accessed",
    "schema_version": 1,
    "event_id": "e1",
    "occurred_at_ms": 1,
    "key": "k",
    "hit": True,
}
NAN_EMBEDDING = encode(CacheInvalidated(key="k", embedding=[0.1, 0.2])).decode().replace("0.2", "NaN")


def _outcome(fn, data: bytes | None, max_bytes: int = 4096) -> object:
    try:
        return fn(data, max_bytes)
    except DecodeError as exc:
        return (exc.kind, exc.reason)


def _same(data: bytes | None, max_bytes: int = 4096) -> None:
    try:
        expected = _outcome(decode, data, max_bytes)
    except TypeError:
        # `schemas.wire.decode` trips on an unhashable schema_version or type; the consumers'
        # decode turns that into a record to dead-letter.
        with pytest.raises(DecodeError) as err:
            decode_event(data, max_bytes)
        assert err.value.kind == "invalid"
        return
    assert _outcome(decode_event, data, max_bytes) == expected


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_golden_payloads_decode_to_the_same_event(path) -> None:
    event = decode_event(path.read_bytes())
    assert event == decode(path.read_bytes())
    assert decode_event(encode(event)) == event


def _doc(**overrides: object) -> bytes:
    doc = {**BASE, **overrides}
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"x" * 5000,
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"a string"',
        b"{}",
        _doc(schema_version=2),
        _doc(schema_version="1"),
        _doc(schema_version=True),
        _doc(schema_version=[1]),
        _doc(schema_version=...),
        _doc(type="cache.exploded"),
        _doc(type=["cache.accessed"]),
        _doc(event_id=...),
        _doc(event_id=None),
        _doc(occurred_at_ms=...),
        _doc(occurred_at_ms="soon"),
        _doc(key=""),
        _doc(hit="maybe"),
        _doc(latency_ms=-1),
        _doc(latency_ms=1e400),
        _doc(similarity=float("nan")),
        _doc(size_bytes=2**80),
        _doc(added_in_v1_1="fine"),
        NAN_EMBEDDING.encode(),
        '{"type": "cache.accessed"}'.encode("utf-16"),
    ],
)
def test_bad_and_odd_records_get_the_same_verdict(data: bytes | None) -> None:
    _same(data)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


_FIELDS = st.sampled_from([*BASE, "tier", "latency_ms", "model"])
_OVERRIDES = st.dictionaries(_FIELDS, _json_values, max_size=3)


@settings(max_examples=300, deadline=None)
@given(overrides=_OVERRIDES)
def test_mutated_payloads_get_the_same_verdict(overrides: dict[str, object]) -> None:
    _same(json.dumps({**BASE, **overrides}).encode())


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_random_bytes_get_the_same_verdict(data: bytes) -> None:
    _same(data)
