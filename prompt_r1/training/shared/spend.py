"""What training spends on the environment, step by step, and the cap that stops it cleanly.

`install(trainer, environment, config)` puts a `SpendCap` callback on the trainer. After every optimizer step it
takes the step's counters from the `LedgerEnvironment` of each process, sums them over the processes, and adds them
to the trainer's metrics (`env/cost`, `env/calls`, `env/tokens_in`, `env/tokens_out`, `env/replayed_calls`, and the
run's totals `env/total_cost`, `env/total_calls`), which the step lines print as `$0.0123 this step, $1.84 total`.

The run's total is what was paid over every restart: the sum of the processes' ledgers when there is one, else the
total the resumed checkpoint logged plus what this run paid (calls paid after that checkpoint and before a crash
are then unknown, and paid again).

`max_env_cost` / `max_env_calls`: after each step, when the total plus the mean of the last steps (the estimate of
the next one) would pass a cap, the callback asks the trainer to save a checkpoint and stop; `stop_reason(trainer)`
then says why, and `prompt-r1 train` prints it and exits with `EXIT_SPEND_CAP`. The cap is checked between steps
only: a step that passes it because the estimate was low is finished, never cut with half its batch paid. A run
resumed with a higher cap goes on; one resumed at a cap already reached stops before its first step
(`SpendCapReached`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from prompt_r1.core.errors import PromptR1Error
from prompt_r1.training.shared.ledger import LedgerEnvironment

__all__ = [
    "ESTIMATE_STEPS",
    "SpendCap",
    "SpendCapReached",
    "check_resumed_ledger",
    "install",
    "paid_environment",
    "stop_reason",
]

# Steps whose mean estimates the next one's cost and calls.
ESTIMATE_STEPS = 3


class SpendCapReached(PromptR1Error):
    """A run resumed at a cap it had already reached: no step was run."""


class SpendCap(TrainerCallback):
    """Spend metrics per step, and the stop before a step would pass `max_env_cost` or `max_env_calls`."""

    def __init__(
        self,
        trainer: Any,
        environment: LedgerEnvironment,
        *,
        max_cost: float | None = None,
        max_calls: int | None = None,
    ) -> None:
        self.trainer, self.environment = trainer, environment
        self.max_cost, self.max_calls = max_cost, max_calls
        self.base = {"cost": 0.0, "calls": 0.0}  # without a ledger: the totals of the checkpoint resumed from
        # Without a ledger: paid by these processes since they started.
        self.run_total = {"cost": 0.0, "calls": 0.0}
        self.steps: list[tuple[float, float]] = []  # (cost, calls) per step, all processes
        self.stopped: str | None = None
        self.saved: Path | None = None  # the checkpoint saved at the stop

    # -- totals -------------------------------------------------------------------------------------------------
    def _sum(self, values: list[float]) -> list[float]:
        import torch

        accelerator = self.trainer.accelerator
        local = torch.tensor(values, dtype=torch.float64, device=accelerator.device)
        if accelerator.num_processes > 1:
            local = accelerator.reduce(local, reduction="sum")
        return local.tolist()

    def _totals(self) -> dict[str, float]:
        ledger = self.environment.ledger
        if ledger is None:
            return {k: self.base[k] + self.run_total[k] for k in ("cost", "calls")}
        mine = ledger.totals()
        cost, calls = self._sum([mine["cost"], float(mine["calls"])])
        return {"cost": cost, "calls": calls}

    # -- callbacks ----------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        logged = [row for row in state.log_history if "env/cost" in row]
        self.steps = [(row["env/cost"], row.get("env/calls", 0.0)) for row in logged]
        if logged:
            last = logged[-1]
            self.base = {"cost": last.get("env/total_cost", 0.0), "calls": last.get("env/total_calls", 0.0)}
            self._check_ledger(last.get("env/total_calls", 0.0), state.global_step, args.output_dir)
        self._before_training()
        if state.global_step >= state.max_steps:
            return
        reason = self._over(self._totals(), state)
        if reason is not None:
            self.stopped = reason
            raise SpendCapReached(
                f"nothing run: {reason} at step {state.global_step} (the run's last checkpoint); "
                "resume with a higher cap to go on"
            )

    def _before_training(self) -> None:
        self.environment.take()  # calls made before training (none in a normal run) belong to no step

    def _check_ledger(self, logged_calls: float, step: int, output_dir: str) -> None:
        """A ledger only grows, so one holding fewer calls than the checkpoint logged as paid lost some (deleted
        and made anew, its write-ahead log lost, another file put in its place): trusted, it would pay them again
        and restart the spend total below what was spent. Every process sees the same sums, so all refuse."""
        ledger = self.environment.ledger
        if ledger is None:
            return
        held = self._totals()["calls"]
        if held < logged_calls:
            from prompt_r1.training.shared.ledger import LEDGER_FOLDER, LedgerError

            where = (
                ledger.path
                if self.trainer.accelerator.num_processes == 1
                else Path(output_dir) / LEDGER_FOLDER
            )
            raise LedgerError(
                f"{where} holds {held:.0f} calls, but step {step} (the checkpoint resumed from) logged {logged_calls:.0f} "
                "paid: it is not this run's whole ledger; restore it, or resume with call_ledger false (the spend "
                "total then comes from the checkpoint's log, and calls after it are paid again)"
            )

    def on_step_end(self, args, state, control, **kwargs):
        spend = self.environment.take()
        calls, replayed, tokens_in, tokens_out, cost, unpriced = self._sum(spend.as_list())
        self.run_total["calls"] += calls  # used without a ledger only, where nothing is replayed
        self.run_total["cost"] += cost
        totals = self._totals()
        self.steps.append((cost, calls))
        metrics = getattr(self.trainer, "_metrics", None)
        if metrics is not None:
            step_cost = math.nan if unpriced else cost
            total_cost = math.nan if unpriced else totals["cost"]
            for key, value in (
                ("env/cost", step_cost),
                ("env/calls", calls),
                ("env/replayed_calls", replayed),
                ("env/tokens_in", tokens_in),
                ("env/tokens_out", tokens_out),
                ("env/total_cost", total_cost),
                ("env/total_calls", totals["calls"]),
            ):
                metrics["train"][key].append(value)
        if state.global_step >= state.max_steps:
            return
        reason = self._over(totals, state)
        if reason is not None:
            self.stopped = f"{reason}; stopped after step {state.global_step} of {state.max_steps}"
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped is not None:
            self.saved = Path(args.output_dir) / f"checkpoint-{state.global_step}"

    def _over(self, totals: dict[str, float], state: Any) -> str | None:
        """Why the next step must not start, or None: a cap reached, or one the next step would pass."""
        recent = self.steps[-ESTIMATE_STEPS:]
        for name, cap, index, total, money in (
            ("max_env_cost", self.max_cost, 0, totals["cost"], True),
            ("max_env_calls", self.max_calls, 1, totals["calls"], False),
        ):
            if cap is None:
                continue
            estimate = sum(step[index] for step in recent) / len(recent) if recent else 0.0
            show = (lambda v: f"${v:.4f}") if money else (lambda v: f"{v:.0f} calls")
            if total >= cap:
                return f"{name} {cap:g} reached: {show(total)} spent"
            if total + estimate > cap:
                return (
                    f"{name} {cap:g}: {show(total)} spent, and the next step (about {show(estimate)}, the mean of "
                    f"the last {len(recent)}) would pass it"
                )
        return None


def paid_environment(config: Any, environment: Any) -> LedgerEnvironment:
    """The rollout's environment, priced from the shared price table and, with `config.call_ledger`, recorded in
    this process's ledger (opened, or refused in one line, here: before any model loads)."""
    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.clients.environment import as_environment
    from prompt_r1.runs.metering import check_budget_prices
    from prompt_r1.training.shared.ledger import CallLedger, ledger_path

    environment = as_environment(environment)
    prices = PriceTable.load(config.prices)
    if config.max_env_cost is not None:
        check_budget_prices(prices, environment, None)  # an unpriced model would never reach the cap
    ledger = None
    if config.call_ledger:
        rank = config.process_index
        identity = {
            "seed": config.seed,
            "processes": config.world_size,
            "rank": rank,
            "environment_model": getattr(environment, "model_name", None) or config.env_model,
        }
        ledger = CallLedger.open(ledger_path(config.output_dir, rank), identity)
    return LedgerEnvironment(environment, ledger, prices)


def check_resumed_ledger(trainer: Any, checkpoint: str | Path) -> None:
    """Refuse, before training begins (and its progress bar), to resume from `checkpoint` with ledgers that hold
    fewer calls than it logged as paid: the check `SpendCap` makes again when training begins."""
    from prompt_r1.training.shared.resume import TRAINER_STATE, logged_calls

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, SpendCap):
            step = json.loads((Path(checkpoint) / TRAINER_STATE).read_text(encoding="utf-8")).get(
                "global_step"
            )
            callback._check_ledger(logged_calls(checkpoint), step, trainer.args.output_dir)


def install(trainer: Any, environment: LedgerEnvironment, config: Any) -> SpendCap:
    cap = SpendCap(trainer, environment, max_cost=config.max_env_cost, max_calls=config.max_env_calls)
    trainer.add_callback(cap)
    return cap


def stop_reason(trainer: Any) -> str | None:
    """Why a cap stopped the trainer's run, or None when it ran to its end (or has no cap)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, SpendCap) and callback.stopped is not None:
            saved = f"; saved {callback.saved}" if callback.saved is not None else ""
            return callback.stopped + saved
    return None
