"""What a crash costs a training run: the environment calls and dollars paid, with and without the call ledger.

    python evals/bench/ledger.py [--seed S] [--steps 6] [--save-steps 2] [--crash-step 4] [--model DIR] [--work DIR]

On the door-codes task (`prompt_r1.tasks.door_codes`: a scripted environment on 127.0.0.1, the agent built for the
task, GRPO as in the learning benchmark) the same seed is trained three times, side by side in one run:
1. uninterrupted, for `--steps` steps, a checkpoint every `--save-steps`;
2. crashed in step `--crash-step` (after its episodes' environment calls were paid, before its update: the most a
   crash can lose), then resumed from the last checkpoint with the call ledger (the default);
3. the same crash, resumed with `call_ledger false`: every call since the checkpoint is paid again.
Paid calls are counted where they reach the environment (a call answered from the ledger never does), cross-checked
with the server's own count, and priced by the shared price table with the environment priced as gpt-4o-mini (the
scripted server counts a message's words as its tokens). The last lines:

    run                              calls   dollars   vs uninterrupted   final weights
    uninterrupted                    ...
    crashed, resumed with ledger     ...               1.00x              equal
    crashed, resumed without ledger  ...               1.33x              equal

Building the agent takes one to three minutes on 2 cores (`--model DIR` reuses one built before:
`prompt_r1.tasks.door_codes.build_door_model`); each run then takes about a minute. Needs the `train` and `dev`
extras.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ENV_PRICE = "env: {input: 0.15, output: 0.60}\n"  # gpt-4o-mini's list price, $ per 1M tokens


class Paid:
    """The environment as the provider sees it: every call that reaches it is counted and priced."""

    def __init__(self, inner, prices) -> None:
        self.inner, self.prices = inner, prices
        self.calls, self.dollars = 0, 0.0

    async def respond(self, prompt, history=(), **options):
        reply = await self.inner.respond(prompt, history, **options)
        self.calls += 1
        self.dollars += self.prices.cost("env", reply.input_tokens, reply.output_tokens)
        return reply

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Crash(RuntimeError):
    """The process dies here: in the middle of a step, its environment calls paid, its update not made."""


def _crashing_rollout(crash_step: int | None):
    from prompt_r1.tasks.door_training import DoorRollout

    class CrashingRollout(DoorRollout):
        def run_episodes(self, agent, questions, *, call=None):
            episodes = super().run_episodes(agent, questions, call=call)
            if crash_step is not None and call is not None and call[1] and call[0] + 1 == crash_step:
                raise Crash(f"crashed in step {crash_step}")
            return episodes

    return CrashingRollout


def run(name: str, args, model: Path, work: Path, *, ledger: bool, crash: bool) -> dict:
    """Train `name` (crashing and resuming when `crash`) and return what the environment was paid."""
    from transformers.trainer_utils import get_last_checkpoint

    from prompt_r1.clients.costs import PriceTable
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.tasks.door_codes import DoorTable, door_environment, training_rows
    from prompt_r1.tasks.door_training import grpo_config
    from prompt_r1.testing.servers import ScriptedServer
    from prompt_r1.training.sync.trainer import build_trainer

    prices_file = work / "prices.yaml"
    prices_file.write_text(ENV_PRICE)
    table = DoorTable(args.seed)
    rows = training_rows(args.steps * 4 + 32, seed=args.seed)
    with ScriptedServer({"env": door_environment(table)}) as server:
        config = grpo_config(
            work / name, model, server.base_url, max_steps=args.steps, seed=args.seed, data_seed=args.seed,
            save_strategy="steps", save_steps=args.save_steps, call_ledger=ledger, prices=str(prices_file),
        )  # fmt: skip
        paid = Paid(EnvironmentClient(config.environment_config()), PriceTable.load(prices_file))

        def trainer(crash_step):
            rollout = partial(_crashing_rollout(crash_step), table=table)
            return build_trainer(config, environment=paid, train_rows=rows, rollout=rollout)

        if crash:
            try:
                trainer(args.crash_step).train()
                raise SystemExit(f"{name}: the run did not crash in step {args.crash_step}")
            except Crash:
                pass
            resumed = trainer(None)
            resumed.train(resume_from_checkpoint=get_last_checkpoint(str(work / name)))
            final = resumed
        else:
            final = trainer(None)
            final.train()
        served = server.counts.get("env", 0)
    if served != paid.calls:
        raise SystemExit(f"{name}: the server answered {served} calls, the count says {paid.calls}")
    return {"calls": paid.calls, "dollars": paid.dollars, "state": final.model.state_dict()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--crash-step", type=int, default=4, help="1-based step whose update never happens")
    parser.add_argument("--model", type=Path, help="a door-task agent built before (default: build one)")
    parser.add_argument("--work", type=Path, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    if not args.save_steps < args.crash_step <= args.steps:
        parser.error("need save-steps < crash-step <= steps: the crash must come after a checkpoint")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    work = args.work or Path(tempfile.mkdtemp(prefix="ledger-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from prompt_r1.tasks.door_codes import build_door_model

        model = build_door_model(work / "model", seed=args.seed)
    results = {
        "uninterrupted": run("whole", args, model, work, ledger=True, crash=False),
        "crashed, resumed with ledger": run("ledger", args, model, work, ledger=True, crash=True),
        "crashed, resumed without ledger": run("no-ledger", args, model, work, ledger=False, crash=True),
    }
    base = results["uninterrupted"]
    print(
        f"door task, seed {args.seed}: {args.steps} steps, checkpoint every {args.save_steps}, crash in step "
        f"{args.crash_step}; environment priced as gpt-4o-mini",
        file=sys.stderr,
    )
    print(f"{'run':<33}{'calls':>7}{'dollars':>11}{'vs uninterrupted':>19}   final weights")
    for name, result in results.items():
        same = all(torch.equal(a, result["state"][k]) for k, a in base["state"].items())
        print(
            f"{name:<33}{result['calls']:>7}{result['dollars']:>11.6f}"
            f"{result['dollars'] / base['dollars']:>18.2f}x   {'equal' if same else 'differ'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
