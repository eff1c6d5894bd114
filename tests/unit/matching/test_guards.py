import pytest

from matching import guards
from matching.decision import Candidate, MatchDecision, Verdict, floor
from matching.guards import check, instructions
from matching.threshold import ThresholdLearner


@pytest.mark.parametrize(
    ("guard", "a", "b"),
    [
        ("negation", "How do I reset my password?", "How do I not reset my password?"),
        ("negation", "Cancel my subscription", "Don't cancel my subscription"),
        ("negation", "Can I travel with a passport?", "Can I travel without a passport?"),
        ("negation", "Is the drug safe in pregnancy?", "Is the drug unsafe in pregnancy?"),
        ("numbers", "How long to roast a 1kg chicken?", "How long to roast a 2kg chicken?"),
        ("numbers", "Flights on 3 May", "Flights on 5 May"),
        ("numbers", "Is it 5 km away?", "Is it 5 miles away?"),
        ("numbers", "Open on Monday?", "Open on Tuesday?"),
        ("entities", "Is the Soho branch open?", "Is the Shoreditch branch open?"),
        ("entities", "Flights from London to Paris", "Flights from Paris to London"),
        (
            "entities",
            "Transfer £50 from savings to my current account",
            "Transfer £50 from my current account to savings",
        ),
        ("entities", 'What does "foo" return?', 'What does "bar" return?'),
        ("opposites", "Which plan costs more?", "Which plan costs less?"),
        ("opposites", "Should I eat before the test?", "Should I eat after the test?"),
        ("opposites", "What is the maximum dose?", "What is the minimum dose?"),
        ("opposites", "Is the rate higher in winter?", "Is the rate lower in winter?"),
        ("opposites", "Which bands have increased this year?", "Which bands have decreased this year?"),
        ("opposites", "When does it close on weekdays?", "When does it close on weekends?"),
        ("opposites", "Do part-time students pay?", "Do full-time students pay?"),
        ("opposites", "Can I cancel within the trial?", "Can I cancel after the trial?"),
        ("opposites", "Is delivery free on orders over £50?", "Is delivery free on orders under £50?"),
        ("opposites", "Which subjects are optional?", "Which subjects are compulsory?"),
        ("opposites", "How do I opt out of the pension?", "How do I opt in to the pension?"),
        ("opposites", "Why can't I log in?", "Why can't I log out?"),
        (
            "entities",
            "How do I convert a PDF to a Word document?",
            "How do I convert a Word document to PDF?",
        ),
        ("entities", "Translate this from French into English", "Translate this from English into French"),
    ],
)
def test_guard_fires_with_a_reason(guard: str, a: str, b: str) -> None:
    reason = guards.GUARDS[guard](a, b)
    assert reason
    hit = guards.check(b, a)
    assert hit is not None and hit.reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I reset my password?", "What's the way to reset my password?"),
        ("Flights from London to Paris on 3 May", "on 3 may, flights from london to paris"),
        ("Buy 2 apples and 3 pears", "Buy 3 pears and 2 apples"),
        ("Is Python or Rust faster?", "Is Rust or Python faster?"),
        ("How do I use Hugging Face Hub?", "How do I use the huggingface hub?"),
        ("No, it doesn't exist in version 2.10.0.", "Version 2.10.0 does not have it."),
        ("Tasks cover ML projects.", "Tasks cover machine learning projects."),
        ("It takes three days.", "It takes 3 days."),
        ("The method works in two steps.", "The method is a process of several steps."),
        (
            "Users can preview a dataset without downloading it.",
            "You can see a dataset without downloading it.",
        ),
        ("How to reset my password", "Steps to reset my password"),
        ("When does it close on weekends?", "When does it close at the weekend?"),
        ("Is delivery free over £50?", "Is delivery free on orders above £50?"),
        ("How do I convert a PDF to Word?", "What's the way to convert a PDF to a Word file?"),
        ("Send the report to Alice", "Send Alice the report"),
        ("Prices increased", "Prices have been increasing"),
        ("How do I log in?", "How can I sign in to my account?"),
        ("Turn on dark mode", "How do I turn dark mode on?"),
    ],
)
def test_paraphrase_controls_do_not_fire(a: str, b: str) -> None:
    assert guards.check(a, b) is None, guards.check(a, b)


def _decision() -> MatchDecision:
    return MatchDecision(ThresholdLearner(cold_threshold=0.97), lambda: 0.99)


