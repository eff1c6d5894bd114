"""Loopback ports for test and bring-up servers come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from infra.paths import LOOPBACK, _ephemeral_range, free_port, pick_range


def test_the_pick_range_sits_below_the_ephemeral_range() -> None:
    assert pick_range((32768, 60999)) == (10_000, 32767)


def test_no_pick_range_when_the_ephemeral_range_starts_low_or_is_unknown() -> None:
    assert pick_range((1024, 65535)) is None
    assert pick_range(None) is None


def test_free_ports_are_bindable_distinct_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    ephemeral = _ephemeral_range()
    span = pick_range(ephemeral)
    for port in ports:
        if span is not None:
            assert span[0] <= port <= span[1]
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((LOOPBACK, port))
