"""The tiny GRPO run that the tests and the step-time benchmark start from: the name task's protocol model
(`testing.tiny_models.build_protocol_model`), 4 prompts x a group of 4 per step, two-turn episodes on short budgets,
CPU only, nothing saved. Each user adds only what it is about (a test its output folder and the setting it
checks; `evals/bench/grpo_step.py` its batch, steps and learning rate).

    config = trainer_config(**{**TINY_GRPO, "output_dir": out, "model_name_or_path": model,
                               "env_base_url": url})
"""

from __future__ import annotations

from typing import Any

__all__ = ["TINY_GRPO"]

TINY_GRPO: dict[str, Any] = dict(
    env_model="env",
    env_api_key_env="PROMPT_R1_TEST_NO_KEY",  # a variable nobody sets: the tiny environment needs no key
    per_device_train_batch_size=4,
    num_generations=4,
    max_steps=2,
    max_turns=2,
    max_turn_tokens=24,
    max_total_tokens=96,
    learning_rate=1e-3,
    temperature=1.0,
    reward_preset="reference",
    logging_steps=1,
    report_to="none",
    use_cpu=True,
    save_strategy="no",
    seed=0,
)
