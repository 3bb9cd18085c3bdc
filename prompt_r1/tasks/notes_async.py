"""The notes task (`prompt_r1.tasks.notes`) under the asynchronous trainer: a sheet per group of episodes.

The synchronous rollout draws a fresh sheet around each of a step's questions (`NotesRollout`, `NotesWorld.redraw`).
The asynchronous worker keeps groups of episodes in flight across steps, so there each group plays a sheet of its
own, drawn around its question's thing or person from the run's seed and the group's index (`GroupSheets`): the
same seed draws the same sheets, and a resumed run's groups play theirs again.
- the worker asks `group_row` for the row a group plays before its episodes start: the group's sheet is drawn
  then, and the row's golden answers are that sheet's;
- every environment call carries its episode's group (`rollout_group` in the run config's metadata), and
  `GroupKeyedEnvironment` gives the environment client that group's sheet as its system prompt
  (`notes_system_prompt`), as `NotesEnvironment` gives a step's sheet in the synchronous run;
- `episode_metrics` gives each episode's notes figures (`NOTES_METRICS`, NaN where one does not apply), which the
  trainer averages per step as the synchronous rollout logs them.
The sheet is found by the group, not by the names a prompt carries (`NotesWorld.sheet_for`, which needs every
name in play on one sheet only): groups in flight together are drawn independently, so two may share a name.

    run = train_async(cold_model, training_rows(questions), out, seed=3, max_steps=16)
    run["log_history"], run["trainer"], run["sheets"].asked(0)

The environment is the built-in model served by this process, as for the synchronous trainer (`grpo_config`); the
policy is served by a vLLM server of its own (`run_async`). LoRA as in the synchronous run: the async trainer
merges the adapter into the weights the server reloads. Needs the `train`, `local` and `vllm` extras.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from prompt_r1.agents.batching import derive_seed
from prompt_r1.tasks.notes import NotesQuestion, NotesWorld, notes_system_prompt
from prompt_r1.tasks.notes_training import notes_figures
from prompt_r1.tasks.skeleton_async import group_keyed_trainer, run_async

__all__ = ["GroupSheets", "notes_async_trainer", "train_async"]

# Group sheets are keyed (seed, GROUP_SHEETS, group); the synchronous rollout's (seed, step, 7), steps never
# negative: no group's sheet is a step's.
GROUP_SHEETS = -1


class GroupSheets:
    """Each group's question on a sheet of its own (see the module docstring), drawn from `seed` and the group's
    index from `pool`'s names, around the thing or person its question names (`NotesWorld.redraw` of that question
    alone). `ask` draws it once: the group's episodes, golden answers and figures all read the same one."""

    def __init__(self, seed: int, pool: str = "train") -> None:
        self.seed, self.pool = seed, pool
        self._asked: dict[int, NotesQuestion] = {}

    def ask(self, group: int, question: str) -> NotesQuestion:
        """The group's question with its sheet and gold answer (drawn at the first ask)."""
        if group not in self._asked:
            rng = random.Random(derive_seed(self.seed, GROUP_SHEETS, group))
            self._asked[group] = NotesWorld().redraw([question], rng, self.pool)[0]
        asked = self._asked[group]
        if asked.question != question:
            raise ValueError(f"group {group} plays {asked.question!r}, not {question!r}")
        return asked

    def asked(self, group: int) -> NotesQuestion:
        """The question group `group` was asked (KeyError before `ask`)."""
        return self._asked[group]

    def system_prompt(self, group: int) -> str:
        """The environment's system prompt for the group's episodes: its sheet's notes."""
        return notes_system_prompt(self.asked(group).sheet)

    def worker_options(self) -> dict[str, Any]:
        """`GraphRolloutWorker` options: each group's golden answers from its own sheet, and each episode's notes
        figures against it (NaN where a figure does not apply: the trainer averages over the samples that have
        one)."""
        from prompt_r1.training.shared.trajectories import question_of

        def group_row(group: int, row: dict[str, Any]) -> dict[str, Any]:
            return {**row, "golden_answers": [self.ask(group, question_of(row["prompt"])).answer]}

        def episode_metrics(group: int, row: dict[str, Any], episode: Any) -> dict[str, float]:
            figures = notes_figures(episode, self.asked(group))
            return {name: math.nan if value is None else value for name, value in figures.items()}

        return {"group_row": group_row, "episode_metrics": episode_metrics}


def notes_async_trainer(config: Any, rows: list[dict[str, Any]], sheets: GroupSheets) -> Any:
    """The async trainer of `config` (`grpo_config(..., async_grpo=True, vllm_server_base_url=...)`) on the task:
    its environment the config's (the built-in model, served by this process), answering each episode from its
    group's sheet in `sheets`."""
    return group_keyed_trainer(config, rows, sheets.worker_options(), system=sheets.system_prompt)


def train_async(
    model: str | Path,
    rows: list[dict[str, Any]],
    output_dir: str | Path,
    *,
    seed: int,
    sheets: GroupSheets | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Train the agent at `model` (a folder, or a built-in agent's name) on `rows` (`notes_training.training_rows`)
    with the async trainer: `run_async` with the task's settings (`grpo_config`; `settings` override them) and
    sheets (`sheets`, by default drawn from `seed`). Nothing is measured here: the comparison measures every method
    on one held-out draw (`prompt_r1.tasks.notes_eval`). Returns `run_async`'s result and the sheets."""
    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.tasks.notes_training import grpo_config

    model = resolve_model(str(model))  # vLLM serves a folder
    sheets = sheets if sheets is not None else GroupSheets(seed)
    run = run_async(
        model,
        output_dir,
        configure=lambda **kw: grpo_config(output_dir, model, **kw),
        build=lambda config: notes_async_trainer(config, rows, sheets),
        measure=None,
        seed=seed,
        **settings,
    )
    return {**run, "sheets": sheets}