def test_exact_key_serves_and_guards_veto() -> None:
    d = _decision()
    c = Candidate("k", "How do I reset my password?", 0.928)
    assert d.decide("anything", c, request_key="k").served
    vetoed = d.decide("How do I not reset my password?", c)
    assert vetoed.verdict is Verdict.MISS and vetoed.guard == "negation"


def test_tolerances_combine_as_the_stricter_floor() -> None:
    assert floor(None, None) is None
    assert floor(0.9, None) == 0.9
    assert floor(0.8, 0.95) == 0.95
    d = _decision()
    c = Candidate("k", "reset password", 0.98, similarity_tolerance=0.99)
    result = d.decide("password reset", c)
    assert result.verdict is Verdict.MISS and result.threshold == 0.99
    assert d.decide("password reset", Candidate("k", "reset password", 0.98)).served


def test_best_candidate_prefers_a_near_exact_match_in_a_slower_tier() -> None:
    d = _decision()
    fast = Candidate("a", "How can I reset my password?", 0.975, tier=0)
    slow = Candidate("b", "How do I reset my password ?", 0.999, tier=2)
    best = d.best_candidate("How do I reset my password?", [fast, slow])
    assert best.served and best.candidate is slow and best.conclusive
    trap = Candidate("c", "How do I not reset my password?", 0.99, tier=0)
    assert d.best_candidate("How do I reset my password?", [trap]).verdict is Verdict.MISS


def test_a_remembered_analysis_answers_as_a_fresh_one() -> None:
    # The per-text analyses are memoised for short texts; a long one is analysed every time. Either
    # way the verdict is the same, asked once or again, in either order of the pair.
    long_a = "How do I reset my password? " + "Please explain the steps in detail. " * 20
    long_b = long_a.replace("reset", "not reset", 1)
    assert len(long_a) > guards._MEMO_CHARS
    pairs = [
        ("How do I reset my password?", "How do I not reset my password?", "negation"),
        ("Flights from London to Paris", "Flights from Paris to London", "entities"),
        ("How long to roast a 1kg chicken?", "How long to roast a 2kg chicken?", "numbers"),
        ("Is the drug safe in pregnancy?", "Is the drug unsafe in pregnancy?", "negation"),
        (long_a, long_b, "negation"),
        ("How do I reset my password?", "How can I reset my password?", None),
    ]
    for a, b, fired in pairs:
        for _ in range(3):
            for x, y in ((a, b), (b, a)):
                hit = guards.check(x, y)
                assert (hit.guard if hit else None) == fired, (x[:40], y[:40])


def test_each_decision_names_its_rule() -> None:
    d = _decision()
    c = Candidate("k", "How do I reset my password?", 0.98)
    assert d.decide("", c, request_key="k").rule == "exact"
    assert d.decide("", c).rule == "threshold"  # served at or above it
    assert d.decide("", Candidate("k", "", 0.90)).rule == "threshold"  # refused below it
    assert d.decide("", Candidate("k", "", 0.98, similarity_tolerance=0.99)).rule == "floor"
    assert d.decide("How do I not reset my password?", c).rule.startswith("guard:")
    assert d.best_candidate("q", []).rule == "no candidate"


def test_instructions_about_the_answers_form_are_part_of_the_question() -> None:
    """Language, format, length and manner: the same question asked for another form of answer."""
    fires = [
        ("What is the capital of France?", "What is the capital of France? Answer in French."),
        ("Explain TCP.", "Explain TCP as a bulleted list."),
        ("Summarise the article.", "Summarise the article in 3 sentences."),
        ("Translate hello into German.", "Translate hello into French."),
        ("Write a poem about rain.", "Write a haiku about rain, in Spanish."),
        ("How does DNS work?", "How does DNS work? Explain like I'm five."),
        ("List the planets.", "List the planets in JSON."),
        ("How do vaccines work?", "How do vaccines work? Explain step by step."),
    ]
    for cached, request in fires:
        hit = check(cached, request)
        assert hit is not None, (cached, request)
        assert instructions(cached, request) is not None, (cached, request)
    passes = [
        ("How do I learn French?", "How can I learn French?"),  # the topic, not the answer's language
        ("Is it in the list?", "Is it on the list?"),
        ("Answer in French: what is a cat?", "In French, what is a cat? Answer in French."),
        ("What is a short position?", "What does a short position mean?"),
    ]
    for cached, request in passes:
        assert instructions(cached, request) is None, (cached, request)
