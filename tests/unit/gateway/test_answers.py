"""The answer-equivalence check behind exploration labels (services/gateway/answers.py): the same words
agree whatever the punctuation and case; a small rewording agrees; other numbers or other content do not."""

from __future__ import annotations

from services.gateway.answers import answer_text, answers_agree


def test_the_same_words_agree_whatever_the_punctuation_and_case() -> None:
    assert answers_agree("Paris.", "paris")
    assert answers_agree("The capital of France is Paris!", "the capital of france is paris")


def test_a_small_rewording_agrees_but_other_numbers_or_content_do_not() -> None:
    assert answers_agree(
        "Open Settings, choose Account and press Reset password.",
        "Open Settings, choose Account, then press Reset password.",
    )
    assert not answers_agree("It costs $20M in total.", "It costs $10M in total.")
    assert not answers_agree("The capital of France is Paris.", "La capitale de la France est Paris.")
    assert not answers_agree("Yes.", "No.")
    assert not answers_agree("", "Paris")


def test_the_text_of_chat_and_completion_answers() -> None:
    assert answer_text({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}) == "hi"
    assert answer_text({"choices": [{"text": "hello"}]}) == "hello"
    assert answer_text({"choices": []}) is None
    assert answer_text({"choices": [{"message": {"tool_calls": []}}]}) is None
