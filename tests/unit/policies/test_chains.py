"""The learned re-use term of prefix chains (`chains.ChainReuse`) and heat's use of it."""

from __future__ import annotations

import random

from policies import AccessMeta
from policies.learned.chains import ChainReuse
from policies.learned.heat import HeatPolicy


def _conversations(reuse: ChainReuse, turns: int, tails_return: bool) -> None:
    """A shared system prompt (block "s"), then per request one new block; the request's last block
    ("tail") is extended by nobody, and comes back (asked again at once) only if `tails_return`."""
    tick = 0

    def hear(key: str, parent: str | None) -> None:
        nonlocal tick
        tick += 1
        reuse.heard(key, tick)
        if parent is not None:
            reuse.extended(parent)

    for t in range(turns):
        hear("s", None)
        hear(f"tail{t}", "s")
        if tails_return:
            hear(f"tail{t}", "s")


def test_it_learns_that_blocks_never_extended_do_not_come_back() -> None:
    reuse = ChainReuse(horizon=50, sample=1)
    _conversations(reuse, 2_000, tails_return=False)
    assert reuse.probability(extended=False) < 0.05
    assert reuse.probability(extended=True) > 0.95
    assert reuse.bonus(False) < reuse.bonus(True) <= 0.0


def test_it_follows_traffic_whose_tails_start_coming_back() -> None:
    reuse = ChainReuse(horizon=50, sample=1, halve_every=200)
    _conversations(reuse, 1_000, tails_return=False)
    assert reuse.probability(False) < 0.05
    _conversations(reuse, 1_000, tails_return=True)
    # Now each tail is read twice and the first read comes back: half of the tail reads are re-used.
    assert 0.4 < reuse.probability(False) < 0.6


def test_pending_labels_stay_within_the_horizon_sample() -> None:
    reuse = ChainReuse(horizon=64, sample=8)
    for tick in range(1, 10_000):
        reuse.heard(tick, tick)  # every key new: nothing ever comes back
    assert len(reuse) <= 64 // 8 + 1
    assert reuse.probability(False) < 0.05  # counts halve every 3 horizons: ~50 labels in view


def _multi_turn(seed: int, conversations: int = 40, turns: int = 600) -> list[tuple[str, str | None]]:
    """(block, parent) accesses of multi-turn chats: each turn re-reads its conversation's full blocks
    and adds one, then ends in a partial block that no later turn reads (it is re-written in full)."""
    rng = random.Random(seed)
    length = [0] * conversations
    out: list[tuple[str, str | None]] = []
    for turn in range(turns):
        c = rng.randrange(conversations)
        parent = None
        length[c] += 1
        for k in range(length[c]):
            out.append((f"c{c}b{k}", parent))
            parent = f"c{c}b{k}"
        out.append((f"c{c}tail{turn}", parent))
    return out


def _hit_rate(policy: HeatPolicy, accesses: list[tuple[str, str | None]]) -> float:
    hits = 0
    for i, (key, parent) in enumerate(accesses):
        hit, _ = policy.access(key, i, meta=AccessMeta(parent=parent))
        hits += hit
    return hits / len(accesses)


def test_heat_learns_to_evict_tails_first_on_multi_turn_chats() -> None:
    accesses = _multi_turn(seed=1)
    learned = HeatPolicy(200)
    fixed = HeatPolicy(200, chain_reuse=False)
    with_model, without = _hit_rate(learned, accesses), _hit_rate(fixed, accesses)
    assert learned.chain_reuse is not None and fixed.chain_reuse is None
    assert learned.chain_reuse.probability(False) < 0.2
    assert with_model > without + 0.005  # measured 0.409 against 0.401


def test_the_prior_scorer_has_no_chain_model() -> None:
    assert HeatPolicy(16, scorer="prior").chain_reuse is None
    assert HeatPolicy(16).chain_reuse is not None
