from bench.chain_half_life import heat_hits, measure
from bench.chain_reuse import conversations
from sim.generated import mixed_prefix_trace


def test_a_cell_compares_each_half_life_with_the_best_baseline_and_says_what_a_miniature_picks() -> None:
    trace = mixed_prefix_trace(1, 1_500, single_share=0.3)
    cell = measure(trace, "mixed", 600, [1.0, 3.0, 30.0], 4)
    assert set(cell.heat) == {"1", "3", "30"} and all(0.0 <= v <= 100.0 for v in cell.heat.values())
    assert cell.mini_pick in (1.0, 3.0, 30.0) and cell.heat[f"{cell.hindsight:g}"] == max(cell.heat.values())
    assert 0.0 <= cell.ships <= 100.0 and cell.ships_half_life in (3.0, 10.0, 30.0)
    assert (
        cell.best_policy in ("lru", "arc", "lirs", "wtinylfu", "s3fifo", "sieve") and 0.0 < cell.best < 100.0
    )
    # The half-life is the core's: another one decides differently somewhere.
    generated = conversations(4_000, 0.9, 0.5, seed=2)
    assert len({round(heat_hits(generated, 300, h), 6) for h in (0.3, 3.0, 30.0)}) > 1
