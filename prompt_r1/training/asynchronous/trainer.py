"""Asynchronous GRPO: TRL's `AsyncGRPOTrainer` with the LangGraph loop as its rollout worker.

    config = PromptR1AsyncGRPOConfig(..., max_staleness=2, vllm_server_base_url="http://127.0.0.1:8000")
    trainer = build_async_trainer(config)     # `prompt-r1 train --async` / `async: true` in a recipe
    trainer.train()

The trainer trains while the worker (`prompt_r1.training.asynchronous.worker.GraphRolloutWorker`) keeps episodes flowing
against a vLLM server, which serves the agent and takes the trainer's weights after every step
(`prompt_r1.training.asynchronous.weight_transfer`). Samples older than `max_staleness` policy versions are dropped; the rest
are trained with TRL's clipped importance ratio against the log-probabilities they were sampled with.

The config is the trainer's own, `PromptR1AsyncGRPOConfig` (TRL's `AsyncGRPOConfig` with the Prompt-R1 fields),
handed to TRL as it is: the settings of the synchronous trainer it does not have (a KL term `beta`, other loss
types, several iterations per batch, the colocated engine, DeepSpeed, ...) were refused when it was built.

On CPU two of TRL's GPU assumptions are replaced: the tree attention's flash-attention kernel
(`prompt_r1.training.asynchronous.on_cpu`) and the NCCL weight transfer (`FileWeightTransfer`); mixed precision is
the config's `bf16`, as for the sync trainer.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request
from functools import partial
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig

__all__ = ["build_async_trainer"]


ROLLOUT_STATE = "rollout_state.json"


def trainer_class() -> type:
    """TRL's `AsyncGRPOTrainer`, saving and restoring the Prompt-R1 worker's place with each checkpoint as TRL does
    for its own worker (TRL's checks `isinstance(worker, AsyncRolloutWorker)`): the first group not trained yet and
    the policy version, in `checkpoint-N/rollout_state.json`. Without it a resumed run starts again at the first
    row with policy version 0."""
    import itertools

    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker

    class PromptR1AsyncTrainer(AsyncGRPOTrainer):
        def _save_checkpoint(self, model, trial):
            worker = self.rollout_worker
            if self.accelerator.is_main_process and isinstance(worker, GraphRolloutWorker):
                folder = os.path.join(
                    self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
                )
                os.makedirs(folder, exist_ok=True)
                first = next(g for g in itertools.count(worker.start_group) if not self._spent(worker, g))
                with open(os.path.join(folder, ROLLOUT_STATE), "w") as handle:
                    json.dump({"prompt_index": first, "model_version": self.model_version}, handle)
            super()._save_checkpoint(model, trial)

        def _spent(self, worker: GraphRolloutWorker, group: int) -> bool:
            """Whether a resumed run should go past `group`: trained, or never to be trained (no scored episode,
            or sampled by a policy too old to be taken now: it is dropped as stale whenever its turn comes)."""
            if group in self._trained_groups:
                return True
            if group not in worker.finished:
                return False  # still to come, or in flight
            version = worker.finished[group]
            return version is None or self.model_version - version > self.args.max_staleness

        def _inner_training_loop(self, *args, **kwargs):
            worker, checkpoint = self.rollout_worker, kwargs.get("resume_from_checkpoint")
            if isinstance(worker, GraphRolloutWorker):
                worker.start_group = self._groups_before_resume = 0
                state = os.path.join(checkpoint, ROLLOUT_STATE) if checkpoint else None
                if state is not None and os.path.isfile(state):
                    with open(state) as handle:
                        saved = json.load(handle)
                    worker.start_group = self._groups_before_resume = int(saved["prompt_index"])
                    self.model_version = int(saved.get("model_version", 0))
                    worker.update_model_version(self.model_version)
                elif state is not None:
                    raise ConfigError(
                        f"{checkpoint} has no {ROLLOUT_STATE}, which the async trainer saves with every checkpoint "
                        "(the synchronous trainer does not): resume it without --async, or start a new output_dir"
                    )
            return super()._inner_training_loop(*args, **kwargs)

    return PromptR1AsyncTrainer


def _served_model(base_url: str, timeout: float = 30.0) -> str:
    """The name the vLLM server at `base_url` serves its model under (its first `/v1/models` entry)."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=timeout) as response:
            return json.loads(response.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        from prompt_r1.training.shared.vllm_reload import server_start_command

        raise ConfigError(
            f"no vLLM server answers at {base_url} ({exc}): the async trainer's agent is served by one; start it "
            f"as {server_start_command()} and set vllm_server_base_url"
        ) from None


def build_async_trainer(
    config: PromptR1AsyncGRPOConfig,
    *,
    environment: Any = None,
    train_rows: list[dict[str, Any]] | None = None,
    callbacks: list | None = None,
    worker_options: dict[str, Any] | None = None,
    file_weights: bool = False,
):
    """An `AsyncGRPOTrainer` whose rollouts are Prompt-R1 episodes (see the module docstring). `environment`,
    `train_rows` and `callbacks` as for `build_trainer`; `worker_options`: more keywords for the worker;
    `file_weights`: sync through a file on CUDA too (a vLLM server sharing the trainer's GPU)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the documented way in; no banner
    from datasets import Dataset
    from transformers import AutoTokenizer

    from prompt_r1.agents.model_source import check_model_source
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.runs.metering import environment_cost
    from prompt_r1.training.asynchronous import on_cpu
    from prompt_r1.training.asynchronous.weight_transfer import weight_transfer_for
    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker
    from prompt_r1.training.shared import progress
    from prompt_r1.training.shared.lora import peft_config
    from prompt_r1.training.shared.rewards import reward_functions
    from prompt_r1.training.shared.rows import load_training_rows
    from prompt_r1.training.shared.trajectories import Trajectories

    if not getattr(config, "async_grpo", False):
        raise ConfigError(
            "this config is the synchronous trainer's: build PromptR1AsyncGRPOConfig (or "
            "trainer_config(async_grpo=True, ...)) for the async trainer"
        )
    args = config
    if environment is None:
        environment = EnvironmentClient(config.environment_config(num_processes=config.world_size))
    if train_rows is None:
        train_rows = load_training_rows(config.resolved_train_data(), limit=config.max_train_samples)
    check_model_source(config.model_name_or_path, "model_name_or_path")
    tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if tokenizer.chat_template is None:
        raise ConfigError(f"the agent tokenizer of {config.model_name_or_path!r} has no chat template")
    root = config.vllm_server_base_url.rstrip("/").removesuffix("/v1")
    agent = ServedAgent(
        AgentConfig(
            model=_served_model(root),
            base_url=f"{root}/v1",
            tokenizer=config.model_name_or_path,
            token_exact="on",
            temperature=config.temperature,
            top_p=config.top_p,
            max_new_tokens=config.max_turn_tokens,
        ),
        max_in_flight=1024,
    )
    rows = list(train_rows)
    # TRL's async config has no shuffle_dataset (its own loader does not shuffle); the rows are shuffled from the
    # seed as the synchronous trainer's sampler does, unless a config says otherwise.
    if getattr(config, "shuffle_dataset", True):
        random.Random(config.seed).shuffle(rows)
    rollout = Trajectories(
        environment, loop=config.loop_config(), train_on_environment_tokens=config.train_on_environment_tokens
    )
    worker = GraphRolloutWorker(
        rows,
        agent=agent,
        environment=environment,
        rollout=rollout,
        rewards=reward_functions(config),
        num_generations=config.num_generations,
        max_inflight=lambda: args.max_inflight_tasks,  # the trainer's constructor resolves it (-1: auto)
        queue_maxsize=args.queue_maxsize,
        # The same price table as the synchronous trainer's env/cost (--prices over the bundled one).
        price=partial(environment_cost, prices=PriceTable.load(config.prices)),
        **(worker_options or {}),
    )
    import torch

    device = "cuda" if torch.cuda.is_available() and not config.use_cpu else "cpu"
    with on_cpu.cpu_trainer(device):
        trainer = trainer_class()(
            model=config.model_name_or_path,
            reward_funcs=None,  # the worker scores its groups itself
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=callbacks,
            peft_config=peft_config(config),
            rollout_worker=worker,
            weight_transfer=weight_transfer_for(device, root, config.output_dir, file=file_weights),
        )
    on_cpu.install(trainer.accelerator.device)
    progress.install(trainer)
    return trainer
