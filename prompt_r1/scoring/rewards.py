"""The double-constrained reward (paper §3.2, Eq. 12–15): a format reward that gates an answer-F1 reward.

    R_fmt = min(ε, α·Σ_{t<T} M_t + β·A_p + γ·A_n + δ·C_f)
    R_ans = max over golden answers of token F1(answer, golden)
    R     = −ε + R_fmt + R_ans   when R_fmt = ε,   else   −ε + R_fmt

T is the final agent turn; M_t says intermediate turn t is well formed, A_p that the final turn holds an answer,
A_n that it is not blank, C_f that the final turn is complete. Two presets (`reference` is the older name of
`release`, kept as an alias):

- `paper` (App. G: α=0.25, β=0.3, γ=0.4, δ=0.3, ε=1.5). Turns are read with `parse_agent_output`: M_t is a
  defect-free prompt turn with non-blank think and prompt; A_p a final turn that parses as an answer; A_n a
  non-blank answer; C_f a final turn that is exactly `<think>` (non-blank) then `<answer>` with no defects.
  Because 0.25 per turn is needed twice to reach ε, the answer only counts after two or more prompts.
- `release` (α=0.4, β=0.25, γ=0.25, δ=0.1, ε=1.0) gives exactly the numbers of the public release's
  `compute_score_format_answer`, including its regular expressions: an intermediate turn earns α when it holds
  exactly one of each think/prompt tag and is think, whitespace, prompt from its first to last character; the
  final turn earns β + γ when its first `<answer>…</answer>` is not blank, δ more when the turn is
  `<think>…</think>` … `<answer>…</answer>` end to end; the answer reward uses that first answer.

`score_transcript` scores the Qwen chat-format text the reference release scores (`<|im_start|>assistant\\n…
<|im_end|>` blocks), `score_episode` a result of the graph, `score_turns` a list of agent generations, and
`trl_reward` wraps them in TRL's reward-function signature (and, for `--protocol release` rollouts, scores the
decoded stream as the release does: see prompt_r1/loop/protocols/release.py).

    >>> one_turn = "<|im_start|>assistant\\n<think>t</think><answer>Paris</answer><|im_end|>"
    >>> score_transcript(one_turn, ["Paris"]).total, score_transcript(one_turn, ["Paris"], "release").total
    (-0.5, -0.4)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from prompt_r1.core.errors import ConfigError
from prompt_r1.core.protocol import parse_agent_output
from prompt_r1.scoring.metrics import (
    ANSWER_FIELDS,
    answer_list,
    answer_values,
    as_answer_list,
    f1,
    normalize_answer,
)

__all__ = [
    "PRESETS",
    "PRESET_ALIASES",
    "RewardPreset",
    "RewardScore",
    "assistant_blocks",
    "get_preset",
    "golden_answers_of",
    "score_episode",
    "score_transcript",
    "score_turns",
    "trl_reward",
]


@dataclass(frozen=True)
class RewardPreset:
    """Coefficients of the format reward and the rule that judges each term ("paper" or "release"; "reference"
    is read as "release")."""

    name: str
    rule: Literal["paper", "release"]
    alpha: float  # per well-formed intermediate turn (M_t)
    beta: float  # the final turn holds an answer (A_p)
    gamma: float  # the answer is not blank (A_n)
    delta: float  # the final turn is complete (C_f)
    epsilon: float  # cap of the format reward, the gate, and the offset of the total
    gate: bool = True  # False (an ablation): the answer counts whatever the format reward

    def __post_init__(self) -> None:
        if self.rule == "reference":  # the rule's former name
            object.__setattr__(self, "rule", "release")
        if self.rule not in ("paper", "release"):  # the rules of _RULES below
            raise ConfigError(f"reward rule must be 'paper' or 'release', got {self.rule!r}")
        for name in ("alpha", "beta", "gamma", "delta", "epsilon"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"reward coefficient {name} must be a finite number, got {value!r}")
        if self.epsilon <= 0:
            raise ConfigError(f"reward coefficient epsilon must be positive, got {self.epsilon}")


PRESETS: dict[str, RewardPreset] = {
    "paper": RewardPreset("paper", "paper", alpha=0.25, beta=0.3, gamma=0.4, delta=0.3, epsilon=1.5),
    "release": RewardPreset("release", "release", alpha=0.4, beta=0.25, gamma=0.25, delta=0.1, epsilon=1.0),
}
PRESET_ALIASES = {"reference": "release"}  # former names, still accepted


def get_preset(preset: str | RewardPreset = "paper", **coefficients: float | bool) -> RewardPreset:
    """A preset by name, with any of alpha/beta/gamma/delta/epsilon replaced one by one, and `gate=False` for the
    ablation that counts the answer whatever the format.

    >>> get_preset("paper", epsilon=1.2).epsilon
    1.2
    """
    if isinstance(preset, str):
        preset = PRESET_ALIASES.get(preset, preset)
        if preset not in PRESETS:
            raise ConfigError(f"unknown reward preset {preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    unknown = set(coefficients) - {"alpha", "beta", "gamma", "delta", "epsilon", "gate"}
    if unknown:
        raise ConfigError(f"unknown reward coefficient(s): {', '.join(sorted(unknown))}")
    gate = coefficients.pop("gate", None)
    if gate is not None and not isinstance(gate, bool):
        raise ConfigError(f"reward gate must be true or false, got {gate!r}")
    changed = {k: v for k, v in coefficients.items() if v is not None}
    if changed:
        preset = dataclasses.replace(preset, name=f"{preset.name}(custom)", **changed)
    if gate is False and preset.gate:
        preset = dataclasses.replace(preset, name=f"{preset.name}(no gate)", gate=False)
    return preset


@dataclass(frozen=True)
class RewardScore:
    """One scored episode: the reward's parts, and the facts each term was computed from."""

    format_reward: float
    answer_reward: float
    total: float
    gated: bool  # the format reward reached ε, so the answer counted
    turns: int
    intermediate_ok: int  # Σ M_t
    answer_parsed: bool  # A_p
    answer_nonempty: bool  # A_n
    complete: bool  # C_f
    answer: str | None
    preset: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The reference release's patterns, kept verbatim in meaning: `$` (no MULTILINE) also matches before one final
