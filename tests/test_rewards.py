"""The double-constrained reward: hand-computed cases for both presets, bands, and TRL's signature.

Transcripts are written the way the reference release scores rollouts: assistant turns in
`<|im_start|>assistant\\n…<|im_end|>` blocks, environment responses in user turns between them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prompt_r1.core.errors import ConfigError
from prompt_r1.scoring.rewards import get_preset, score_episode, score_transcript, score_turns, trl_reward

P = "<think>t</think><interaction_prompt>p</interaction_prompt>"
A = "<think>f</think><answer>Paris</answer>"
RESPONSE = "\n<|im_start|>user\n<interaction_response>r</interaction_response><|im_end|>\n"


def transcript(*turns: str) -> str:
    head = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nQuestion: Q<|im_end|>\n"
    return head + RESPONSE.join(f"<|im_start|>assistant\n{t}<|im_end|>" for t in turns)


def ref(*turns, gold=("Paris",)):
    return score_transcript(transcript(*turns), list(gold), preset="reference")


def paper(*turns, gold=("Paris",)):
    return score_transcript(transcript(*turns), list(gold), preset="paper")


# -- reference preset: 0.4 per intermediate turn, 0.25 + 0.25 + 0.1 for the final turn, cap and gate 1.0 --------


@pytest.mark.parametrize(
    ("turns", "fmt", "total"),
    [
        ((A,), 0.6, -0.4),  # no intermediate turn: the gate is never reached
        ((P, A), 1.0, 1.0),  # one: 0.4 + 0.6 = 1.0, the answer counts
        ((P, P, A), 1.0, 1.0),  # two: 1.4 capped at 1.0
        ((P,) * 5 + (A,), 1.0, 1.0),  # five
        ((P, "<think>f</think><answer> </answer>"), 0.4, -0.6),  # blank answer earns nothing
        ((P, "Paris"), 0.4, -0.6),  # missing tags
        ((P, A + " extra"), 0.9, -0.1),  # text after the answer: not complete
        ((P, A + "\n"), 1.0, 1.0),  # one trailing newline still ends the turn (`$` semantics)
        ((P, "<think>f</think>so<answer>Paris</answer>"), 1.0, 1.0),  # anything between think and answer
        ((P, "<answer>Paris</answer>"), 0.9, -0.1),  # no think in the final turn
        (("<think></think><interaction_prompt></interaction_prompt>", A), 1.0, 1.0),  # empty contents pass
        (("<think>t</think>\n\n<interaction_prompt>p</interaction_prompt>", A), 1.0, 1.0),
        ((" " + P, A), 0.6, -0.4),  # the turn must start with <think>
        (("<think>a<think>b</think><interaction_prompt>p</interaction_prompt>", A), 0.6, -0.4),  # nested
        (
            (
                "<think>a</think><interaction_prompt>p</interaction_prompt><interaction_prompt>q</interaction_prompt>",
                A,
            ),
            0.6,
            -0.4,
        ),
        ((P, P, P), 0.8, -0.2),  # the last turn is the final one: two intermediates, no answer
        ((P,) * 4, 1.0, 0.0),  # three intermediates and no answer reach the cap: the release's total is 0
        ((P, P), 0.4, -0.6),
    ],
)
def test_reference_format_terms(turns, fmt, total):
    score = ref(*turns)
    assert score.format_reward == pytest.approx(fmt)
    assert score.total == pytest.approx(total)
    assert score.gated == (fmt == 1.0)


def test_reference_answer_reward_is_first_answer_f1():
    assert ref(P, "<think>f</think><answer>Paris France</answer>").total == pytest.approx(2 / 3)
    assert ref(P, A, gold=("London", "paris")).total == 1.0
    # The first <answer> is the one scored, and the turn then no longer ends at its own answer.
    score = ref(P, "<think>f</think><answer>Rome</answer><answer>Paris</answer>")
    assert (score.answer, score.answer_reward, score.complete) == ("Rome", 0.0, True)
    # An answer that normalises to nothing scores 0 in the release even against an equally empty golden answer.
    assert ref(P, "<think>f</think><answer>The</answer>", gold=("a",)).total == 0.0


def test_reference_reads_only_complete_assistant_blocks():
    assert score_transcript("", ["Paris"], preset="reference").total == -1.0
    cut = transcript(P) + RESPONSE + "<|im_start|>assistant\n" + A  # the last turn never closed
    assert score_transcript(cut, ["Paris"], preset="reference").total == pytest.approx(-1.0)


# -- paper preset: α=0.25, β=0.3, γ=0.4, δ=0.3, ε=1.5 ----------------------------------------------------------


@pytest.mark.parametrize(
    ("turns", "fmt", "total"),
    [
        ((A,), 1.0, -0.5),
        ((P, A), 1.25, -0.25),
        ((P, P, A), 1.5, 1.0),  # two well-formed prompts reach ε: −1.5 + 1.5 + F1 1.0
        ((P,) * 5 + (A,), 1.5, 1.0),  # 2.25 capped
        (
            ("<think> </think><interaction_prompt>p</interaction_prompt>", P, A),
            1.25,
            -0.25,
        ),  # empty think: M_t = 0
        ((P, P, "<think>f</think><answer> </answer>"), 0.8, -0.7),  # parses (β) but blank: no γ, no δ
        ((P, P, "Paris"), 0.5, -1.0),  # final turn without tags
        ((P, P, A + " extra"), 1.2, -0.3),  # not complete: no δ
        ((P, P, "<answer>Paris</answer>"), 1.2, -0.3),  # no think: no δ
        ((P, P, "<think>f</think>so<answer>Paris</answer>"), 1.2, -0.3),  # stray text between: no δ
        # a nested tag is a defect: M_t = 0
        (
            ("<think>a</think><interaction_prompt>p<interaction_prompt>q</interaction_prompt>", P, A),
            1.25,
            -0.25,
        ),
        # anything after the first </interaction_prompt> is cut as a stop sequence would cut it: M_t = 1
        ((P + "<interaction_prompt>q</interaction_prompt>", P, A), 1.5, 1.0),
        ((P, P, P), 0.5, -1.0),  # no answer at all
    ],
)
def test_paper_format_terms(turns, fmt, total):
    score = paper(*turns)
    assert score.format_reward == pytest.approx(fmt)
    assert score.total == pytest.approx(total)


def test_paper_answer_reward_and_empty_episode():
    assert paper(P, P, "<think>f</think><answer>Paris France</answer>").total == pytest.approx(2 / 3)
    assert (
        paper(P, P, "<think>f</think><answer>The</answer>", gold=("a",)).total == 1.0
    )  # both normalise to ""
    assert score_turns([], ["Paris"]).total == -1.5
    tool_call = '<think>t</think><interaction_prompt>{"name": "prompt", "arguments": {"prompt": "p"}}</interaction_prompt>'
    assert paper(tool_call, P, A).total == 1.0  # the release's JSON prompt form is a prompt


def test_paper_complete_means_nothing_after_the_first_answer():
    score = paper(P, P, "<think>f</think><answer>Paris</answer><answer>Rome</answer>")
    assert (score.complete, score.answer, score.total) == (False, "Paris", pytest.approx(-0.3))


def test_coefficients_settable_one_by_one():
    assert score_turns([P, A], ["Paris"], "paper", epsilon=1.25).total == 1.0  # 0.25 + 1.0 reaches 1.25
    assert score_turns([A], ["Paris"], "reference", alpha=0.0, epsilon=0.6).total == 1.0
    assert get_preset("paper", beta=0.5).beta == 0.5
    with pytest.raises(ConfigError, match="unknown reward coefficient"):
        get_preset("paper", zeta=1.0)
    with pytest.raises(ConfigError, match="unknown reward preset"):
        get_preset("nope")
    with pytest.raises(ConfigError, match="finite number"):
        get_preset("paper", alpha=float("nan"))


def test_score_episode_reads_graph_turn_records():
    episode = {"golden_answers": ["Paris"], "turns": [{"text": P}, {"text": P}, {"text": A}]}
    assert score_episode(episode).total == 1.0
    assert score_episode(episode, preset="reference").total == 1.0
    assert score_episode(episode, ["Rome"]).total == 0.0
    with pytest.raises(ValueError, match="no golden_answers"):
        score_episode({"turns": []})


PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<interaction_prompt>", "</interaction_prompt>"]
TURN = st.one_of(
    st.just(P),
    st.just(A),
    st.just("<think>f</think><answer></answer>"),
    st.lists(st.sampled_from([*PIECES, "Paris", " ", "\n", "the"]), max_size=12).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(
    turns=st.lists(TURN, max_size=7),
    preset=st.sampled_from(["paper", "reference"]),
    gold=st.sampled_from([["Paris"], ["Paris France", "x"], ["the"]]),
)
def test_total_stays_within_its_bands(turns, preset, gold):
    score = score_turns(turns, gold, preset)
    eps = get_preset(preset).epsilon
    assert 0.0 <= score.format_reward <= eps
    assert 0.0 <= score.answer_reward <= 1.0
    if score.gated:
        assert score.total == pytest.approx(score.answer_reward)  # −ε + ε + R_ans
        assert 0.0 <= score.total <= 1.0
    else:
        assert -eps <= score.total < 0.0
        assert score.total == pytest.approx(-eps + score.format_reward)


# -- TRL's reward-function signature -----------------------------------------------------------------------------


def test_trl_reward_scores_completions_and_skips_infrastructure_failures():
    total = trl_reward("reference")
    assert total.__name__ == "prompt_r1_total"
    # TRL's prompt ends with the first assistant header; the completion holds the rest of the chat.
    completion = P + "<|im_end|>" + RESPONSE + "<|im_start|>assistant\n" + A
    rewards = total(
        prompts=["q", "q", "q"],
        completions=[completion, completion, "Paris"],
        completion_ids=[[1], [1], [1]],
        reward_model=[{"ground_truth": ["Paris"]}] * 3,
        status=["answered", "environment_error", "format_error"],
    )
    assert rewards == [1.0, None, pytest.approx(-1.0)]


def test_trl_reward_components_turn_texts_and_messages():
    columns = {"golden_answers": [["Paris"]], "turn_texts": [[P, P, A]]}
    assert trl_reward("paper", "format")(["q"], ["ignored"], **columns) == [1.5]
    assert trl_reward("paper", "answer")(["q"], ["ignored"], **columns) == [1.0]
    messages = [
        {"role": "assistant", "content": P},
        {"role": "user", "content": "r"},
        {"role": "assistant", "content": A},
    ]
    assert trl_reward("reference")(["q"], [messages], answer=["Paris"]) == [1.0]
    with pytest.raises(KeyError, match="needs golden answers"):
        trl_reward()(["q"], [A], other=[1])


def test_trl_reward_odd_columns():
    reward = trl_reward("reference")
    numeric = "<think>t</think><interaction_prompt>p</interaction_prompt><|im_end|>" + RESPONSE
    numeric += "<|im_start|>assistant\n<think>f</think><answer>7</answer>"
    assert reward(["q"], [numeric], answer=[7]) == [1.0]  # numbers become text
    # A row without golden_answers falls back to the release's reward_model column, row by row.
    both = {"golden_answers": [None, []], "reward_model": [{"ground_truth": ["Paris"]}] * 2}
    assert reward(["q", "q"], [A, A], turn_texts=[[P, A], None], **both) == [1.0, pytest.approx(-0.4)]
    parts = [{"role": "assistant", "content": [{"type": "text", "text": A}]}]
    assert reward(["q"], [parts], answer=["Paris"]) == [pytest.approx(-0.4)]
    # TRL decodes without special tokens: a multi-turn completion then has no turn boundaries left.
    stripped = P + "\nuser\n<interaction_response>r</interaction_response>\nassistant\n" + A
    with pytest.raises(ValueError, match="turn_texts"):
        reward(["q"], [stripped], answer=["Paris"])


def test_the_format_gate_can_be_turned_off_as_an_ablation():
    one_turn = ["<think>sure</think><answer>Paris</answer>"]  # one turn cannot reach the reference's cap
    gated = score_turns(one_turn, ["Paris"], "reference")
    ungated = score_turns(one_turn, ["Paris"], "reference", gate=False)
    assert not gated.gated and gated.total == pytest.approx(-1.0 + gated.format_reward)
    assert ungated.total == pytest.approx(gated.total + 1.0) and ungated.answer_reward == 1.0
    assert get_preset("reference", gate=False).name == "release(no gate)"
    with pytest.raises(ConfigError, match="gate must be true or false"):
        get_preset("reference", gate="no")
