"""δ per model: the table's precedence, its checks, separate learners per group in the decision, the
node's setting and its wiring into the matcher."""

import random

import pytest

from matching.decision import Candidate, MatchDecision
from matching.deltas import DeltaTable
from matching.threshold import EntryThreshold, ThresholdLearner
from services.tiers.entry import EntryMeta
from services.tiers.node.matcher import Matcher
from services.tiers.settings import TiersSettings


@pytest.mark.parametrize(
    ("group", "delta"),
    [("gpt-4o", 0.01), ("support-bot", 0.05), ("support-bot-eu", 0.03), ("llama", 0.02), ("", 0.02)],
)
def test_exact_name_then_the_longest_pattern_then_the_default(group: str, delta: float) -> None:
    table = DeltaTable({"gpt-4o": 0.01, "support-*": 0.05, "support-bot-eu*": 0.03})
    assert table.delta_for(group, 0.02) == delta


@pytest.mark.parametrize("bad", [{"m": 0.0}, {"m": 0.5}, {"*": 0.01}, {"": 0.01}])
def test_a_bad_table_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="δ"):
        DeltaTable(bad)


def test_each_listed_model_learns_at_its_own_delta() -> None:
    decision = MatchDecision(
        ThresholdLearner(delta=0.02), random.Random(0).random, deltas=DeltaTable({"strict": 0.01})
    )
    assert decision.learner_for("strict").delta == 0.01
    assert decision.learner_for("strict") is decision.learner_for("strict")
    assert decision.learner_for("other") is decision.learner and decision.learner_for("") is decision.learner
    entry = EntryThreshold()
    decision.feedback(Candidate("k", "q", 0.9, state=entry, group="strict"), False, explored=True)
    assert decision.learner_for("strict").pool_sims == [0.9] and decision.learner.pool_sims == []
    # Their pools differ, so a learned threshold of one never moves the other's.
    for _ in range(200):
        decision.feedback(Candidate("k2", "q", 0.95, state=EntryThreshold()), True, explored=True)
    assert decision.learner.thresholds(None)[0] < 1.0
    assert decision.learner_for("strict").cold


def test_the_setting_reaches_the_matcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_DELTA", "0.05")
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_DELTA_BY", '{"gpt-4o": 0.01, "support-*": 0.1}')
    s = TiersSettings()
    assert s.match_delta_by == {"gpt-4o": 0.01, "support-*": 0.1}
    matcher = Matcher(delta=s.match_delta, deltas=dict(s.match_delta_by))
    meta = EntryMeta(key="k", kind="prompt", model="gpt-4o", embedding=None)
    assert matcher.candidate(meta, 0.9, "l1").group == "gpt-4o"
    assert matcher.decision.learner_for("gpt-4o").delta == 0.01
    assert matcher.decision.learner_for("support-bot").delta == 0.1
    assert matcher.decision.learner_for("llama").delta == 0.05
    monkeypatch.setenv("CACHEMESH_TIERS_MATCH_DELTA_BY", '{"gpt-4o": 0.7}')
    with pytest.raises(ValueError):
        TiersSettings()
