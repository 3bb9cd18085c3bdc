"""Asynchronous GRPO: TRL's `AsyncGRPOTrainer` with the LangGraph loop as its rollout worker.

    config = PromptR1AsyncGRPOConfig(..., max_staleness=2, vllm_server_base_url="http://127.0.0.1:8000")
    trainer = build_async_trainer(config)     # `prompt-r1 train --async` / `async: true` in a recipe
    trainer.train()

The trainer trains while the worker (`prompt_r1.training.asynchronous.worker.GraphRolloutWorker`) keeps episodes flowing
against a vLLM server, which serves the agent and takes the trainer's weights after every step
(`prompt_r1.training.asynchronous.weight_transfer`). Samples older than `max_staleness` policy versions are dropped; the rest
are trained with TRL's clipped importance ratio against the log-probabilities they were sampled with.

The config is the trainer's own, `PromptR1AsyncGRPOConfig` (TRL's `AsyncGRPOConfig` with the Prompt-R1 fields),
handed to TRL as it is: the settings of the synchronous trainer it does not have (other loss types, several
iterations per batch, the colocated engine, DeepSpeed, ...) were refused when it was built. The synchronous
trainer's KL term (`beta`), which TRL's async trainer does not have, is added to its loss
(`prompt_r1.training.asynchronous.reference`). The environment is priced, counted and recorded in the call ledger
for the spend caps (`prompt_r1.training.asynchronous.spend`). A vLLM server that loaded another model than
`model_name_or_path` is refused before anything loads.

Across processes (`accelerate launch --config_file training/accelerate/fsdp2.yaml`) TRL shards with FSDP2: rank 0
runs the worker and sends the weights, each parameter gathered once across the ranks; the model is saved whole
by rank 0 the same way (`save_model`).

On CPU two of TRL's GPU assumptions are replaced: the tree attention's flash-attention kernel
(`prompt_r1.training.asynchronous.on_cpu`) and the NCCL weight transfer (`FileWeightTransfer`); mixed precision is
the config's `bf16`, as for the sync trainer.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from functools import partial
from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig

__all__ = ["build_async_trainer", "same_model"]


ROLLOUT_STATE = "rollout_state.json"


def trainer_class() -> type:
    """TRL's `AsyncGRPOTrainer`, saving and restoring the Prompt-R1 worker's place with each checkpoint as TRL does
    for its own worker (TRL's checks `isinstance(worker, AsyncRolloutWorker)`): the first group not trained yet and
    the policy version, in `checkpoint-N/rollout_state.json`. Without it a resumed run starts again at the first
    row with policy version 0."""
    import itertools

    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from prompt_r1.training.asynchronous.reference import ReferencePolicy
    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker
    from prompt_r1.training.shared.step_clock import StepClock

    class PromptR1AsyncTrainer(AsyncGRPOTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The KL term to the starting policy (`beta`), which TRL's async trainer does not have.
            self.reference = ReferencePolicy(self) if getattr(self.args, "beta", 0.0) else None
            # Where each step's seconds went, for the step lines (after TRL's callbacks: see StepClock).
            self.step_clock = StepClock(self._metrics["train"])
            self.add_callback(self.step_clock)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.reference is None:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            with self.reference.capture(model) as seen:  # the policy's forward, run once, by TRL's loss
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss + self.reference.kl_loss(model, inputs, seen)

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

        def _sync_weight(self):
            started = time.monotonic()
            try:
                self._sync_weight_now()
            finally:
                self.step_clock.synced(time.monotonic() - started)

        def _sync_weight_now(self):
            transfer, worker = self.weight_transfer, self.rollout_worker
            if worker is None or not hasattr(transfer, "when_new_weights"):
                return self._sync_weight_timed()
            # The file transfer may reload in the background while the next step trains: the worker stamps its
            # episodes with the new version only once the server samples with it (until then: the old policy).
            own = vars(worker).get("update_model_version")  # an instance's own, if it has one: put back after
            update = worker.update_model_version
            worker.update_model_version = lambda version: transfer.when_new_weights(lambda: update(version))
            try:
                self._sync_weight_timed()
            finally:
                if own is not None:
                    worker.update_model_version = own
                else:
                    del worker.update_model_version  # the method again

        def _sync_weight_timed(self):
            # The server takes no request from the pause to the resume: the worker's idle clock counts it. The
            # file transfer says when it pauses (only for the reload); TRL's NCCL one pauses for the whole sync.
            clock = getattr(self.rollout_worker, "idle", None)
            if clock is None or hasattr(self.weight_transfer, "on_pause"):
                if clock is not None:
                    self.weight_transfer.on_pause = clock.paused
                return super()._sync_weight()
            clock.paused(True)
            try:
                super()._sync_weight()
            finally:
                clock.paused(False)

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
                    self._say_resume_cost(worker.start_group)
                elif state is not None:
                    raise ConfigError(
                        f"{checkpoint} has no {ROLLOUT_STATE}, which the async trainer saves with every checkpoint "
                        "(the synchronous trainer does not): resume it without --async, or start a new output_dir"
                    )
            return super()._inner_training_loop(*args, **kwargs)

        def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
            """Under FSDP2, the model saved whole by the main process, each parameter gathered once across the
            ranks (every rank takes part in each gather, in the same order). transformers' own FSDP2 save hands
            `save_pretrained` a state dict in which tied weights are still sharded, and the main process alone then
            gathers them: a collective the other ranks never join."""
            if not self.accelerator.is_fsdp2:
                return super().save_model(output_dir, _internal_call)
            from torch.distributed.tensor import DTensor

            full: dict[str, Any] = {}
            gathered: dict[int, Any] = {}  # tied weights: one gather, one tensor
            for name, tensor in self.accelerator.unwrap_model(self.model).state_dict().items():
                if id(tensor) not in gathered:
                    value = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                    gathered[id(tensor)] = value.detach().to("cpu") if self.args.should_save else None
                full[name] = gathered[id(tensor)]
            if self.args.should_save:
                self._save(output_dir or self.args.output_dir, state_dict=full)

        def _say_resume_cost(self, first_group: int) -> None:
            """Print, on the main process, what the resume plays (and pays) again (`spend.resume_cost`)."""
            import sys

            from prompt_r1.training.asynchronous.spend import AsyncSpendCap, resume_cost

            cap = next((c for c in self.callback_handler.callbacks if isinstance(c, AsyncSpendCap)), None)
            if cap is None or not self.accelerator.is_main_process:
                return
            line = resume_cost(cap.environment, first_group) or (
                f"resuming at group {first_group} without a call ledger: the calls paid after the checkpoint are "
                "not in the spend total, and the groups they belonged to are played and paid again"
            )
            print(f"prompt-r1: {line}", file=sys.stderr)

    return PromptR1AsyncTrainer


def _served_model(base_url: str, model: str | None = None, timeout: float = 30.0) -> str:
    """The name the vLLM server at `base_url` serves its model under (its first `/v1/models` entry). With `model`
    (the trainer's `model_name_or_path`), refuse a server that loaded another model: the trainer's weights would
    go to a model of another shape, or train a policy the server does not sample from."""
    from prompt_r1.training.shared.vllm_reload import server_start_command

    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=timeout) as response:
            entry = json.loads(response.read())["data"][0]
            name = entry["id"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ConfigError(
            f"no vLLM server answers at {base_url} ({exc}): the async trainer's agent is served by one; start it "
            f"as {server_start_command()} and set vllm_server_base_url"
        ) from None
    loaded = entry.get("root")  # where vLLM loaded it from (a server that does not say is taken at its word)
    if model is not None and loaded and not same_model(str(loaded), str(model)):
        raise ConfigError(
            f"the vLLM server at {base_url} serves {loaded}, but the trainer trains {model}: start the server on "
            f"the trainer's model ({server_start_command()}, with {model}), or set model_name_or_path to its model"
        )
    return name


def same_model(served: str, trained: str) -> bool:
    """Whether the server's model is the trainer's: the same folder or hub id, or a copy of the same folder (its
    config.json the same)."""
    from pathlib import Path

    if served == trained:
        return True
    a, b = Path(served), Path(trained)
    if not (a.is_dir() and b.is_dir()):
        return False
    if a.resolve() == b.resolve():
        return True
    try:
        return json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())
    except (OSError, ValueError):
        return False


def worker_headroom(config: PromptR1AsyncGRPOConfig) -> int:
    """The samples of `max_inflight_tasks` the rollout worker keeps free (`GraphRolloutWorker(headroom=...)`): one
    step's samples when TRL sizes the bound (`max_inflight_tasks` -1: max_staleness steps), none when the user set
    it. Read before the trainer is built: TRL's constructor replaces -1 with the number."""
    if config.max_inflight_tasks >= 0:
        return 0
    return config.per_device_train_batch_size * config.gradient_accumulation_steps * config.world_size


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

    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.agents.model_source import check_model_source
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.runs.metering import environment_cost
    from prompt_r1.training.asynchronous import on_cpu, spend
    from prompt_r1.training.asynchronous.weight_transfer import weight_transfer_for
    from prompt_r1.training.asynchronous.worker import GraphRolloutWorker
    from prompt_r1.training.shared import progress
    from prompt_r1.training.shared.lora import peft_config
    from prompt_r1.training.shared.rewards import reward_functions
    from prompt_r1.training.shared.rows import load_training_rows
    from prompt_r1.training.shared.spend import paid_environment
    from prompt_r1.training.shared.trajectories import Trajectories

    if not getattr(config, "async_grpo", False):
        raise ConfigError(
            "this config is the synchronous trainer's: build PromptR1AsyncGRPOConfig (or "
            "trainer_config(async_grpo=True, ...)) for the async trainer"
        )
    args = config
    check_model_source(config.model_name_or_path, "model_name_or_path")
    config.model_name_or_path = resolve_model(config.model_name_or_path)  # a built-in model: its folder
    root = config.vllm_server_base_url.rstrip("/").removesuffix("/v1")
    served = _served_model(root, config.model_name_or_path)  # before anything loads
    if environment is None:
        # A built-in environment model with no base URL: served on 127.0.0.1 by this process.
        environment = config.environment_client()
    # Priced and counted for the spend caps, every call the worker pays for; recorded in this process's ledger.
    environment = paid_environment(config, environment)
    if train_rows is None:
        train_rows = load_training_rows(config.resolved_train_data(), limit=config.max_train_samples)
    tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if tokenizer.chat_template is None:
        raise ConfigError(f"the agent tokenizer of {config.model_name_or_path!r} has no chat template")
    agent = ServedAgent(
        AgentConfig(
            model=served,
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
        **{"headroom": worker_headroom(config), **(worker_options or {})},
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
    spend.install(trainer, environment, config, worker)  # env/cost per step; max_env_cost and max_env_calls
    # The step clock last among the callbacks: what the others do at a step's end (the spend cap draining the worker
    # at the last step) is then in that step's time, as it is in the step line's.
    trainer.pop_callback(trainer.step_clock)
    trainer.add_callback(trainer.step_clock)
    return trainer
