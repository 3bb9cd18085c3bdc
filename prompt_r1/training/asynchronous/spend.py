"""The spend caps under the async trainer: `max_env_cost` and `max_env_calls` hold while episodes keep flowing.

    cap = install(trainer, environment, config, worker)   # environment: the worker's LedgerEnvironment

The synchronous trainer pays for a step's episodes inside the step, so its cap (`prompt_r1.training.shared.spend`)
is checked between steps. The async rollout worker pays on its own clock: groups run while steps train, and a
group may end up trained or dropped as stale. Every call it pays for is counted all the same, since the counters
sit in the environment the worker calls (`LedgerEnvironment`), and step lines show `$ this step, $ total` as in
sync, "this step" being what the worker paid while the step ran.

The cap itself is held at the source. A group may make `num_generations x max_turns` calls. Before the worker
starts one, `AsyncSpendCap.may_start` checks that the calls paid, plus what the groups in flight and this one may
still make, stay within `max_env_calls` (a bound: the cap is never passed), and the same calls priced at the
dearest call seen so far within `max_env_cost` (an estimate, as the synchronous trainer's; until a first call is
priced, one group runs at a time). A refused group waits for one in flight to finish; with none in flight the
worker is capped. After each step the trainer stops, with a checkpoint, when the groups the next step still needs
(beyond the young samples queued and the groups in flight) cannot be afforded, or a cap is reached: the worker is
drained first (no group starts, those in flight finish and are counted), so the checkpoint's total holds every
call paid. `prompt-r1 train` then exits 4, as with the synchronous trainer. Should samples the worker could afford
be dropped as stale, leaving a step that no group will fill, the worker's health check says so in one line
(`SpendCapReached`), the last checkpoint being the run's.

The totals survive a resume: with the call ledger (`call_ledger`, on by default) every paid call is on disk before
its reply is used, keyed by its group, so even a killed run's total is exact; without it, from the checkpoint's log.
The ledger cannot replay an async run (its sampling is not reproducible), so a resume plays again the groups from
the checkpoint's first untrained one on: the groups that were queued or in flight and those trained after the
checkpoint. Only a call that asks exactly what it asked before (same group, episode, turn and messages) is answered
from the ledger; the others are paid again. `resume_cost` says what those groups had cost, the most the resume can
pay again, and the trainer prints it at resume.
"""

from __future__ import annotations

from typing import Any

from prompt_r1.training.shared.ledger import LedgerEnvironment
from prompt_r1.training.shared.spend import SpendCap

__all__ = ["AsyncSpendCap", "install", "resume_cost"]


