"""A Jepsen-style history of writes and reads over several cache nodes, and its checker: stale reads after
the propagation window, phantoms, lost or diverged acknowledged writes, and propagation times.

Model (after Jepsen/Knossos: record a history, judge it afterwards). Every write of a key carries a value
no other write uses. Write `a` precedes write `b` when `a` completed before `b` was invoked (real time);
two writes that overlap are concurrent and neither is older. A read may return any write that no
acknowledged write preceding the read's start has superseded; once that write's acknowledgement is
`window_ms` old, returning a value it superseded is a stale read. A write whose outcome is unknown (the
connection dropped) may or may not have happened: it never supersedes anything, and reading it is not a
phantom. A failed write (the node refused it) did not happen. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Kind = Literal["write", "read"]
Status = Literal["ok", "fail", "unknown"]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation. `value`: what a write wrote, what a read returned (None: a miss).
    `complete_ms` is when the caller got the answer (for an unknown write: when it gave up)."""

    client: str
    node: str
    kind: Kind
    key: str
    value: str | None
    invoke_ms: float
    complete_ms: float
    status: Status = "ok"
    source: str | None = None  # where a read was served from (a tier, a peer), for the diagnosis


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Literal["stale", "phantom", "lost", "diverged"]
    key: str
    node: str
    detail: str
    op: Op | None = None


@dataclass
class Report:
    window_ms: float
    operations: int = 0
    writes_ok: int = 0
    reads_ok: int = 0
    reads_failed: int = 0
    misses: int = 0  # reads that found nothing (not stale: a miss serves no wrong answer)
    stale_in_window: int = 0  # superseded values served before the window had passed (allowed)
    violations: list[Violation] = field(default_factory=list)
    propagation_ms: list[float] = field(default_factory=list)
    unobserved: int = 0  # acknowledged writes no probe saw on every node

    def count(self, kind: str) -> int:
        return sum(v.kind == kind for v in self.violations)

    @property
    def stale(self) -> int:
        return self.count("stale")

    @property
    def phantoms(self) -> int:
        return self.count("phantom")

    @property
    def lost(self) -> int:
        return self.count("lost")

    @property
    def diverged(self) -> int:
        return self.count("diverged")

    @property
    def ok(self) -> bool:
        return not self.violations

    def propagation_percentile(self, q: float) -> float | None:
        if not self.propagation_ms:
            return None
        return float(np.percentile(self.propagation_ms, q))

    def summary(self) -> str:
        return "; ".join(f"{v.kind} {v.key}@{v.node}: {v.detail}" for v in self.violations[:10])


class _KeyWrites:
    """The writes of one key, for precedence questions."""

    def __init__(self, writes: Sequence[Op]) -> None:
        self.by_value = {w.value: w for w in writes if w.status != "fail"}
        self.acked = sorted((w for w in writes if w.status == "ok"), key=lambda w: w.complete_ms)
        self._acked_completes = [w.complete_ms for w in self.acked]

    @staticmethod
    def effective_complete(w: Op) -> float:
        return w.complete_ms if w.status == "ok" else math.inf

    def precedes(self, a: Op, b: Op) -> bool:
        """`a` completed (acknowledged) before `b` was invoked."""
        return self.effective_complete(a) < b.invoke_ms

    def superseder(self, w: Op, acked_before_ms: float) -> Op | None:
        """An acknowledged write, acknowledged by `acked_before_ms`, that `w` precedes (None: none)."""
        for s in self.acked:
            if s.complete_ms > acked_before_ms:
                break
            if s is not w and self.precedes(w, s):
                return s
        return None

    def at_least(self, value: str | None, w: Op) -> bool:
        """Whether serving `value` shows `w` or a write that `w` does not follow (as new, or newer)."""
        if value is None:
            return False
        v = self.by_value.get(value)
        return v is not None and (v is w or not self.precedes(v, w))


