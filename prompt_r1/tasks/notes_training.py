"""GRPO on the notes task (`prompt_r1.tasks.notes`) with the built-in model as agent and as environment: the
rollout that draws fresh sheets at every step, the figures of an episode, and the trainer.

`NotesRollout` is the tasks' `TaskRollout` (`prompt_r1.tasks.skeleton`): before each step's episodes it draws a fresh sheet around
every thing or person the step's questions name (`NotesWorld.redraw`, from the run's seed and the step, so a seed
replays its sheets), answers through `NotesEnvironment` (the environment's system prompt is the episode's sheet),
returns the step's gold answers with the trajectories (TRL gives a rollout's extra fields to the reward
functions), and logs `NOTES_METRICS` per step:
- `notes/em`, `notes/em_1`, `notes/em_2`: exact match of the final answer, overall and on 1- and 2-call questions;
- `notes/calls`, `notes/calls_1`, `notes/calls_2`: environment calls per episode, overall and on 1- and 2-call
  questions (what a prompting policy chooses: a second call pays on a 2-call question only);
- `notes/at_once`: the share that answered without a call.
Needs the `train` and `local` extras.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from prompt_r1.agents.batching import derive_seed
from prompt_r1.runs.episode import Episode
from prompt_r1.scoring.metrics import exact_match, f1
from prompt_r1.tasks.notes import NotesEnvironment, NotesQuestion, NotesWorld
from prompt_r1.tasks.skeleton import TaskRollout, task_config
from prompt_r1.training.shared.trajectories import question_of

__all__ = [
    "ENV_MODEL",
    "NOTES_METRICS",
    "TOTAL_TOKENS",
    "TURN_TOKENS",
    "NotesRollout",
    "grpo_config",
    "notes_figures",
    "notes_trainer",
    "training_rows",
]

ENV_MODEL = "smollm2-135m"
TURN_TOKENS = 48  # an agent turn's cap: a turn of the cold-started agent is 20-35 tokens
TOTAL_TOKENS = 256  # an episode's agent tokens
NOTES_METRICS = (
    "notes/em", "notes/em_1", "notes/em_2", "notes/f1", "notes/calls", "notes/calls_1", "notes/calls_2",
    "notes/at_once",
)  # fmt: skip


def env_calls(episode: Episode) -> int:
    return sum(1 for t in episode.turns if t.get("response_source") == "environment")


def notes_figures(episode: Episode, asked: NotesQuestion) -> dict[str, float | None]:
    """The episode's figures against its question (None where one does not apply: `em_2` or `calls_2` of a 1-call
    question)."""
    answer = episode.answer or ""
    em = exact_match(answer, [asked.answer])
    calls = env_calls(episode)
    return {
        "notes/em": em,
        "notes/em_1": em if asked.calls == 1 else None,
        "notes/em_2": em if asked.calls == 2 else None,
        "notes/f1": f1(answer, [asked.answer]),
        "notes/calls": float(calls),
        "notes/calls_1": float(calls) if asked.calls == 1 else None,
        "notes/calls_2": float(calls) if asked.calls == 2 else None,
        "notes/at_once": float(calls == 0),
    }


class NotesRollout(TaskRollout):
    """`TaskRollout` whose environment answers from the step's sheets (see the module docstring); `seed` draws
    them."""

    metrics = NOTES_METRICS

    def __init__(self, environment: Any, *, seed: int = 0, **rollout: Any) -> None:
        self.world = NotesWorld()
        super().__init__(NotesEnvironment(environment, self.world), **rollout)
        self.seed = seed
        self.last_asked: list[NotesQuestion] = []

    def draw(self, prompts: list[Any], trainer: Any) -> list[NotesQuestion]:
        rng = random.Random(derive_seed(self.seed, trainer.state.global_step, 7))
        self.last_asked = self.world.redraw([question_of(p) for p in prompts], rng)
        return self.last_asked

    def golden(self, asked: list[NotesQuestion], episodes: list[Episode]) -> list[list[str]]:
        return [[q.answer] for q in asked]

    def figures(self, episode: Episode, asked: list[NotesQuestion]) -> dict[str, float | None]:
        # One question text, one sheet in a step (`NotesWorld.redraw`): the episode's question finds its own.
        return notes_figures(episode, next(q for q in asked if q.question == episode.question))


def training_rows(questions: list[str]) -> list[dict[str, Any]]:
    """The questions as GRPO's training rows: the protocol's first message as the prompt. Their gold answers are
    the step's (the rollout gives them); the row's own is a placeholder the rollout replaces."""
    from prompt_r1.core.prompts import question_message

    return [
        {"prompt": [{"role": "user", "content": question_message(q)}], "golden_answers": ["(drawn per step)"]}
        for q in questions
    ]


def grpo_config(output_dir: str | Path, model: str | Path, **settings: Any) -> Any:
    """The GRPO settings of the notes task (`settings` override them): the built-in model as environment, served
    by the trainer's process and greedy (a seed replays its replies); up to 3 calls (one more than any question
    needs); the double-constrained reward with the release's coefficients (`release`: one well-formed prompt and
    an answer pass its gate; the paper's coefficients need two prompts before an answer counts, which would reward
    a needless second call on every 1-call question and never a 1-call answer); the agent sampled at 0.7; LoRA on
    the attention projections, as the cold start's."""
    from prompt_r1.tasks.notes_agent import LORA

    defaults: dict[str, Any] = dict(
        output_dir=str(output_dir),
        model_name_or_path=str(model),
        env_model=ENV_MODEL,
        env_temperature=0.0,
        env_max_tokens=32,  # a reply that gives one fact is under 20 tokens
        per_device_train_batch_size=16,
        num_generations=4,
        max_turns=3,
        max_turn_tokens=TURN_TOKENS,
        max_total_tokens=TOTAL_TOKENS,
        # One GRPO step stopped every second call of a cold-started agent (asked again after 11 of 12 builder
        # replies, then 0 of 8, at 5e-4; 14 of 27, then 0 of 26, at 1e-4 with 32 episodes a step): Adam's first
        # step moves every LoRA weight by the learning rate, and asking again cost more on the 1-call questions
        # than it gained on the 2-call ones. At 3e-5 it kept asking through 10 steps (docs/benchmarks.md).
        learning_rate=3e-5,
        beta=0.0,
        # Sampled at 1.0, the 135M agent garbles names it copies into a second prompt ("Where is Gita Vesk born?"
        # for Gita Pryor): on 32 training-pool questions its cold start asked twice on 8 of 19 2-call questions and
        # got 7 right; at 0.7, 11 and 10 (docs/benchmarks.md, the real agent's recipe).
        temperature=0.7,
        reward_preset="release",
        use_peft=True,
        lora_r=LORA["r"],
        lora_alpha=LORA["lora_alpha"],
        lora_dropout=LORA["lora_dropout"],
        lora_target_modules=LORA["target_modules"],
    )
    return task_config(defaults, settings)


def notes_trainer(config: Any, rows: list[dict[str, Any]]) -> Any:
    """The GRPO trainer of `config` (see `grpo_config`) with a `NotesRollout` seeded by the run's seed."""
    from functools import partial

    from prompt_r1.training.sync.trainer import build_trainer

    return build_trainer(config, train_rows=rows, rollout=partial(NotesRollout, seed=config.seed))
