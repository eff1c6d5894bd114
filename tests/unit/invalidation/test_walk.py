"""The dependency walk against a fake index: chains, diamonds, cycles, trace roots, and the bounds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from services.invalidation.walk import Cascade, DependencyWalk, Query, Via


class FakeIndex:
    """`edges[(depends_on, via)]` = the entries that depend on it; answers like the SQL does."""

    def __init__(
        self,
        deps: Mapping[str, Sequence[str]],
        traces: Mapping[str, Sequence[str]] = {},
        written: Mapping[str, int] = {},
    ) -> None:
        self.written = written
        self.edges: dict[tuple[str, Via], list[str]] = {}
        for dependant, on in deps.items():
            for d in on:
                self.edges.setdefault((d, "dependency"), []).append(dependant)
        for dependant_trace, keys in traces.items():
            self.edges[(dependant_trace, "trace")] = list(keys)
        self.queries: list[Query] = []

    def answer(self, q: Query) -> list[tuple[str, int | None]]:
        self.queries.append(q)
        out: dict[str, None] = {}
        for i in q.ids:
            for via in q.vias:
                out.update((k, None) for k in self.edges.get((i, via), ()))
        return [(k, self.written.get(k)) for k in list(out)[: q.limit]]


def walk(index: FakeIndex, roots: Sequence[str], depth: int = 16, most: int = 1000, **kw: object) -> Cascade:
    w = DependencyWalk(roots, max_depth=depth, max_dependants=most, **kw)  # type: ignore[arg-type]
    while (q := w.next_query()) is not None:
        w.add(index.answer(q))
    return w.result()


def test_a_chain_is_followed_to_the_end() -> None:
    # a depends on b depends on c: invalidating c takes b, then a.
    cascade = walk(FakeIndex({"a": ["b"], "b": ["c"]}), ["c"])
    assert cascade == Cascade(("b", "a"), 2, None)


def test_a_chain_five_deep() -> None:
    deps = {f"k{i}": [f"k{i - 1}"] for i in range(1, 6)}
    cascade = walk(FakeIndex(deps), ["k0"])
    assert cascade.keys == ("k1", "k2", "k3", "k4", "k5") and cascade.depth == 5 and not cascade.truncated


def test_a_diamond_yields_each_dependant_once() -> None:
    # top depends on left and right, both depend on root.
    cascade = walk(FakeIndex({"left": ["root"], "right": ["root"], "top": ["left", "right"]}), ["root"])
    assert sorted(cascade.keys[:2]) == ["left", "right"] and cascade.keys[2:] == ("top",)
    assert cascade.depth == 2


@pytest.mark.parametrize(
    "deps",
    [
        {"a": ["root"], "b": ["a"], "root": ["b"]},  # back to the root
        {"a": ["root"], "b": ["a"], "c": ["b"], "a2": ["c"], "x": ["a2", "a"]},
        {"a": ["root", "a"]},  # depends on itself
        {"a": ["root", "b"], "b": ["a"]},  # two-cycle below the root
    ],
)
def test_a_cycle_ends_and_never_takes_the_root(deps: dict[str, list[str]]) -> None:
    cascade = walk(FakeIndex(deps), ["root"])
    assert "root" not in cascade.keys
    assert len(cascade.keys) == len(set(cascade.keys)) == len(set(deps) - {"root"})
    assert not cascade.truncated


def test_nothing_depends_on_it() -> None:
    assert walk(FakeIndex({"a": ["b"]}), ["zzz"]) == Cascade((), 0, None)


def test_a_trace_root_follows_trace_edges_only_at_the_first_level() -> None:
    index = FakeIndex({"summary": ["turn-1"], "other": ["conv-9"]}, traces={"conv-9": ["turn-1", "turn-2"]})
    cascade = walk(index, ["conv-9"], root_vias=("dependency", "trace"))
    assert set(cascade.keys) == {"turn-1", "turn-2", "other", "summary"}
    assert index.queries[0].vias == ("dependency", "trace")
    assert all(q.vias == ("dependency",) for q in index.queries[1:])
    # A key root does not take the conversation's entries.
    assert walk(index, ["conv-9"]).keys == ("other",)


def test_several_roots_walk_as_one() -> None:
    cascade = walk(FakeIndex({"a": ["row:o/1"], "b": ["row:o/2"], "c": ["a", "b"]}), ["row:o/1", "row:o/2"])
    assert set(cascade.keys) == {"a", "b", "c"} and cascade.depth == 2


def test_entries_written_after_the_change_stay_and_so_does_what_hangs_only_on_them() -> None:
    deps = {"old": ["root"], "new": ["root"], "on-new": ["new"], "on-both": ["new", "old"]}
    index = FakeIndex(deps, written={"old": 90, "new": 110, "on-new": 95, "on-both": 95})
    cascade = walk(index, ["root"], changed_at_ms=100)
    assert cascade.keys == ("old", "on-both") and cascade.depth == 2
    # Without a change time (or written at it) everything goes.
    assert set(walk(index, ["root"]).keys) == set(deps)
    assert "new" in walk(FakeIndex(deps, written={"new": 100}), ["root"], changed_at_ms=100).keys


def test_fresh_keys_filling_a_full_answer_declare_the_bound_conservatively() -> None:
    deps = {f"f{i}": ["root"] for i in range(10)} | {"stale": ["root"]}
    index = FakeIndex(deps, written={f"f{i}": 200 for i in range(10)})
    cascade = walk(index, ["root"], most=3, changed_at_ms=100)
    assert cascade.bound == "max_dependants"


def test_max_depth_stops_the_walk_and_says_so() -> None:
    deps = {f"k{i}": [f"k{i - 1}"] for i in range(1, 10)}
    cascade = walk(FakeIndex(deps), ["k0"], depth=3)
    assert cascade == Cascade(("k1", "k2", "k3"), 3, "max_depth")


def test_max_depth_reached_exactly_is_not_truncated() -> None:
    deps = {f"k{i}": [f"k{i - 1}"] for i in range(1, 4)}
    assert walk(FakeIndex(deps), ["k0"], depth=3) == Cascade(("k1", "k2", "k3"), 3, None)


def test_max_depth_probe_that_finds_only_visited_keys_is_not_truncated() -> None:
    # k2 depends on k1 and back on k0's dependant: at depth 2 the probe sees k1 only (visited).
    cascade = walk(FakeIndex({"k1": ["k0", "k2"], "k2": ["k1"]}), ["k0"], depth=2)
    assert cascade == Cascade(("k1", "k2"), 2, None)


def test_a_fan_out_past_max_dependants_is_cut_and_memory_stays_bounded() -> None:
    index = FakeIndex({f"d{i}": ["root"] for i in range(100_000)})
    cascade = walk(index, ["root"], most=500)
    assert len(cascade.keys) == 500 and cascade.bound == "max_dependants"
    # Every answer asked for, and so held, at most room + visited + 1 rows.
    assert max(q.limit for q in index.queries) <= 2 * 500 + 2


def test_exactly_max_dependants_is_complete() -> None:
    cascade = walk(FakeIndex({f"d{i}": ["root"] for i in range(50)}), ["root"], most=50)
    assert len(cascade.keys) == 50 and not cascade.truncated


def test_full_answers_of_visited_keys_do_not_fake_a_bound() -> None:
    # Every level repeats the whole visited set (a dense cycle); the walk still completes exactly.
    keys = [f"k{i}" for i in range(20)]
    deps = {k: ["root", *keys] for k in keys}
    cascade = walk(FakeIndex(deps), ["root"], most=20)
    assert set(cascade.keys) == set(keys) and not cascade.truncated


def test_the_bound_falls_within_a_deeper_level() -> None:
    deps = {"a": ["root"], **{f"b{i}": ["a"] for i in range(10)}}
    cascade = walk(FakeIndex(deps), ["root"], most=5)
    assert cascade.keys[0] == "a" and len(cascade.keys) == 5 and cascade.bound == "max_dependants"


def test_the_protocol_is_strict() -> None:
    w = DependencyWalk(["r"], max_depth=1, max_dependants=1)
    with pytest.raises(RuntimeError):
        w.add([])
    w.next_query()
    with pytest.raises(RuntimeError):
        w.next_query()
    with pytest.raises(ValueError):
        DependencyWalk(["r"], max_depth=0, max_dependants=1)
