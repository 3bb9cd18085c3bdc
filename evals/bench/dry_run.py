"""How close `--dry-run`'s estimate comes to what the run then pays, on the scripted provider.

    python evals/bench/dry_run.py [--calibrate 8] [--rows 40] [--dataset hotpot]

For each agent below, against a scripted environment on 127.0.0.1 priced as gpt-4o-mini (the scripted server
counts a message's words as its tokens, and the estimate measures its characters per token from earlier rows as it
does for any provider):
1. a first real `prompt-r1 batch` on `--calibrate` questions: the earlier episodes the estimate learns from;
2. `batch --dry-run --expect-from` those rows, for the next `--rows` questions, and a `--dry-run` with no earlier
   rows (the stated assumptions alone);
3. the real `batch` on those questions; its summary's calls, tokens and dollars against both estimates.
Agents: `relay` asks the environment twice and answers with its last reply (environment replies echo the prompt,
so contexts grow turn by turn); `relay-4` asks four times. Calls must match exactly (the agents make a known number
of calls); the tolerance of tokens and dollars is what this prints. Takes under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ENV_PRICE = "env: {input: 0.15, output: 0.60}\nagent: {input: 0.0, output: 0.0}\n"  # gpt-4o-mini's list price


def cli(args: list[str]) -> tuple[int, str, str]:
    from prompt_r1.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def questions(path: Path, dataset: str, start: int, n: int) -> Path:
    from prompt_r1.data.datasets import load_samples

    rows = load_samples(dataset, limit=start + n)[start:]
    path.write_text("".join(json.dumps({"id": s.id, "question": s.question}) + "\n" for s in rows))
    return path


def measure(name: str, prompts: int, work: Path, args: argparse.Namespace) -> dict:
    from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

    prices = work / "prices.yaml"
    prices.write_text(ENV_PRICE)
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent(prompts=prompts)}) as server:
        common = ["--agent-model", "agent", "--agent-base-url", server.base_url, "--env-model", "env",
                  "--env-base-url", server.base_url, "--prices", prices, "--no-progress", "--env-rate-limit", "100000",
                  "--env-rate-period", "60"]  # fmt: skip
        calibration = work / f"{name}-calibration.jsonl"
        code, _, err = cli(
            [
                "batch",
                questions(work / "c.jsonl", args.dataset, 0, args.calibrate),
                "--out",
                calibration,
                *common,
            ]
        )
        assert code == 0, err
        target = questions(work / f"{name}-q.jsonl", args.dataset, args.calibrate, args.rows)
        out = work / f"{name}.jsonl"
        estimates = {}
        for label, extra in (("from rows", ["--expect-from", calibration]), ("assumed", [])):
            code, text, err = cli(["batch", target, "--out", out, *common, *extra, "--dry-run", "json"])
            assert code == 0, err
            estimates[label] = json.loads(text)["total"]
        sent = len(server.requests)
        code, _, err = cli(["batch", target, "--out", out, *common])
        assert code == 0, err
        summary = json.loads((work / f"{name}.summary.json").read_text())
    usage = {(m["role"], m["model"]): m for m in summary["usage"]["models"]}
    env, agent = usage[("environment", "env")], usage[("agent", "agent")]
    real = {
        "env_calls": env["calls"],
        "env_in": env["input_tokens"],
        "env_out": env["output_tokens"],
        "agent_in": agent["input_tokens"],
        "agent_out": agent["output_tokens"],
        "usd": summary["usage"]["cost_usd"],
    }
    assert len(server.requests) - sent == real["env_calls"] + agent["calls"]
    result = {"agent": name, "rows": args.rows, "real": real}
    for label, total in estimates.items():
        expected = total["expected"]
        result[label] = {
            key: {"estimate": expected[key], "error": (expected[key] - value) / value if value else 0.0}
            for key, value in real.items()
        }
        result[label]["at_most_calls"] = total["high"]["env_calls"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibrate", type=int, default=8, help="questions of the first, calibrating run")
    parser.add_argument("--rows", type=int, default=40, help="questions estimated, then run")
    parser.add_argument("--dataset", default="hotpot")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, prompts in (("relay", 2), ("relay-4", 4)):
            results.append(measure(name, prompts, Path(tmp), args))
    keys = ("env_calls", "env_in", "env_out", "agent_in", "agent_out", "usd")
    print(f"{'agent':<8} {'model':<10} " + " ".join(f"{k:>10}" for k in keys) + f" {'at most':>8}")
    worst = {"from rows": 0.0, "assumed": 0.0}
    exact = True
    for result in results:
        real = result["real"]
        print(f"{result['agent']:<8} {'real':<10} " + " ".join(f"{real[k]:>10,.4g}" for k in keys))
        for label in ("from rows", "assumed"):
            figures = result[label]
            print(
                f"{'':<8} {label:<10} "
                + " ".join(f"{figures[k]['error']:>+10.1%}" for k in keys)
                + f" {figures['at_most_calls']:>8,.0f}"
            )
            worst[label] = max(worst[label], *(abs(figures[k]["error"]) for k in keys[1:]))
            exact &= label != "from rows" or figures["env_calls"]["error"] == 0.0
            exact &= real["env_calls"] <= figures["at_most_calls"]
    print(
        f"calls: {'exact' if exact else 'NOT exact'} from earlier rows, and within the at-most bound; tokens and "
        f"dollars within ±{worst['from rows']:.0%} from earlier rows (±{worst['assumed']:.0%} on the assumptions "
        "alone)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
