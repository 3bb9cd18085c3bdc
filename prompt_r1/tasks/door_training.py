"""GRPO on the door-codes task (`prompt_r1.tasks.door_codes`): the rollout that redraws the codes at every step, the
figures that say whether the agent collaborates, and the control that proves the reply is needed.

`DoorRollout` is the tasks' `TaskRollout` (`prompt_r1.tasks.skeleton`): before each step's episodes it redraws the
`DoorTable` the scripted environment answers from, and it returns the step's golden answers with the trajectories
(TRL gives a rollout's extra fields to the reward functions in place of the dataset's columns), so the environment
and the reward read the same table. Per step it logs, beside the trainer's own metrics:

- `door/asked_right`: the share of episodes that asked the environment about the question's door;
- `door/correct`: the share answered with the question's door's code;
- `door/correct_from_reply`: the share answered correctly with the code the environment gave in that episode
  for the question's door (a right answer that no reply of the episode gave is a guess, not collaboration).

`control` evaluates the agent on a table training never saw, against the honest environment and two controls: one
that withholds the code (every agent can only guess: right 1 time in 8) and one that lies (gives every door a
wrong code: an agent whose answers come from the reply is then never right, one that knew the answers without
asking would not be hurt).

Needs the `train` and `dev` extras.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prompt_r1.runs.episode import Episode
from prompt_r1.tasks.door_codes import CODES, DoorTable, named_doors
from prompt_r1.tasks.skeleton import TaskRollout, task_config

__all__ = ["CHANCE", "DOOR_METRICS", "DoorRollout", "control", "door_figures", "door_trainer", "grpo_config"]

CHANCE = 1 / len(CODES)  # a right answer by guessing a code
DOOR_METRICS = ("door/asked_right", "door/correct", "door/correct_from_reply")


def door_figures(episode: Episode, codes: dict[str, str]) -> tuple[bool, bool, bool]:
    """(asked about the question's door, answered its code, answered the code a reply of the episode gave for it)."""
    door = named_doors(episode.question)[0]
    asked = [t for t in episode.turns if t.get("prompt") is not None]
    asked_right = any(named_doors(t["prompt"]) == [door] for t in asked)
    answer = (episode.answer or "").strip().lower()
    correct = answer == codes[door]
    told = {
        _reply_code(t.get("response") or "", door)
        for t in asked
        if t.get("response_source") == "environment" and named_doors(t["prompt"]) == [door]
    }
    return asked_right, correct, correct and answer in told


def _reply_code(reply: str, door: str) -> str | None:
    prefix = f"The {door} door code is "
    return reply[len(prefix) :].rstrip(".").strip().lower() if reply.startswith(prefix) else None


class DoorRollout(TaskRollout):
    """`TaskRollout` on a `DoorTable` redrawn at every step (see the module docstring). `environment` is the
    client of the scripted server that answers from `table`."""

    metrics = DOOR_METRICS

    def __init__(self, environment: Any, table: DoorTable, **rollout: Any) -> None:
        super().__init__(environment, **rollout)
        self.table = table

    def draw(self, prompts: list[Any], trainer: Any) -> dict[str, str]:
        return self.table.draw(trainer.state.global_step)

    def golden(self, codes: dict[str, str], episodes: list[Episode]) -> list[list[str]]:
        return [[codes[named_doors(e.question)[0]]] for e in episodes]

    def figures(self, episode: Episode, codes: dict[str, str]) -> dict[str, float | None]:
        return dict(zip(DOOR_METRICS, map(float, door_figures(episode, codes)), strict=True))


def control(trainer: Any, rollout: DoorRollout, *, step: int, samples: int = 8) -> dict[str, float]:
    """The current policy asked about every door `samples` times, on the table drawn for `step` (pick one training
    never reaches), against each kind of reply (`DoorTable.reply`). Returns the share answered with the true code
    for each kind (`honest`, `withheld`, `lying`), and with the honest reply the shares that asked the question's
    door (`asked_right`) and answered with the code its reply gave (`from_reply`). Collaboration shows as
    `withheld` near `CHANCE` and `lying` near 0; run before training it measures the starting agent."""
    from prompt_r1.agents.batching import derive_seed
    from prompt_r1.tasks.door_codes import DOORS, REPLIES, question_for

    questions = [question_for(door) for door in DOORS] * samples
    codes = rollout.table.draw(step)
    shares: dict[str, float] = {}
    try:
        for reply in REPLIES:
            rollout.table.reply = reply
            episodes, _ = rollout.sample(trainer, questions, derive_seed(trainer.args.seed, step))
            figures = [door_figures(e, codes) for e in episodes]
            shares[reply] = sum(f[1] for f in figures) / len(figures)
            if reply == "honest":
                shares["asked_right"] = sum(f[0] for f in figures) / len(figures)
                shares["from_reply"] = sum(f[2] for f in figures) / len(figures)
    finally:
        rollout.table.reply = "honest"
    return shares


def grpo_config(output_dir: str | Path, model: str | Path, env_base_url: str, **settings: Any) -> Any:
    """The GRPO settings the learning benchmark and its CI test train with (the `train` extra): two turns, the
    `reference` reward preset (its gate lets a two-turn episode through); `settings` override them.
    `async_grpo=True` in `settings` gives the async trainer's config (`PromptR1AsyncGRPOConfig`), with the same
    defaults. The choices and the runs behind them are in docs (the learning benchmark)."""
    defaults: dict[str, Any] = dict(
        output_dir=str(output_dir),
        model_name_or_path=str(model),
        env_model="env",
        env_base_url=env_base_url,
        env_api_key_env="PROMPT_R1_DOOR_TASK_NO_KEY",
        env_rate_limit=1_000_000,  # the scripted environment has no provider's limit
        per_device_train_batch_size=32,
        num_generations=8,
        max_turns=2,
        max_turn_tokens=32,  # a turn that asks is 14 tokens; room to go wrong
        max_total_tokens=128,
        learning_rate=1e-3,  # 2e-3 learned less on 1 seed of 3, 4e-3 broke all 3 (docs: the learning benchmark)
        beta=0.04,  # a KL term: at lr 2e-3, seed 100 gained +0.20 without it, +0.35 with it
        temperature=1.0,
        reward_preset="reference",
    )
    return task_config(defaults, settings)


def door_trainer(
    config: Any, table: DoorTable, rows: list[dict[str, Any]], *, rollout: type[DoorRollout] = DoorRollout
) -> Any:
    """The GRPO trainer of `config` (see `grpo_config`) with a `DoorRollout` (or `rollout`, a subclass) on
    `table`, whose environment is the scripted server at `config.env_base_url` (`door_environment(table)`)."""
    from functools import partial

    from prompt_r1.training.sync.trainer import build_trainer

    return build_trainer(config, train_rows=rows, rollout=partial(rollout, table=table))