def check(
    history: Iterable[Op], *, window_ms: float, final: Iterable[Op] = (), nodes: Iterable[str] = ()
) -> Report:
    """Judge `history`; `final` are reads of every key on every node once the load stopped and the
    window passed (the lost-write and convergence checks); `nodes` (default: those in the history) is
    where a write must be observed for its propagation time."""
    ops = list(history)
    final_ops = list(final)
    report = Report(window_ms=window_ms, operations=len(ops))
    writes: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind == "write":
            writes.setdefault(op.key, []).append(op)
    keys = {k: _KeyWrites(ws) for k, ws in writes.items()}
    empty = _KeyWrites(())
    for op in ops:
        if op.kind == "write":
            report.writes_ok += op.status == "ok"
        else:
            _check_read(op, keys.get(op.key, empty), report)
    for op in final_ops:
        if op.kind == "read":
            _check_read(op, keys.get(op.key, empty), report, final=True)
    _check_final(final_ops, keys, report)
    node_set = set(nodes) or {op.node for op in ops}
    _propagation(ops, keys, node_set, report)
    return report


def _check_read(op: Op, kw: _KeyWrites, report: Report, *, final: bool = False) -> None:
    if op.status != "ok":
        report.reads_failed += 1
        return
    report.reads_ok += 1
    if op.value is None:
        report.misses += 1
        return
    w = kw.by_value.get(op.value)
    if w is None or w.invoke_ms > op.complete_ms:
        report.violations.append(
            Violation("phantom", op.key, op.node, f"{op.value!r} was never written (by then)", op)
        )
        return
    newer = kw.superseder(w, acked_before_ms=op.invoke_ms - report.window_ms)
    if newer is not None and not final:
        report.violations.append(
            Violation(
                "stale",
                op.key,
                op.node,
                f"served {op.value!r} {op.invoke_ms - newer.complete_ms:.0f} ms after "
                f"{newer.value!r} was acknowledged",
                op,
            )
        )
    elif kw.superseder(w, acked_before_ms=op.invoke_ms) is not None:
        report.stale_in_window += not final


def _check_final(final: Sequence[Op], keys: Mapping[str, _KeyWrites], report: Report) -> None:
    """Every key with an acknowledged write: each node serves a write no acknowledged write superseded,
    and all nodes serve the same one."""
    by_key: dict[str, list[Op]] = {}
    for op in final:
        if op.kind == "read":
            by_key.setdefault(op.key, []).append(op)
    for key, kw in keys.items():
        if not kw.acked:
            continue
        seen = by_key.get(key, [])
        latest = kw.acked[-1]
        for op in seen:
            if op.status != "ok":
                report.violations.append(Violation("lost", key, op.node, "final read failed", op))
                continue
            w = kw.by_value.get(op.value) if op.value is not None else None
            if w is None or kw.superseder(w, acked_before_ms=math.inf) is not None:
                report.violations.append(
                    Violation(
                        "lost",
                        key,
                        op.node,
                        f"serves {op.value!r} at the end; {latest.value!r} was acknowledged",
                        op,
                    )
                )
        values = {op.value for op in seen if op.status == "ok"}
        if len(values) > 1:
            report.violations.append(
                Violation("diverged", key, "*", f"nodes serve {sorted(map(str, values))} at the end")
            )


def _propagation(ops: Sequence[Op], keys: Mapping[str, _KeyWrites], nodes: set[str], report: Report) -> None:
    """Per acknowledged write: its acknowledgement until every node has been seen serving it or newer
    (the completion of the first such read on each node that started after the write did)."""
    reads: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind == "read" and op.status == "ok" and op.value is not None:
            reads.setdefault(op.key, []).append(op)
    for key, kw in keys.items():
        rs = sorted(reads.get(key, []), key=lambda r: r.complete_ms)
        for w in kw.acked:
            first: dict[str, float] = {}
            for r in rs:
                if r.node in first or r.invoke_ms < w.invoke_ms or not kw.at_least(r.value, w):
                    continue
                first[r.node] = r.complete_ms
                if len(first) == len(nodes):
                    break
            if nodes <= first.keys():
                report.propagation_ms.append(max(0.0, max(first.values()) - w.complete_ms))
            else:
                report.unobserved += 1


def timeline(history: Iterable[Op], key: str, node: str | None = None, *, since_ms: float = 0.0) -> str:
    """The writes of `key` and its reads on `node` (every node: None), in order of invocation, one a
    line: what a violation is read against."""
    rows = sorted(
        (op for op in history if op.key == key and (op.kind == "write" or node in (None, op.node))),
        key=lambda op: op.invoke_ms,
    )
    return "\n".join(
        f"{op.invoke_ms - since_ms:9.0f} {op.complete_ms - since_ms:9.0f} {op.client:6} {op.node} "
        f"{op.kind:5} {op.status:7} {op.value} {op.source or ''}"
        for op in rows
    )
