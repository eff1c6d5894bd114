"""KV-aware routing (services/gateway/routing.py): the instance holding the longest prefix wins, the tiers'
blocks count for less than an instance's own, load takes blocks off, a conversation stays unless another
instance is clearly better, unhealthy instances are never chosen, and each choice says why."""

from __future__ import annotations

from services.gateway.routing import Instance, Weights, choose

KEYS = [f"kv:{i}" for i in range(10)]


def holding(name: str, n: int, **kw: object) -> Instance:
    inst = Instance(name, **kw)  # type: ignore[arg-type]
    for key in KEYS[:n]:
        inst.stored(key)
    return inst


def test_the_longest_prefix_wins_and_says_so() -> None:
    choice = choose([holding("a", 2), holding("b", 6), holding("c", 0)], KEYS, tiers_held=0)
    assert choice is not None
    assert (choice.instance, choice.reason, choice.held_blocks, choice.predicted_blocks) == (
        "b",
        "prefix",
        6,
        6,
    )


def test_a_prefix_is_leading_blocks_only() -> None:
    a = Instance("a")
    for key in KEYS[1:]:  # everything but the first block: of no use
        a.stored(key)
    assert a.prefix(KEYS) == 0
    assert choose([a, holding("b", 1)], KEYS, tiers_held=0).instance == "b"  # type: ignore[union-attr]


def test_blocks_in_the_tiers_count_for_less_than_held_ones() -> None:
    # a holds 5; b holds 4 and the tiers hold 8 (b would load 4 more): 4 + 0.8 * 4 = 7.2 > 5 + 0.8 * 3
    choice = choose([holding("a", 5), holding("b", 4)], KEYS, tiers_held=8)
    assert choice is not None and choice.instance == "a" and choice.predicted_blocks == 8
    # with nothing held anywhere, the tiers make every instance equal: load decides
    choice = choose([holding("a", 0, pending_blocks=2.0), holding("b", 0)], KEYS, tiers_held=8)
    assert choice is not None and (choice.instance, choice.reason) == ("b", "load")


def test_load_takes_blocks_off() -> None:
    # The blocks the instance is still computing for requests sent to it: a request waits for them.
    busy = holding("a", 6, in_flight=1, pending_blocks=8.0)  # 6 - 8 = -2
    idle = holding("b", 1)  # 1
    choice = choose([busy, idle], KEYS, tiers_held=0)
    assert choice is not None and choice.instance == "b"
    busy.pending_blocks = 3.0  # a cached request ahead of it costs little: 6 - 3 = 3 > 1
    assert choose([busy, idle], KEYS, tiers_held=0).instance == "a"  # type: ignore[union-attr]
    # Requests in the engine's queue that this gateway did not send count `load_cost` blocks each.
    queued = holding("c", 6, waiting=2)
    assert choose([queued, idle], KEYS, tiers_held=0).instance == "b"  # type: ignore[union-attr]
    light = Weights(load_cost=1.0)
    assert choose([queued, idle], KEYS, tiers_held=0, weights=light).instance == "c"  # type: ignore[union-attr]


def test_a_conversation_stays_unless_another_is_clearly_better() -> None:
    a, b = holding("a", 3), holding("b", 5)
    choice = choose([a, b], KEYS, tiers_held=0, sticky="a")
    assert choice is not None and (choice.instance, choice.reason) == ("a", "affinity")
    b.waiting = 0
    for key in KEYS:
        b.stored(key)
    a.pending_blocks = 12.0  # 3 - 12 = -9 against b's 10: moved
    assert choose([a, b], KEYS, tiers_held=0, sticky="a").instance == "b"  # type: ignore[union-attr]


def test_unhealthy_instances_are_never_chosen() -> None:
    a = holding("a", 9, healthy=False)
    choice = choose([a, holding("b", 0)], KEYS, tiers_held=0, sticky="a")
    assert choice is not None and (choice.instance, choice.reason) == ("b", "only")
    assert choose([a], KEYS, tiers_held=0) is None


def test_removals_and_clears_and_a_bounded_memory() -> None:
    a = holding("a", 4, capacity_blocks=3)  # the oldest block forgotten first
    assert a.prefix(KEYS) == 0 and len(a.blocks) == 3
    b = holding("b", 4)
    b.removed(KEYS[2])
    assert b.prefix(KEYS) == 2
    b.cleared()
    assert b.prefix(KEYS) == 0


def test_new_conversations_spread_over_the_pools() -> None:
    # Nothing held anywhere and nothing in flight: every score is 0. The instance that has written fewer
    # blocks into its pool takes the new conversation, so working sets do not pile into the first pool.
    a, b = Instance("a", written_blocks=40), Instance("b", written_blocks=10)
    choice = choose([a, b], KEYS, tiers_held=0)
    assert choice is not None and (choice.instance, choice.reason) == ("b", "load")
    b.written_blocks = 50
    assert choose([a, b], KEYS, tiers_held=4).instance == "a"  # type: ignore[union-attr]
    # load still comes first: a request in flight outweighs a lighter pool
    a.in_flight = 1
    assert choose([a, b], KEYS, tiers_held=0).instance == "b"  # type: ignore[union-attr]
