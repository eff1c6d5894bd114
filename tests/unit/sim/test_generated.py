"""Mixed prefix traffic (`sim/generated.py`): its three kinds of request in the shares asked for."""

from __future__ import annotations

from itertools import pairwise

from sim.generated import mixed_prefix_trace
from sim.traces import Trace


def _requests(trace: Trace) -> list[list[int]]:
    bounds = trace.starts.tolist()
    keys = trace.keys.tolist()
    return [keys[a:b] for a, b in pairwise(bounds)]


def test_the_same_seed_gives_the_same_trace() -> None:
    a, b = mixed_prefix_trace(3, 500), mixed_prefix_trace(3, 500)
    assert a.keys.tolist() == b.keys.tolist() and a.prefix


def test_hot_prompts_conversations_and_documents_in_their_shares() -> None:
    requests = _requests(mixed_prefix_trace(0, 4000, single_share=0.5, conversation_share=0.3))
    singles = [r for r in requests if len(r) == 1 and r[0] <= 300]
    documents = [r for r in requests if len(r) == 40 and r == list(range(r[0], r[0] + 40))]
    assert abs(len(singles) / 4000 - 0.5) < 0.04
    assert abs(len(documents) / 4000 - 0.2) < 0.04
    seen: set[int] = set()
    for doc in documents:
        assert not seen & set(doc), "a document is read once"
        seen |= set(doc)


def test_a_conversation_turn_re_reads_its_history_and_adds_to_it() -> None:
    requests = _requests(mixed_prefix_trace(1, 3000, single_share=0.0, conversation_share=1.0))
    by_root: dict[int, list[list[int]]] = {}
    for r in requests:
        by_root.setdefault(r[0], []).append(r)
    grown = 0
    for turns in by_root.values():
        for before, after in pairwise(turns):
            assert after[: len(before)] == before
            assert 1 <= len(after) - len(before) <= 4
            grown += 1
    assert grown > 1000
