"""GRPO on the hops task (`prompt_r1.tasks.hops`): the rollout that redraws the tables at every step, the figures
that say whether the agent follows the chain, the controls, and the first call's log-probability.

`HopsRollout` is the tasks' `TaskRollout` (`prompt_r1.tasks.skeleton`): before each step's episodes it redraws the `HopsTable` the
scripted environment answers from, returns the step's golden answers with the trajectories (TRL gives a rollout's
extra fields to the reward functions), and logs the chain figures of the step (`HOPS_METRICS`, per episode):
- `hops/hop1`: the first call names the question's thing; `hops/hop2`, `hops/hop3`: the k-th call names what the
  (k−1)-th reply pointed to (a door, a room), over episodes whose question needs at least k calls;
- `hops/correct`, and `hops/from_last_reply`: correct with the code the episode's last reply gave (a right answer
  no last reply gave is a guess or a memory, not a chain); `hops/from_last_reply_1` to `_3`: per calls needed;
- `hops/calls`, `hops/calls_needed`, `hops/exact_calls`: calls made, needed, and the share that made exactly as
  many as needed (no early answer, no extra call).
`mask_first_turn` (an ablation) trains on no token of the agent's first turn: credit for the final answer can then
not reach the first call.

`control` evaluates the policy on a table training never saw: every key, door and room as a question, against
the honest environment, the `withheld` one (codes secret: chance) and the `lying` one (the first reply lies: a
chain-follower is then wrong); and how often it answers at once. `first_call_logprob` is the policy's mean
log-probability of the right first call on the training questions over an unseen table (taught only through
rewards that come at the end of the episode). Needs the `train` and `dev` extras.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prompt_r1.runs.episode import Episode
from prompt_r1.tasks.hops import (
    CODES,
    HopsTable,
    Table,
    hops_of,
    named,
    pointed,
    reply_code,
)
from prompt_r1.tasks.skeleton import TaskRollout, log_means

__all__ = [
    "CHANCE",
    "HOPS_METRICS",
    "HopsRollout",
    "control",
    "first_call_logprob",
    "grpo_config",
    "hops_figures",
    "hops_trainer",
    "log_figures",
]

CHANCE = 1 / len(CODES)
HOPS_METRICS = (
    "hops/hop1",
    "hops/hop2",
    "hops/hop3",
    "hops/correct",
    "hops/from_last_reply",
    "hops/from_last_reply_1",
    "hops/from_last_reply_2",
    "hops/from_last_reply_3",
    "hops/calls",
    "hops/calls_needed",
    "hops/exact_calls",
)


def _start(episode: Episode) -> str:
    return named(episode.question)[0]


def hops_figures(episode: Episode, table: Table) -> dict[str, float | None]:
    """The episode's chain figures against `table` (see the module docstring); None where a figure does not apply
    (a hop the question does not need)."""
    start = _start(episode)
    needed = hops_of(start)
    calls = [
        t for t in episode.turns if t.get("prompt") is not None and t.get("response_source") == "environment"
    ]
    asked = [named(t["prompt"]) for t in calls]
    figures: dict[str, float | None] = {"hops/hop1": float(bool(asked) and asked[0] == [start])}
    for k in (2, 3):
        if needed < k:
            figures[f"hops/hop{k}"] = None
            continue
        follows = False
        if len(calls) >= k:
            previous = calls[k - 2].get("response") or ""
            target = pointed(previous)
            follows = reply_code(previous) is None and target is not None and asked[k - 1] == [target]
        figures[f"hops/hop{k}"] = float(follows)
    answer = (episode.answer or "").strip().lower()
    correct = answer == table.answer(start)
    last = reply_code(calls[-1].get("response") or "") if calls else None
    from_last = correct and last == answer
    figures["hops/correct"] = float(correct)
    figures["hops/from_last_reply"] = float(from_last)
    for k in (1, 2, 3):
        figures[f"hops/from_last_reply_{k}"] = float(from_last) if needed == k else None
    figures["hops/calls"] = float(len(calls))
    figures["hops/calls_needed"] = float(needed)
    figures["hops/exact_calls"] = float(len(calls) == needed)
    return figures


def log_figures(trainer: Any, figures: list[dict[str, float | None]]) -> None:
    """Log each figure's mean over the step's episodes of every process (those it applies to)."""
    log_means(trainer, HOPS_METRICS, figures)


def first_turn_masked(env_mask: list[int]) -> list[int]:
    """`env_mask` with the agent's first turn (its first run of 1s) set to 0: not trained on."""
    mask = list(env_mask)
    i = next((i for i, m in enumerate(mask) if m), len(mask))
    while i < len(mask) and mask[i]:
        mask[i] = 0
        i += 1
    return mask


