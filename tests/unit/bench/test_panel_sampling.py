from bench.panel_sampling import run, zipf_trace


def test_miniatures_are_built_at_the_rate_asked_within_the_floor() -> None:
    trace = zipf_trace(2_000, 6_000, seed=3)
    full, leaders = run(trace, 400, 1, 8)
    sampled, sampled_leaders = run(trace, 400, 10, 8)
    capped, _ = run(trace, 400, 100, 8)
    assert (full["effective_rate"], sampled["effective_rate"], capped["effective_rate"]) == (1, 10, 50)
    assert len(leaders) == len(sampled_leaders) == len(trace)
    assert 0.0 < full["hit_rate"] < 1.0 and 0.0 < sampled["hit_rate"] < 1.0
