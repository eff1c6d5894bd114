"""The consistency checker on hand-built histories: ones that must pass (concurrent writes, reads that
overlap a write, failures during a fault) and ones that must fail, one per violation kind."""

from __future__ import annotations

import pytest

from sim.consistency import Op, Report, check

W = 100.0  # the propagation window of these histories (ms)
NODES = ("a", "b", "c")


def write(value: str, invoke: float, complete: float, *, node="a", key="k", status="ok") -> Op:  # type: ignore[no-untyped-def]
    return Op("w", node, "write", key, value, invoke, complete, status)


def read(
    value: str | None, invoke: float, complete: float, *, node: str = "b", key: str = "k", status="ok"
) -> Op:  # type: ignore[no-untyped-def]
    return Op("r", node, "read", key, value, invoke, complete, status)


def finals(value: str | None, at: float = 10_000, key: str = "k") -> list[Op]:
    return [read(value, at, at + 1, node=n, key=key) for n in NODES]


def judged(history: list[Op], final: list[Op] | None = None) -> Report:
    return check(history, window_ms=W, final=finals("v2") if final is None else final, nodes=NODES)


def test_a_clean_history_passes_and_times_propagation() -> None:
    history = [
        write("v1", 0, 10),
        write("v2", 20, 30),
        read("v1", 25, 28, node="b"),  # overlaps v2: either is fine
        read("v2", 31, 40, node="a"),
        read("v2", 32, 45, node="b"),
        read("v1", 35, 50, node="c"),  # superseded, but inside the window
        read("v2", 60, 70, node="c"),
        read("v2", 200, 210, node="c"),
    ]
    report = judged(history)
    assert report.ok, report.summary()
    assert report.stale_in_window == 1
    assert report.writes_ok == 2 and report.reads_ok == len(history) - 2 + 3
    # v2 acked at 30; the last node (c) was first seen serving it at 70.
    assert report.propagation_ms[-1] == pytest.approx(40.0)
    # v1 acked at 10: b at 28 (v1), a at 40 (v2 counts: newer), c at 50.
    assert report.propagation_ms[0] == pytest.approx(40.0)
    assert report.propagation_percentile(50) == pytest.approx(40.0)


def test_concurrent_writes_may_be_read_in_either_order_and_either_may_win() -> None:
    history = [
        write("x", 0, 50, node="a"),
        write("y", 10, 60, node="b"),
        read("y", 200, 201, node="c"),
        read("x", 300, 301, node="a"),  # x and y overlap: neither supersedes the other
        read("y", 400, 401, node="b"),
    ]
    assert judged(history, finals("x")).ok
    assert judged(history, finals("y")).ok


def test_a_superseded_value_after_the_window_is_stale() -> None:
    history = [write("v1", 0, 10), write("v2", 20, 30), read("v1", 30 + W + 1, 200, node="c")]
    report = judged(history)
    assert (report.stale, report.phantoms, report.lost) == (1, 0, 0)
    assert report.violations[0].node == "c" and "v2" in report.violations[0].detail


def test_a_read_that_started_inside_the_window_is_not_stale() -> None:
    history = [write("v1", 0, 10), write("v2", 20, 30), read("v1", 30 + W - 1, 500, node="c")]
    report = judged(history)
    assert report.ok and report.stale_in_window == 1


def test_a_value_never_written_is_a_phantom() -> None:
    report = judged([write("v2", 0, 10), read("v9", 20, 30)])
    assert (report.phantoms, report.stale) == (1, 0)


def test_a_value_read_before_its_write_began_is_a_phantom() -> None:
    report = judged([read("v2", 0, 5), write("v2", 10, 20)])
    assert report.phantoms == 1


def test_a_refused_write_read_back_is_a_phantom_but_an_unknown_one_is_not() -> None:
    refused = judged([write("v2", 0, 10), write("v3", 20, 30, status="fail"), read("v3", 40, 50)])
    assert refused.phantoms == 1
    unknown = [write("v2", 0, 10), write("v3", 20, 30, status="unknown"), read("v3", 40, 50)]
    assert judged(unknown, finals("v3")).ok
    assert judged(unknown, finals("v2")).ok  # it may as well never have happened


def test_an_unknown_write_supersedes_nothing() -> None:
    history = [write("v1", 0, 10), write("v2", 20, 30, status="unknown"), read("v1", 500, 510)]
    assert judged(history, finals("v1")).ok


def test_failed_reads_and_misses_during_a_fault_are_not_violations() -> None:
    history = [
        write("v1", 0, 10),
        write("v2", 20, 30),
        read(None, 300, 310, status="fail"),
        read(None, 400, 410),
        read("v2", 500, 510),
    ]
    report = judged(history)
    assert report.ok and report.reads_failed == 1 and report.misses == 1


def test_an_acknowledged_write_missing_at_the_end_is_lost() -> None:
    history = [write("v1", 0, 10), write("v2", 20, 30)]
    final = [
        read("v2", 1000, 1001, node="a"),
        read("v1", 1000, 1001, node="b"),
        read(None, 1000, 1001, node="c"),
    ]
    report = judged(history, final)
    assert report.lost == 2 and {v.node for v in report.violations if v.kind == "lost"} == {"b", "c"}
    assert report.diverged == 1  # a and b disagree at the end


def test_a_failed_final_read_counts_as_lost() -> None:
    report = judged([write("v1", 0, 10)], [read(None, 1000, 1001, node=n, status="fail") for n in NODES])
    assert report.lost == 3


def test_nodes_settling_on_different_concurrent_writes_diverge() -> None:
    history = [write("x", 0, 50, node="a"), write("y", 10, 60, node="b")]
    final = [
        read("x", 1000, 1001, node="a"),
        read("y", 1000, 1001, node="b"),
        read("y", 1000, 1001, node="c"),
    ]
    report = judged(history, final)
    assert (report.lost, report.diverged) == (0, 1)


def test_keys_are_judged_apart() -> None:
    history = [write("v1", 0, 10, key="p"), write("v1", 0, 10, key="q"), read("v1", 500, 510, key="q")]
    final = finals("v1", key="p") + finals("v1", key="q")
    assert judged(history, final).ok


def test_a_write_no_probe_saw_everywhere_is_unobserved() -> None:
    report = judged([write("v2", 0, 10), read("v2", 20, 30, node="a")])
    assert report.ok and report.unobserved == 1 and report.propagation_percentile(99) is None