# newline, and `(.*?)` with DOTALL spans lines; both matter for which turns earn the format terms.
_BLOCK = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)
_REF_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_REF_PROMPT_TURN = re.compile(
    r"^<think>(.*?)</think>(\s*)<interaction_prompt>(.*?)</interaction_prompt>$", re.DOTALL
)
_REF_ANSWER_TURN = re.compile(r"^<think>(.*?)</think>(.*?)<answer>(.*?)</answer>$", re.DOTALL)
_COMPLETE_ANSWER_TURN = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_PROMPT_TAGS = ("<think>", "</think>", "<interaction_prompt>", "</interaction_prompt>")


def assistant_blocks(transcript: str) -> list[str]:
    """The assistant turns of a Qwen chat-format transcript, in order (an unterminated last turn is not one)."""
    return _BLOCK.findall(transcript)


def _release_terms(turns: Sequence[str]) -> tuple[int, bool, bool, bool, str | None]:
    intermediate_ok = sum(
        1
        for turn in turns[:-1]
        if all(turn.count(tag) == 1 for tag in _PROMPT_TAGS) and _REF_PROMPT_TURN.search(turn)
    )
    match = _REF_ANSWER.search(turns[-1])
    answer = match.group(1).strip() if match else None
    has_answer = bool(answer)
    complete = has_answer and _REF_ANSWER_TURN.search(turns[-1]) is not None
    return intermediate_ok, has_answer, has_answer, complete, answer


def _paper_terms(turns: Sequence[str]) -> tuple[int, bool, bool, bool, str | None]:
    intermediate_ok = 0
    for text in turns[:-1]:
        turn = parse_agent_output(text)
        if (
            turn.kind == "prompt"
            and turn.format_ok
            and (turn.think or "").strip()
            and (turn.prompt or "").strip()
        ):
            intermediate_ok += 1
    final = parse_agent_output(turns[-1])
    parsed = final.kind == "answer"
    answer = final.answer if parsed else None
    nonempty = bool(answer)
    complete = (
        parsed
        and final.format_ok
        and bool((final.think or "").strip())
        and not final.truncated.strip()  # nothing, not even a second answer, after the first </answer>
        and _COMPLETE_ANSWER_TURN.match(turns[-1]) is not None
    )
    return intermediate_ok, parsed, nonempty, complete, answer


