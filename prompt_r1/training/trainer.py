"""Building and running the GRPO trainer for the agent, and merging a trained LoRA adapter.

    config = PromptR1GRPOConfig(output_dir="runs/tiny", model_name_or_path="path/to/model", env_base_url=...)
    trainer = build_trainer(config)          # TRL GRPOTrainer with GraphRollout and the double-constrained reward
    trainer.train()

`prompt-r1 train --config training/configs/<recipe>.yaml [--field value ...]` does the same from a recipe, under
`accelerate launch` for several processes (DeepSpeed ZeRO-2/3 configs in training/accelerate/).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError, DataError
from prompt_r1.core.prompts import question_message
from prompt_r1.training.config import PromptR1GRPOConfig
from prompt_r1.training.rollout import GraphRollout

__all__ = ["build_trainer", "load_training_rows", "merge_adapter", "reward_functions", "train"]


def load_training_rows(source: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows for the trainer: the agent's first message as the prompt, the golden answers as a reward column."""
    from prompt_r1.data.datasets import load_samples

    samples = load_samples(source, limit=limit)
    if not samples:
        raise DataError(f"{source} has no training rows")
    return [
        {
            "prompt": [{"role": "user", "content": question_message(s.question)}],
            "golden_answers": list(s.golden_answers),
            "id": s.id,
            "data_source": s.dataset,
        }
        for s in samples
    ]


def reward_functions(config: PromptR1GRPOConfig) -> list:
    """The total reward, then its format and answer parts (weight 0: logged, not trained on)."""
    from prompt_r1.scoring.rewards import trl_reward

    coefficients = config.reward_coefficients()
    return [trl_reward(config.reward_preset, part, **coefficients) for part in ("total", "format", "answer")]


def _peft_config(config: PromptR1GRPOConfig):
    if not config.use_peft:
        return None
    from peft import LoraConfig

    targets = config.lora_target_modules
    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        task_type="CAUSAL_LM",
    )


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

    from prompt_r1.agents.model_source import check_model_source
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.training import spend
    from prompt_r1.training.checks import check_training_config

    # The same checks as `prompt-r1 train`'s, for a config built in Python: a bad number is one line naming the
    # field here, not a traceback deep in TRL or torch minutes later.
    check_training_config(config, train_data=train_rows is None)
    from prompt_r1.training.trainer_keys import check_trainer_keys

    if config.async_grpo:
        raise ConfigError(
            "async_grpo is on: build the trainer with prompt_r1.training.async_trainer.build_async_trainer "
            "(train(config, build=build_async_trainer))"
        )
    check_trainer_keys(config)  # max_staleness belongs to the async trainer
    if environment is None:
        environment = EnvironmentClient(config.environment_config(num_processes=config.world_size))
    environment = spend.paid_environment(config, environment)  # priced; recorded in the call ledger
    if train_rows is None:
        train_rows = load_training_rows(config.resolved_train_data(), limit=config.max_train_samples)
    check_model_source(config.model_name_or_path, "model_name_or_path")
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
    from prompt_r1.training import progress
    from prompt_r1.training.vllm_sync import file_weight_route, install_cpu_weight_sync, same_dtype_engine

    # A colocated engine computes as training does; a server without CUDA takes weights from a file.
    with same_dtype_engine(config.model_init_kwargs.get("dtype")), file_weight_route():
        trainer = GRPOTrainer(
            model=config.model_name_or_path,
            reward_funcs=reward_functions(config),
            args=config,
            train_dataset=Dataset.from_list(train_rows),
            processing_class=tokenizer,
            peft_config=_peft_config(config),
            rollout_func=rollout_func,
            callbacks=callbacks,
        )
    progress.install(trainer)  # a line per step, curves.png at the end
    spend.install(trainer, environment, config)  # env/cost per step; max_env_cost and max_env_calls
    install_cpu_weight_sync(trainer)  # without CUDA TRL's own sync cannot reach vLLM's (prepacked) weights
    if config.vllm_sync_check:
        from prompt_r1.core.tokens import initial_prompt_ids
        from prompt_r1.training.vllm_sync import install_sync_check

        # The first training prompt, continued by a fixed protocol turn the model need not have produced.
        prompt_ids = initial_prompt_ids(tokenizer, train_rows[0]["prompt"])
        continuation = tokenizer.encode(
            "<think>check</think><interaction_prompt>What is asked?</interaction_prompt>",
            add_special_tokens=False,
        )
        install_sync_check(trainer, prompt_ids, continuation)
    return trainer


