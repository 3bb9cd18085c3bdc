"""What `prompt-r1 train --dry-run` prints: the recipe's generation steps, the episodes each step runs, and what
their environment calls cost per step and for the whole run, by the episode model of prompt_r1.runs.estimate.
No model is loaded and nothing is sent; the agent is the model being trained, so only the environment is paid.

Steps are TRL's GRPO schedule: a generation step runs `generation_batch_size` episodes (`generation_batch_size /
num_generations` questions, `num_generations` each) once every `steps_per_generation × num_iterations` micro-steps,
and an optimizer step is `gradient_accumulation_steps` micro-steps. With `max_steps` the run makes
`ceil(max_steps × gradient_accumulation_steps / (steps_per_generation × num_iterations))` generation steps; else each
epoch makes one per full batch of questions (a last partial batch is dropped, as TRL's sampler does).
The async trainer has no generation batch: each optimizer step trains `per_device_train_batch_size ×
gradient_accumulation_steps × processes` samples (episodes), so a step here is an optimizer step of that many, and
an epoch is every question's `num_generations` episodes.
"""

from __future__ import annotations

import math
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.runs.estimate import EpisodeShape, Estimate, TokenCounter, episode_part
from prompt_r1.runs.estimate_report import format_usd

__all__ = ["TrainSchedule", "train_estimate", "train_schedule"]


class TrainSchedule:
    """Generation steps, episodes per step and optimizer steps of a config, on this process count."""

    def __init__(self, config: Any, rows: int) -> None:
        self.rows = rows
        if not hasattr(config, "generation_batch_size"):  # the async trainer's config
            self._async(config, rows)
            return
        self.episodes_per_step = int(config.generation_batch_size)
        self.questions_per_step = self.episodes_per_step // config.num_generations
        every = config.steps_per_generation * getattr(config, "num_iterations", 1)
        accumulation = config.gradient_accumulation_steps
        per_epoch = rows // self.questions_per_step if self.questions_per_step else 0
        if config.max_steps and config.max_steps > 0:
            self.optimizer_steps = int(config.max_steps)
            self.steps = math.ceil(self.optimizer_steps * accumulation / every)
        else:
            self.optimizer_steps = math.ceil(config.num_train_epochs * (per_epoch * every // accumulation))
            self.steps = math.ceil(self.optimizer_steps * accumulation / every)
        self.per_epoch = per_epoch

    def _async(self, config: Any, rows: int) -> None:
        """TRL's async schedule (trl/experimental/async_grpo: `samples_per_step`), one step per optimizer step."""
        processes = max(int(getattr(config, "world_size", 1) or 1), 1)
        self.episodes_per_step = (
            config.per_device_train_batch_size * config.gradient_accumulation_steps * processes
        )
        self.questions_per_step = max(self.episodes_per_step // config.num_generations, 1)
        episodes_per_epoch = rows * config.num_generations
        self.per_epoch = episodes_per_epoch // self.episodes_per_step
        if config.max_steps and config.max_steps > 0:
            self.optimizer_steps = int(config.max_steps)
        else:
            self.optimizer_steps = math.ceil(
                config.num_train_epochs * episodes_per_epoch / self.episodes_per_step
            )
        self.steps = self.optimizer_steps


def train_schedule(config: Any, rows: int) -> TrainSchedule:
    return TrainSchedule(config, rows)


def train_estimate(
    config: Any,
    questions: list[str],
    shape: EpisodeShape,
    *,
    counter: TokenCounter,
    title: str = "train --dry-run",
) -> Estimate:
    """The run's estimate: one part for one generation step's episodes, one for the whole run's, the environment's
    limits for the time, and where `max_env_cost` / `max_env_calls` stop it (in generation steps)."""
    from prompt_r1.loop.protocols import protocol_for

    if not questions:
        from prompt_r1.core.errors import DataError

        raise DataError(f"train_data {config.train_data} has no rows")
    prices = PriceTable.load(config.prices)
    loop = config.loop_config()
    protocol = protocol_for(loop)
    schedule = train_schedule(config, len(questions))
    firsts = [counter.first_prompt(protocol, q) for q in questions]
    # The questions in the sampler's order are unknown (shuffled by the seed): each step's are the mean question.
    mean_first = sum(firsts) / len(firsts)
    options = dict(
        loop=loop, prices=prices, env_model=config.env_model, agent_model=None, agent_paid=False,
        counter=counter, system_prompt=protocol.environment_system_prompt, kind="training",
    )  # fmt: skip
    step = episode_part("one generation step", [mean_first] * schedule.episodes_per_step, shape, **options)
    run = episode_part(
        f"{schedule.steps:,} generation steps", [mean_first] * (schedule.episodes_per_step * schedule.steps),
        shape, **options,
    )  # fmt: skip
    estimate = Estimate(
        [run],
        environment=config.environment_config(1),
        title=title,
        shape=shape,
        budget=("max_env_cost", config.max_env_cost) if getattr(config, "max_env_cost", None) else None,
        calls_cap=("max_env_calls", config.max_env_calls) if getattr(config, "max_env_calls", None) else None,
        unit="generation step",
        units=schedule.steps,
    )
    s = step.spend
    estimate.header = [
        (
            "schedule",
            f"{schedule.rows:,} questions · {schedule.steps:,} generation steps of {schedule.questions_per_step:,} "
            f"questions × {config.num_generations} = {schedule.episodes_per_step:,} episodes · "
            f"{schedule.optimizer_steps:,} optimizer steps on {config.world_size} process(es)",
        ),
        (
            "per step",
            f"{s['expected'].env_calls:,.0f} environment calls expected, at most {s['high'].env_calls:,.0f} · "
            f"low {format_usd(s['low'].usd)} · expected {format_usd(s['expected'].usd)} · high {format_usd(s['high'].usd)}",
        ),
    ]
    estimate.notes.append("the agent is the model being trained: its tokens cost nothing")
    estimate.step = step
    return estimate
