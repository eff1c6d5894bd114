"""The compiled panel (`cachemesh_heatcore.Panel`, `panel_core.CompiledPanel`) against the Python one:
every expert alone, the panel as the heat policy runs it (miniatures, the frame on the prior and then on
a model, challengers followed), and the heat policy itself, decision for decision on int keys."""

from __future__ import annotations

import numpy as np
import pytest
from cachemesh_heatcore import Panel

from policies.adaptive.wtinylfu import WTinyLFU
from policies.admission.sketch import FrequencySketch
from policies.learned.compiled import CompiledHeat
from policies.learned.frame import HeatFrame, prior_heat
from policies.learned.heat import HeatPolicy
from policies.learned.panel import EXPERTS, FACTORIES, ExpertPanel
from policies.learned.panel_core import LAYOUT, CompiledPanel


def phased(n: int, distinct: int, seed: int) -> list[int]:
    """Zipf phases and scan phases in turn (7,000 accesses each): the experts disagree, leads change."""
    rng = np.random.default_rng(seed)
    zipf = rng.zipf(1.1, n) % distinct
    scan = np.arange(n) % (3 * distinct) + distinct
    zipf_phase = (np.arange(n) // 7000) % 2 == 0
    pick = np.where(zipf_phase, rng.random(n) < 0.9, rng.random(n) < 0.3)
    return np.where(pick, zipf, scan).astype(np.int64).tolist()


@pytest.mark.parametrize("name", ["lru", "arc", "lirs", "s3fifo", "s3fifo-lcs", "sieve", "wtinylfu"])
@pytest.mark.parametrize("capacity", [1, 2, 7, 300])
def test_each_expert_evicts_what_the_python_one_evicts(name: str, capacity: int) -> None:
    python, compiled = FACTORIES[name](capacity, 3), Panel(capacity, [name], seed=3)
    evictions = 0
    for t, key in enumerate(phased(12_000, 5 * capacity, seed=capacity)):
        if key in python:
            python.on_hit(key, t)
            want: list[int] = []
        else:
            want = [int(e.key) for e in python.on_miss(key, t)]  # type: ignore[call-overload]
        assert compiled.access(key) == want, (t, key)
        assert compiled.driver_len() == len(python)
        evictions += len(want)
    assert evictions > 1000


def _heat_model(x: np.ndarray) -> np.ndarray:
    """A stand-in for the owner's model: any fixed function of the rows."""
    return (0.3 * x[:, 0] - x[:, 2] + 0.1 * x[:, 1] - 0.05 * x[:, 3]).astype(np.float32)


@pytest.mark.parametrize(
    ("capacity", "sample", "seed"), [(50, 1, 0), (400, 4, 1), (2000, 4, 2), (2000, 10, 5)]
)
def test_the_panel_decides_as_the_python_panel(capacity: int, sample: int, seed: int) -> None:
    names = [*EXPERTS, "heat-frame"]
    sketch = FrequencySketch(capacity, seed=seed)
    heat = {"now": prior_heat}
    python = ExpertPanel(
        capacity,
        names,
        sketched={
            "wtinylfu": lambda c, s: WTinyLFU(c, seed=seed, sketch=s),
            "heat-frame": lambda c, s: HeatFrame(c, s, lambda x: heat["now"](x), seed=seed),
        },
        sketch=sketch,
        seed=seed,
        sample=sample,
    )
    compiled = Panel(
        capacity, names, seed=seed, sample=python.sample, sketched=True, sketch_seed=seed, layout=LAYOUT
    )
    keys = phased(30_000, 4 * capacity, seed)
    for t, key in enumerate(keys):
        if t == 12_000:  # the owner's model starts scoring: the frames forget the prior's heat
            heat["now"] = _heat_model
            compiled.set_heat(_heat_model)
            python.invalidate()
            compiled.invalidate()
        sketch.increment(key)
        assert compiled.access(key) == python.access(key, t), (t, key)
        assert (compiled.contested, compiled.leader) == (python.contested, python.leader)
        if python.contested and (found := python.challengers()):
            got = compiled.challengers()
            assert [i for i, _ in got] == [i for i, _ in found]
            assert [lead for _, lead in got] == pytest.approx([lead for _, lead in found])
            best = found[0][0]
            resident = [k for k in dict.fromkeys(keys[max(0, t - capacity) : t + 1]) if k in python.driver]
            assert compiled.missing(best, resident) == python.missing(best, resident)
            python.follow(best, resident, t)
            compiled.follow(best, resident)
    assert compiled.hits == python.hits
    assert compiled.switches == python.switches
    for h in range(2):
        assert compiled.lead(1, 0, h) == pytest.approx(python.lead(1, 0, h))


@pytest.mark.parametrize("capacity", [64, 800])
def test_the_heat_policy_with_the_compiled_panel_is_the_reference(capacity: int) -> None:
    reference, ours = HeatPolicy(capacity), HeatPolicy(capacity, compiled_panel=True)
    assert isinstance(ours.panel, CompiledPanel)
    for t, key in enumerate(phased(30_000, 4 * capacity, seed=capacity)):
        assert ours.access(key, t) == reference.access(key, t), (t, key)
    assert ours.leader == reference.leader
    assert ours._model_heat, "the model scored the frame's entries before the end"


def test_the_service_s_policy_runs_the_compiled_panel_until_chains_begin() -> None:
    policy = CompiledHeat(100)
    assert isinstance(policy.reference.panel, CompiledPanel)
    assert HeatPolicy(100, compiled_panel=True, experts=("lru", "lfu")).panel.__class__ is ExpertPanel


def test_keys_that_are_not_ints_cross_as_their_digest_and_come_back_as_themselves() -> None:
    policy = HeatPolicy(50, compiled_panel=True)
    held: set[str] = set()
    for t, i in enumerate(phased(5_000, 200, seed=9)):
        key = f"entry-{i}"
        hit, evicted = policy.access(key, t)
        assert hit == (key in held)
        held.add(key)
        for e in evicted:
            assert isinstance(e.key, str)
            held.discard(e.key)
        assert len(held) == len(policy) <= 50
    assert isinstance(policy.panel, CompiledPanel)
    assert len(policy.panel.digests) == len(policy)


def test_the_missing_count_takes_any_keys() -> None:
    panel = CompiledPanel(8, ["lru", "arc"])
    for key in ("a", "b", 3, -1, 2**70):
        panel.access(key, 0)
    assert panel.missing(0, ["a", "b", 3, -1, 2**70]) == 0.0  # an 8-entry LRU holds them all
    assert panel.missing(0, ["c", 4, "a"]) == 2.0
    assert panel.missing(0, [3, 4]) == 1.0


def test_a_panel_it_cannot_build_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="mru"):
        Panel(8, ["lru", "mru"])
    with pytest.raises(ValueError, match="sketch"):
        Panel(8, ["heat-frame"])
    with pytest.raises(ValueError, match="1 to 16"):
        Panel(8, [])
    with pytest.raises(ValueError, match="not compiled"):
        CompiledPanel(8, ["lfu"])
    panel = Panel(8, ["lru", "arc"])
    for ask in (lambda: panel.lead(0, 2), lambda: panel.lead(0, 1, 2), lambda: panel.missing(2, [1])):
        with pytest.raises(ValueError, match="no "):
            ask()
    with pytest.raises(ValueError, match="no expert"):
        panel.follow(5, [])