class AsyncSpendCap(SpendCap):
    """`SpendCap` with the async worker's gate (`may_start`) and the stop that drains it."""

    def __init__(
        self, trainer: Any, environment: LedgerEnvironment, worker: Any, *, group_calls: int, **caps
    ):
        super().__init__(trainer, environment, **caps)
        self.worker, self.group_calls = worker, group_calls

    def _before_training(self) -> None:
        """Nothing to forget: the worker starts before this callback's train begin, and what it pays from then
        on is the first step's."""

    def _paid(self) -> tuple[float, float]:
        """(dollars, calls) paid so far by this process, all restarts (read on the worker's thread too)."""
        ledger = self.environment.ledger
        if ledger is not None:
            mine = ledger.totals()
            return mine["cost"], float(mine["calls"])
        pending = self.environment.pending()
        return (
            self.base["cost"] + self.run_total["cost"] + pending.cost,
            self.base["calls"] + self.run_total["calls"] + pending.calls,
        )

    def committed(self, running: set[int], more: int = 0) -> tuple[float, float]:
        """(dollars, calls) paid, plus what the groups in `running` may still spend, plus `more` new groups: a group
        may make `group_calls` calls, those it made are paid already. Between group starts this only falls."""
        cost, calls = self._paid()
        made = self.environment.by_step
        left = sum(max(0, self.group_calls - made.get(g, 0)) for g in running) + more * self.group_calls
        return cost + left * (self.environment.dearest or 0.0), calls + left

    def _why_not(self, running: set[int], more: int) -> str | None:
        """Why `more` groups cannot be afforded beside those `running` (None: they can)."""
        cost, calls = self.committed(running, more)
        spent_cost, spent_calls = self._paid()
        if self.max_calls is not None and calls > self.max_calls:
            return (
                f"max_env_calls {self.max_calls:g}: {spent_calls:.0f} calls paid, and the groups in flight and "
                f"{more} more may make {calls - spent_calls:.0f}"
            )
        if self.max_cost is not None:
            if spent_cost >= self.max_cost:
                return f"max_env_cost {self.max_cost:g} reached: ${spent_cost:.4f} spent"
            if self.environment.dearest is None:  # no price seen yet: one group at a time until one is
                return None if not running else "no call priced yet"
            if cost > self.max_cost:
                return (
                    f"max_env_cost {self.max_cost:g}: ${spent_cost:.4f} spent, and the groups in flight and {more} "
                    f"more may cost ${cost - spent_cost:.4f} (at the dearest call so far)"
                )
        return None

    def may_start(self, running: set[int]) -> str | None:
        """The worker's gate: why the next group must not start beside those `running`, or None when it may."""
        return self._why_not(running, 1)

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if self.stopped is None and state.global_step < state.max_steps:
            # Whether the next step can be filled within the cap: the groups it still needs (beyond the young
            # samples queued and the groups in flight) must be affordable, or the run stops here with a
            # checkpoint rather than wait for groups the worker may not start.
            per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            why = None
            if self.trainer.accelerator.is_main_process and (self.max_cost or self.max_calls):
                running = set(self.worker.running)
                short = per_step - self._usable() - len(running) * self.worker.num_generations
                need = max(0, -(-short // self.worker.num_generations))
                why = self.worker.capped or self._why_not(running, need)
            (stop,) = self._sum([float(why is not None)])
            if stop:
                reason = why or "the spend cap"  # the main process's reason; the others print nothing
                self.stopped = f"{reason}; stopped after step {state.global_step} of {state.max_steps}"
                control.should_save = True
                control.should_training_stop = True
        # The last step (max_steps, the epochs TRL counts, or a stop) drains: its checkpoint holds every call paid.
        if self.stopped is not None or control.should_training_stop or state.global_step >= state.max_steps:
            self._drain()

    def _over(self, totals: dict[str, float], state: Any) -> str | None:
        """Only a cap reached: the gate keeps the worker from starting what would pass it, so there is no next
        step to estimate (a step's cost is what the worker paid meanwhile, not what the step trained)."""
        for name, cap, total, show in (
            ("max_env_cost", self.max_cost, totals["cost"], f"${totals['cost']:.4f}"),
            ("max_env_calls", self.max_calls, totals["calls"], f"{totals['calls']:.0f} calls"),
        ):
            if cap is not None and total >= cap:
                return f"{name} {cap:g} reached: {show} spent"
        return None

    def _usable(self) -> int:
        """Samples in the worker's queue young enough for the next step (main process; 0 elsewhere)."""
        if not self.trainer.accelerator.is_main_process or self.trainer.rollout_worker is None:
            return 0
        version, limit = self.trainer.model_version, self.trainer.args.max_staleness
        return sum(1 for s in list(self.worker.rollout_buffer.queue) if version - s.model_version <= limit)

    def _drain(self) -> None:
        """Let the groups in flight finish and count what they paid into this step, before the checkpoint (at a
        stop, and after the last step: calls in flight are paid whether or not their samples are trained)."""
        if self.trainer.accelerator.is_main_process:
            self.worker.drain()
        late = self._sum(self.environment.take().as_list())
        calls, cost = late[0], late[4]
        self.run_total["calls"] += calls
        self.run_total["cost"] += cost
        metrics = getattr(self.trainer, "_metrics", None)
        if metrics is None or not (calls or cost):
            return
        totals = self._totals()
        train = metrics["train"]
        for key, value in (("env/cost", cost), ("env/calls", calls)):
            if train[key]:
                train[key][-1] += value
        for key, value in (("env/total_cost", totals["cost"]), ("env/total_calls", totals["calls"])):
            if train[key]:
                train[key][-1] = value


def install(trainer: Any, environment: LedgerEnvironment, config: Any, worker: Any) -> AsyncSpendCap:
    cap = AsyncSpendCap(
        trainer,
        environment,
        worker,
        group_calls=config.num_generations * max(config.max_turns, 1),
        max_cost=config.max_env_cost,
        max_calls=config.max_env_calls,
    )
    if config.max_env_cost is not None or config.max_env_calls is not None:
        worker.may_start = cap.may_start
    trainer.add_callback(cap)
    return cap


def resume_cost(environment: LedgerEnvironment, first_group: int) -> str | None:
    """What a resume at `first_group` plays again, in one line: the groups from it on that the ledger holds calls
    of, and what those calls cost: at most that is paid again (a call asking exactly what it asked before is
    answered from the ledger). None without a ledger (then the calls after the checkpoint are not known)."""
    ledger = environment.ledger
    if ledger is None:
        return None
    again = ledger.totals(from_step=first_group)
    if not again["calls"]:
        return f"resuming at group {first_group}: no call paid after it is played again"
    return (
        f"resuming at group {first_group}: {again['steps']} group(s) from it on had been played before the stop "
        f"({again['calls']} environment calls, ${again['cost']:.4f}); they are played again, and as the async "
        "worker's sampling is not reproducible, only a call that asks exactly what it asked before is answered "
        "from the ledger: the others are paid again (the spend total counts each payment)"
    )