class HopsRollout(TaskRollout):
    """`TaskRollout` on a `HopsTable` redrawn at every step (see the module docstring). `environment` is the
    client of the scripted server that answers from `table`."""

    metrics = HOPS_METRICS

    def __init__(self, environment: Any, table: HopsTable, *, mask_first_turn: bool = False, **rollout: Any):
        super().__init__(environment, **rollout)
        self.table = table
        self.mask_first_turn = mask_first_turn

    def draw(self, prompts: list[Any], trainer: Any) -> Table:
        return self.table.draw(trainer.state.global_step)

    def golden(self, table: Table, episodes: list[Episode]) -> list[list[str]]:
        return [[table.answer(_start(e))] for e in episodes]

    def figures(self, episode: Episode, table: Table) -> dict[str, float | None]:
        return hops_figures(episode, table)

    def shape(self, output: dict[str, list]) -> dict[str, list]:
        if self.mask_first_turn:
            output["env_mask"] = [first_turn_masked(m) for m in output["env_mask"]]
        return output


def _means(figures: list[dict[str, float | None]]) -> dict[str, float]:
    out = {}
    for name in HOPS_METRICS:
        values = [f[name] for f in figures if f.get(name) is not None]
        out[name.removeprefix("hops/")] = sum(values) / len(values) if values else math.nan
    return out


def control(trainer: Any, rollout: HopsRollout, *, step: int, samples: int = 4) -> dict[str, Any]:
    """The current policy asked about every key, door and room `samples` times, on the table drawn for `step` (pick
    one training never reaches), against each kind of reply (`HopsTable.reply`). Returns, per kind (`honest`,
    `withheld`, `lying`), the share answered with the true code, and for the honest replies every chain figure
    (`honest_figures`: hop1-3, from_last_reply per calls needed, calls, exact_calls) and the share that answered
    at once (`at_once`). A chain-follower shows `withheld` near `CHANCE` and `lying` near 0."""
    from prompt_r1.agents.batching import derive_seed
    from prompt_r1.tasks.hops import KIND, REPLIES, question_for

    questions = [question_for(name) for name in KIND] * samples
    table = rollout.table.draw(step)
    out: dict[str, Any] = {}
    try:
        for reply in REPLIES:
            rollout.table.reply = reply
            episodes, _ = rollout.sample(trainer, questions, derive_seed(trainer.args.seed, step))
            figures = [hops_figures(e, table) for e in episodes]
            out[reply] = sum(f["hops/correct"] for f in figures) / len(figures)
            if reply == "honest":
                out["honest_figures"] = _means(figures)
                out["at_once"] = sum(f["hops/calls"] == 0 for f in figures) / len(figures)
    finally:
        rollout.table.reply = "honest"
    return out


def first_call_logprob(trainer: Any, *, hops: tuple[int, ...] = (2, 3)) -> float:
    """The policy's mean log-probability (per question, summed over the turn's tokens) of the right first call
    (ask about the question's thing) on every question of `hops` calls, teacher-forced (the first call depends on
    the question alone, not on any table)."""
    import torch

    from prompt_r1.core.prompts import question_message
    from prompt_r1.core.tokens import initial_prompt_ids
    from prompt_r1.tasks.hops import ASK, KIND, ask_about, question_for

    tok = trainer.processing_class
    model = trainer.model
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for name in (n for n in KIND if hops_of(n) in hops):
                prompt = initial_prompt_ids(
                    tok, [{"role": "user", "content": question_message(question_for(name))}]
                )
                turn = tok.encode(ASK.format(prompt=ask_about(name)), add_special_tokens=False)
                ids = torch.tensor([prompt + turn], device=model.device)
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                picked = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt) :, None])
                total += float(picked.sum())
                count += 1
    finally:
        model.train(was_training)
    return total / count


def grpo_config(output_dir: str | Path, model: str | Path, env_base_url: str, **settings: Any) -> Any:
    """The GRPO settings of the hops benchmark: the door-codes task's (`prompt_r1.tasks.door_training.grpo_config`)
    with room for the chain: up to 4 calls (one more than any question needs), and a trajectory budget for them."""
    from prompt_r1.tasks.door_training import grpo_config as door_config

    return door_config(
        output_dir, model, env_base_url, **{"max_turns": 4, "max_total_tokens": 256, **settings}
    )


def hops_trainer(
    config: Any, table: HopsTable, rows: list[dict[str, Any]], *, mask_first_turn: bool = False
) -> Any:
    """The GRPO trainer of `config` (see `grpo_config`) with a `HopsRollout` on `table`, whose environment is the
    scripted server at `config.env_base_url` (`hops_environment(table)`)."""
    from functools import partial

    from prompt_r1.training.sync.trainer import build_trainer

    return build_trainer(
        config, train_rows=rows, rollout=partial(HopsRollout, table=table, mask_first_turn=mask_first_turn)
    )
