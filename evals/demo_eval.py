"""`prompt-r1 eval --suite paper-main` end to end, offline, against scripted OpenAI-compatible servers.

    python evals/demo_eval.py [--limit 8] [--out eval-results/demo]

The servers (prompt_r1.testing.servers.ScriptedServer, real HTTP on 127.0.0.1) stand in for the models: the agent asks
the environment once, then answers with what it was told; the environment knows the golden answers and gives the
right one to a fixed share of requests (more often to the agent's explained prompts than to a bare question).
The numbers therefore show the harness working (rows, resumption, tables, chart), not any model's quality.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import sys

from prompt_r1.cli.main import main as prompt_r1
from prompt_r1.data.datasets import load_samples
from prompt_r1.evaluation.harness import SUITES
from prompt_r1.testing.servers import ScriptedServer


def _fraction(text: str) -> float:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def golden_answers(rows: int) -> dict[str, str]:
    """The first golden answer of the first `rows` rows of every paper-main set, keyed by the stripped question:
    the agent's prompt reaches the environment stripped, as the protocol parses it."""
    return {
        s.question.strip(): s.golden_answers[0]
        for n in SUITES["paper-main"].datasets
        for s in load_samples(n, limit=rows)
    }


def question_finder(golds: dict[str, str]):
    """The question a text holds: the longest known one inside it."""

    def question_in(text: str) -> str:
        return max((q for q in golds if q in text), key=len)

    return question_in


def scripted_agent(question_in):
    """The agent: it asks the environment once (its question "Explained:"), then answers what it was told."""

    def agent(body: dict) -> str:
        messages = body["messages"]
        question = question_in(messages[0]["content"])
        if len(messages) == 1:
            return f"<think>Explain the question first.</think><interaction_prompt>Explained: {question}</interaction_prompt>"
        # The loop escapes the environment's reply inside <interaction_response> (its tags are not the agent's).
        said = re.findall(r"<answer>(.*?)</answer>", html.unescape(messages[-1]["content"]), re.DOTALL)
        return f"<think>The environment answered.</think><answer>{said[-1] if said else ''}</answer>"

    return agent


def build_servers(limit: int) -> ScriptedServer:
    golds = golden_answers(limit)
    question_in = question_finder(golds)

    def environment(body: dict) -> str:
        prompt = body["messages"][-1]["content"]
        question = question_in(prompt)
        share = 0.75 if prompt.startswith("Explained:") else 0.6 if "step by step" in prompt else 0.5
        right = _fraction(question) < share
        return f"Here is my answer. <answer>{golds[question] if right else 'not sure'}</answer>"

    return ScriptedServer({"env": environment, "agent": scripted_agent(question_in)})


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=8, help="rows per dataset (default: 8)")
    parser.add_argument(
        "--out", default="eval-results/demo", help="output folder (default: eval-results/demo)"
    )
    args = parser.parse_args(argv)
    with build_servers(args.limit) as server:
        return prompt_r1(
            [
                "eval",
                "--suite",
                "paper-main",
                "--method",
                "prompt-r1",
                "--method",
                "env-only",
                "--method",
                "env-cot",
                "--limit",
                str(args.limit),
                "--out",
                args.out,
                "--env-model",
                "env",
                "--env-base-url",
                server.base_url,
                "--agent-model",
                "agent",
                "--agent-base-url",
                server.base_url,
            ]  # fmt: skip
        )


if __name__ == "__main__":
    sys.exit(run())
