"""The synchronous GRPO trainer: TRL's `GRPOTrainer` with the LangGraph loop as its `rollout_func`.

    config = PromptR1GRPOConfig(output_dir="runs/tiny", model_name_or_path="path/to/model", env_base_url=...)
    trainer = build_trainer(config)          # TRL GRPOTrainer with GraphRollout and the double-constrained reward
    trainer.train()

`prompt-r1 train --config training/configs/<recipe>.yaml [--field value ...]` does the same from a recipe
(`prompt_r1.training.run.train`), under `accelerate launch` for several processes (DeepSpeed ZeRO-2/3 configs in
training/accelerate/).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.training.shared.lora import peft_config
from prompt_r1.training.shared.rewards import reward_functions
from prompt_r1.training.shared.rows import check_rows_per_step, load_training_rows
from prompt_r1.training.sync.config import PromptR1GRPOConfig
from prompt_r1.training.sync.rollout import GraphRollout

__all__ = ["build_trainer"]


def build_trainer(
    config: PromptR1GRPOConfig,
    *,
    environment: Any = None,
    train_rows: list[dict[str, Any]] | None = None,
    callbacks: list | None = None,
    rollout: Callable[..., GraphRollout] = GraphRollout,
):
    """A `trl.GRPOTrainer` whose generations are Prompt-R1 episodes of the LangGraph loop.

    environment: an EnvironmentClient or LangChain chat model; default: one built from the config's env_* fields.
    train_rows: rows with `prompt` and `golden_answers`; default: `config.train_data`.
    rollout: the rollout's class (or a factory), called as `rollout(environment, loop=...,
        train_on_environment_tokens=...)`: a task that changes between steps subclasses `GraphRollout`
        (prompt_r1.tasks.door_training.DoorRollout).
    """
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.agents.model_source import check_model_source
    from prompt_r1.training.shared import spend

    if getattr(config, "async_grpo", False):
        raise ConfigError(
            "this config is the async trainer's: build it with "
            "prompt_r1.training.asynchronous.trainer.build_async_trainer (or train(config))"
        )
    if environment is None:
        # A built-in environment model with no base URL: served on 127.0.0.1 by this process.
        environment = config.environment_client()
    environment = spend.paid_environment(config, environment)  # priced; recorded in the call ledger
    if train_rows is None:
        train_rows = load_training_rows(config.resolved_train_data(), limit=config.max_train_samples)
    check_rows_per_step(config, len(train_rows))
    check_model_source(config.model_name_or_path, "model_name_or_path")
    config.model_name_or_path = resolve_model(config.model_name_or_path)  # a built-in model: its folder
    if config.model_init_kwargs is None:
        config.model_init_kwargs = {}
    config.model_init_kwargs.setdefault("dtype", config.agent_dtype)
    if config.reward_weights is None:
        config.reward_weights = [1.0, 0.0, 0.0]
    tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if tokenizer.chat_template is None:
        raise ConfigError(f"the agent tokenizer of {config.model_name_or_path!r} has no chat template")
    rollout_func = rollout(
        environment, loop=config.loop_config(), train_on_environment_tokens=config.train_on_environment_tokens
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is the documented way in; no banner
    from prompt_r1.training.shared import progress
    from prompt_r1.training.sync.weight_sync import (
        file_weight_route,
        install_cpu_weight_sync,
        same_dtype_engine,
    )

    # A colocated engine computes as training does; a server without CUDA takes weights from a file.
    with same_dtype_engine(config.model_init_kwargs.get("dtype")), file_weight_route():
        trainer = GRPOTrainer(
            model=config.model_name_or_path,
            reward_funcs=reward_functions(config),
            args=config,
            train_dataset=Dataset.from_list(train_rows),
            processing_class=tokenizer,
            peft_config=peft_config(config),
            rollout_func=rollout_func,
            callbacks=callbacks,
        )
    progress.install(trainer)  # a line per step, curves.png at the end
    progress.time_scoring(trainer)  # the step line's scoring seconds
    spend.install(trainer, environment, config)  # env/cost per step; max_env_cost and max_env_calls
    install_cpu_weight_sync(trainer)  # without CUDA TRL's own sync cannot reach vLLM's (prepacked) weights
    if config.vllm_sync_check:
        from prompt_r1.core.tokens import initial_prompt_ids
        from prompt_r1.training.sync.weight_sync import install_sync_check

        # The first training prompt, continued by a fixed protocol turn the model need not have produced.
        prompt_ids = initial_prompt_ids(tokenizer, train_rows[0]["prompt"])
        continuation = tokenizer.encode(
            "<think>check</think><interaction_prompt>What is asked?</interaction_prompt>",
            add_special_tokens=False,
        )
        install_sync_check(trainer, prompt_ids, continuation)
    from prompt_r1.training.shared import step_clock

    # The step line's inputs, training and other seconds; after the callbacks above, so their step-end work counts.
    step_clock.install(trainer)
    return trainer
