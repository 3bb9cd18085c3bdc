"""The paper's comparisons in one command, offline: Prompt-R1 beside the environment alone, chain of thought and the
three prompt optimisers (OPRO, GEPA, TextGrad), against two environments, with costs and the sweep report.

    python evals/demo_comparison.py [--limit 4] [--out eval-results/comparison]

It runs, against scripted OpenAI-compatible servers on 127.0.0.1 (prompt_r1.testing.servers.ScriptedServer),

    prompt-r1 eval --suite paper-main --method prompt-r1 --method env-only --method env-cot --method gepa \
        --method opro --method textgrad --env-model big --env-model small --prices PRICES ...

The environments know the golden answers and give the right one to a fixed share of requests: more often to the
agent's explained prompts, to an instruction that says to read carefully (what every optimiser's scripted
optimiser model proposes) and to chain of thought than to a bare question, and less often in `small` than in
`big`. The numbers show the harness at work (searches, rows, costs, tables, charts), not any model's quality.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from demo_eval import _fraction, golden_answers, question_finder, scripted_agent

from prompt_r1.cli.main import main as prompt_r1

GOOD = "Read the question carefully, then answer."
PRICES = {  # $ per 1M tokens, made up for the scripted models
    "big": {"input": 0.15, "output": 0.60},
    "small": {"input": 0.05, "output": 0.20},
    "agent": {"input": 0.02, "output": 0.08},
}


def build_servers(rows: int):
    from prompt_r1.testing.servers import ScriptedServer

    golds = golden_answers(rows)
    question_in = question_finder(golds)

    def environment(scale: float):
        def respond(body: dict) -> str:
            prompt = body["messages"][-1]["content"]
            if prompt.startswith("Your task is to generate the instruction <INS>"):  # OPRO's optimiser
                return f"<INS>{GOOD}</INS>"
            if "Your task is to write a new instruction for the assistant." in prompt:  # GEPA's reflection
                return f"```\n{GOOD}\n```"
            if "<IMPROVED_VARIABLE>" in prompt:  # TextGrad's update
                return f"<IMPROVED_VARIABLE>{GOOD}</IMPROVED_VARIABLE>"
            if "<LM_SYSTEM_PROMPT>" in prompt or "<FEEDBACK>" in prompt:  # TextGrad's backward pass
                return "The model should read the question carefully."
            question = question_in(prompt)
            share = (
                0.75 if prompt.startswith("Explained:")
                else 0.7 if "carefully" in prompt
                else 0.6 if "step by step" in prompt
                else 0.5
            )  # fmt: skip
            right = _fraction(question) < share * scale
            return f"Here is my answer. <answer>{golds[question] if right else 'not sure'}</answer>"

        return respond

    return (
        ScriptedServer({"big": environment(1.0), "agent": scripted_agent(question_in)}),
        ScriptedServer({"small": environment(0.6)}),
    )


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=4, help="rows per dataset (default: 4)")
    parser.add_argument("--train-rows", type=int, default=3, help="training rows per search (default: 3)")
    parser.add_argument("--budget", type=int, default=12, help="metric calls per search (default: 12)")
    parser.add_argument("--out", default="eval-results/comparison", help="output folder")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prices = out / "prices.json"
    prices.write_text(json.dumps(PRICES))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # TextGrad imports litellm: no price fetch
    big, small = build_servers(args.limit + args.train_rows)
    with big, small:
        methods = ["prompt-r1", "env-only", "env-cot", "gepa", "opro", "textgrad"]
        flags = (
            f"eval --suite paper-main --limit {args.limit} --optimizer-train-rows {args.train_rows} "
            f"--optimizer-budget {args.budget} --opro-candidates 2 --no-progress "
            f"--agent-model agent --agent-base-url {big.base_url} --env-model big --env-base-url {big.base_url} "
            f"--env-model small --env-base-url {small.base_url}"
        )
        paths = ["--prices", str(prices), "--out", str(out)]  # whole: a path may hold spaces
        return prompt_r1([*flags.split(), *paths, *(f for m in methods for f in ("--method", m))])


if __name__ == "__main__":
    sys.exit(run())