def train(
    config: PromptR1GRPOConfig,
    *,
    resume: bool = False,
    build: Callable[..., Any] | None = None,
    **build_kwargs: Any,
) -> Any:
    """Train and save the agent (or its adapter) to `config.output_dir`; `resume` continues from the last checkpoint.
    `build`: the trainer's builder (default `build_trainer`; `build_async_trainer` for `async_grpo`). Ctrl-C or
    SIGTERM stops after the step in flight with a checkpoint of it (`prompt_r1.training.graceful_stop`); the model
    is then not saved to output_dir, and `graceful_stop_of(trainer)` says which signal, step and checkpoint.
    A second run on the same output_dir while this one runs is refused (`OutputError`)."""
    from prompt_r1.runs.output_lock import hold_output

    # One run per output folder, held to the end: a second is refused before a model loads or a call is paid. The
    # ranks of one run share the folder, so its first process alone holds the lock (a refused rank 0 ends the
    # launch).
    with (
        hold_output(config.output_dir, "output_dir", folder=True)
        if config.process_index == 0
        else nullcontext()
    ):
        return _train(config, resume, build, build_kwargs)


def _train(
    config: PromptR1GRPOConfig, resume: bool, build: Callable[..., Any] | None, build_kwargs: dict
) -> Any:
    """`train`, with the output folder held."""
    from transformers.trainer_utils import get_last_checkpoint

    from prompt_r1.training.graceful_stop import GracefulStop

    checkpoint = config.resume_from_checkpoint
    if resume and checkpoint is None:
        if Path(config.output_dir).is_dir():
            checkpoint = get_last_checkpoint(config.output_dir)
        if checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint-* folder in {config.output_dir}")
    if checkpoint is not None:  # a damaged file is one line now, not a traceback once the model has loaded
        from prompt_r1.training.ledger import ledger_path
        from prompt_r1.training.resume import check_ledger_for_resume, check_resume_checkpoint

        check_resume_checkpoint(checkpoint)
        if config.call_ledger:
            check_ledger_for_resume(checkpoint, ledger_path(config.output_dir, config.process_index))
    trainer = (build or build_trainer)(config, **build_kwargs)
    if checkpoint is not None:
        from prompt_r1.training.spend import check_resumed_ledger

        check_resumed_ledger(trainer, checkpoint)  # fewer calls than the checkpoint logged: one line, no step
    stop = GracefulStop.install(trainer)  # Ctrl-C / SIGTERM: finish the step, save a checkpoint, stop
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        stop.uninstall()
    if stop.step is not None:  # the checkpoint is the result; a grace period is no time for a second save
        return trainer
    trainer.save_model(config.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(config.output_dir)
    return trainer


def merge_adapter(
    adapter: str | Path, out: str | Path, *, base: str | None = None, dtype: str = "auto"
) -> Path:
    """Merge a LoRA adapter into its base model and save a plain model folder (what `vllm serve` and the agent
    backends load), with the tokenizer."""
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise ConfigError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    base = base or PeftConfig.from_pretrained(adapter).base_model_name_or_path
    if not base:
        raise ConfigError(f"{adapter} does not name its base model; pass --base")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    out = Path(out)
    merged.save_pretrained(out)
    tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
    return out