@dataclass(frozen=True)
class _Rule:
    """How a preset's rule judges an episode: its format terms, and whether an answer that normalises to nothing
    ("the") earns 0 whatever the golden answers (the reference's F1 does, even against an equally empty golden
    answer; the metric's convention, both empty → 1, would differ there)."""

    terms: Callable[[Sequence[str]], tuple[int, bool, bool, bool, str | None]]
    blank_answer_scores_zero: bool


_RULES: dict[str, _Rule] = {
    "paper": _Rule(_paper_terms, blank_answer_scores_zero=False),
    "release": _Rule(_release_terms, blank_answer_scores_zero=True),
}


def score_turns(
    turns: Sequence[str],
    golden_answers: str | Iterable[str],
    preset: str | RewardPreset = "paper",
    **coefficients: float,
) -> RewardScore:
    """Score an episode given as the agent's generations in order (the last one is the final turn T)."""
    spec = get_preset(preset, **coefficients)
    golds = as_answer_list(golden_answers)
    turns = list(turns)
    for i, text in enumerate(turns):
        if not isinstance(text, str):
            raise TypeError(f"turn {i} must be a string, got {type(text).__name__}")
    if not turns:
        return RewardScore(0.0, 0.0, -spec.epsilon, False, 0, 0, False, False, False, None, spec.name)

    rule = _RULES[spec.rule]
    intermediate_ok, parsed, nonempty, complete, answer = rule.terms(turns)
    # Summed term by term in this order, as the reference does, so float results match it to the last bit.
    fmt = 0.0
    for _ in range(intermediate_ok):
        fmt += spec.alpha
    if parsed:
        fmt += spec.beta
    if nonempty:
        fmt += spec.gamma
    if complete:
        fmt += spec.delta
    fmt = min(fmt, spec.epsilon)
    gated = math.isclose(fmt, spec.epsilon, rel_tol=0.0, abs_tol=1e-9)
    if gated:
        fmt = spec.epsilon

    answer_reward = 0.0
    if nonempty and answer is not None:
        if rule.blank_answer_scores_zero and not normalize_answer(answer).split():
            answer_reward = 0.0
        else:
            answer_reward = f1(answer, golds)
    total = -spec.epsilon + fmt + answer_reward if gated or not spec.gate else -spec.epsilon + fmt
    return RewardScore(
        format_reward=fmt,
        answer_reward=answer_reward,
        total=total,
        gated=gated,
        turns=len(turns),
        intermediate_ok=intermediate_ok,
        answer_parsed=parsed,
        answer_nonempty=nonempty,
        complete=complete,
        answer=answer,
        preset=spec.name,
    )


def score_transcript(
    text: str,
    golden_answers: str | Iterable[str],
    preset: str | RewardPreset = "paper",
    **coefficients: float,
) -> RewardScore:
    """Score a transcript in Qwen chat format: its `<|im_start|>assistant\\n…<|im_end|>` blocks are the turns.

    Anything outside those blocks (system, user and `<interaction_response>` turns) is ignored, as in the
    reference release; a transcript without a complete assistant block scores −ε.
    """
    if not isinstance(text, str):
        raise TypeError(f"the transcript must be a string, got {type(text).__name__}")
    return score_turns(assistant_blocks(text), golden_answers, preset, **coefficients)


def score_episode(
    episode: Mapping[str, Any],
    golden_answers: str | Iterable[str] | None = None,
    preset: str | RewardPreset = "paper",
    **coefficients: float,
) -> RewardScore:
    """Score a result of the graph (its `turns` records); golden answers default to the episode's own."""
    if golden_answers is None:
        golden_answers = episode.get("golden_answers")
        if golden_answers is None:
            raise ValueError("the episode has no golden_answers; pass them to score_episode")
    texts = [turn["text"] for turn in episode.get("turns") or []]
    return score_turns(texts, golden_answers, preset, **coefficients)


def golden_answers_of(row: Mapping[str, Any]) -> list[str]:
    """Golden answers from a dataset row: `golden_answers`, `answers`, the release's `reward_model.ground_truth`,
    or `answer` (the first of them that is present and not empty; numbers become text). A SQuAD-style mapping
    {"text": [...], "answer_start": [...]} gives its `text`, as the dataset loader reads it.

    >>> golden_answers_of({"answers": {"text": ["Paris", "Paris, France"], "answer_start": [0, 0]}})
    ['Paris', 'Paris, France']
    """
    for _, value in answer_values(row):
        answers = answer_list(value)  # a TypeError says what is wrong with it
        if answers:
            return answers
    raise KeyError(f"no golden answers: expected {', '.join(ANSWER_FIELDS[:-1])} or {ANSWER_FIELDS[-1]}")


