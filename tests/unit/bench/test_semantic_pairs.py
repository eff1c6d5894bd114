"""bench/semantic_pairs.py's scoring: which served answer is correct, the Wilson bound, the input check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from bench.semantic_pairs import correct_answer, hindsight, read_pairs, wilson_upper


def test_a_served_answer_is_correct_only_for_a_duplicate_and_its_own_or_an_identical_question() -> None:
    pairs = [("How do I cook rice?", "How to cook rice?", 1), ("How do I cook rice? ", "Cooking rice?", 1),
             ("What is DNS?", "What is a DNS server?", 0)]  # fmt: skip
    assert correct_answer(pairs, 0, 0)
    assert correct_answer(pairs, 0, 1)  # another pair's `a`, the same text
    assert not correct_answer(pairs, 2, 2)  # not a duplicate: serving its own `a` is wrong
    assert not correct_answer(pairs, 0, 2)


def test_the_answer_cached_for_the_very_text_asked_is_correct_whatever_the_pair_says() -> None:
    # The public sets reuse sentences: pair 1 asks pair 0's `a` word for word.
    pairs = [("What is DNS?", "What is a DNS server?", 0), ("How do I cook rice?", "what is  DNS?", 0)]
    assert correct_answer(pairs, 1, 0)
    assert not correct_answer(pairs, 0, 1)


def test_the_wilson_bound_is_above_the_rate_and_narrows_with_more_answers() -> None:
    assert wilson_upper(0, 0) is None
    few, many = wilson_upper(1, 50), wilson_upper(20, 1000)
    assert few is not None and many is not None
    assert few > 0.02 and 0.02 < many < few
    assert wilson_upper(0, 100) == pytest.approx(0.037, abs=0.001)


def test_pairs_are_sampled_reproducibly_and_a_bad_line_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text(
        "".join(json.dumps({"a": f"q{i}", "b": f"r{i}", "label": i % 2}) + "\n" for i in range(50))
    )
    assert read_pairs(good, 10, 0) == read_pairs(good, 10, 0) and len(read_pairs(good, 10, 0)) == 10
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"a": "x", "b": "y", "label": 3.5}) + "\n")
    with pytest.raises(typer.BadParameter, match="label 0 or 1"):
        read_pairs(bad, 10, 0)


def test_the_bounded_ceiling_needs_enough_answers_to_show_its_bound() -> None:
    # 100 duplicates answered right at 0.99, then one wrong answer per 50 right ones down to 0.80.
    best = [(0.99, True, True)] * 100 + [(0.90, False, False)] + [(0.90, True, True)] * 50
    best += [(0.80, False, False)] * 40 + [(0.80, True, True)] * 10
    ceiling = hindsight(best, positives=200)
    top, bounded = ceiling[0.05]
    assert top == pytest.approx(0.75)  # 0.90: 1 wrong of 151 served is <= 5%
    assert bounded == pytest.approx(0.75)  # and its 95% bound (3.6%) too
    top, bounded = ceiling[0.01]
    assert top == pytest.approx(0.75)  # 1 of 151 is 0.66%
    assert bounded == 0.0  # 100 right answers alone bound wrong at 3.7%, above 1%