_HEADER, _END = "<|im_start|>assistant\n", "<|im_end|>"


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return str(content)


def _completion_turns(completion: Any) -> list[str]:
    """The agent's turns in one TRL completion: chat messages, or text in chat format."""
    conversational = isinstance(completion, list)  # [{"role": ..., "content": ...}, ...]
    if conversational:
        turns = [_content(m) for m in completion if m.get("role") == "assistant"]
        text = "".join(turns)
    else:
        text = str(completion)
    if "<interaction_response>" in text and "<|im_start|>" not in text:
        # TRL decodes completions without special tokens, which erases the turn boundaries of a multi-turn
        # episode; scoring it as one turn would never reach the gate. The rollout must pass the turns instead.
        raise ValueError(
            "a multi-turn completion without <|im_start|>/<|im_end|> markers cannot be split into turns; "
            "pass the episode's turns as the `turn_texts` column (the Prompt-R1 rollout does)"
        )
    if conversational:
        return turns
    # TRL's prompt ends with the first assistant header and the last turn may stop before its end-of-turn
    # marker; restore both so the text has the form the reference scores.
    if not text.startswith(_HEADER):
        text = _HEADER + text
    if not text.rstrip().endswith(_END):
        text = text + _END
    return assistant_blocks(text)


def trl_reward(
    preset: str | RewardPreset = "paper",
    component: Literal["total", "format", "answer"] = "total",
    **coefficients: float,
):
    """A reward function with TRL's signature `f(prompts, completions, completion_ids, **columns) -> list[float]`.

    Golden answers come from the dataset columns (`golden_answers`, `reward_model` or `answer`). When the rollout
    passes `transcript` (`--protocol release`: the decoded prompt and trajectory) that is scored as the release
    scores it, and an episode whose `ends_on_agent_token` is false gets a total of 0 (the release's GRPO sums the
    reward over the agent's tokens only); else, when it passes `turn_texts` (the agent's generations of each
    episode) those are scored; otherwise each completion is read as chat-format text. Episodes whose `status` is `environment_error` get None: an infrastructure failure
    is not the agent's doing, and TRL leaves a None reward out of the group's baseline. Use one function per
    component (weights 1, 0, 0) to have TRL log the format and answer parts next to the total.
    """
    spec = get_preset(preset, **coefficients)
    if component not in ("total", "format", "answer"):
        raise ConfigError(f"reward component must be total, format or answer, got {component!r}")
    attribute = {"total": "total", "format": "format_reward", "answer": "answer_reward"}[component]

    def reward(prompts, completions, completion_ids=None, **columns) -> list[float | None]:
        rows = len(completions)
        statuses = columns.get("status") or [None] * rows
        turn_texts = columns.get("turn_texts") or [None] * rows
        transcripts = columns.get("transcript") or [None] * rows
        on_agent_token = columns.get("ends_on_agent_token") or [True] * rows
        keys = [k for k in ("golden_answers", "reward_model", "answer") if columns.get(k) is not None]
        if not keys:
            raise KeyError(
                "the reward needs golden answers: the dataset has none of golden_answers, reward_model, answer "
                f"(columns passed: {', '.join(sorted(columns)) or 'none'})"
            )
        out: list[float | None] = []
        for i in range(rows):
            # A refusal too, when the release's rules apply: the release would have shown the agent the API's
            # error text and gone on, an episode this loop does not have.
            failed = (
                ("environment_error", "refused") if transcripts[i] is not None else ("environment_error",)
            )
            if statuses[i] in failed:
                out.append(None)
                continue
            golds = golden_answers_of({k: columns[k][i] for k in keys})
            if transcripts[i] is not None:
                score = score_transcript(transcripts[i], golds, spec)
                if not on_agent_token[i]:
                    score = dataclasses.replace(score, total=0.0)
            else:
                turns = turn_texts[i] if turn_texts[i] is not None else _completion_turns(completions[i])
                score = score_turns(turns, golds, spec)
            out.append(getattr(score, attribute))
        return out

    reward.__name__ = f"prompt_r1_{component}"
    return reward
