"""The grouped-query attention of a padded batch on CPU (prompt_r1/agents/attention.py), side by side with
transformers' SDPA attention, which copies the key/value groups first: the same episodes of the notes task (the
shipped agent, smollm2-135m-notes, prompting the built-in model served with each question's notes), twice under each,
in one run.

    python evals/bench/grouped_attention.py                  # 50 held-out questions, then their first turns
    python evals/bench/grouped_attention.py --questions 20 --seed 7

Rows: [1] the agent's row (the table's agent method, prompt_r1.tasks.notes_eval.agent_method: greedy, turns
capped at the agent's own 64 tokens), agent and environment both under the attention named; [2] the agent's first
turns of all the questions in one batch (its prefill and decoding alone; calls of at most 32 rows, the CPU's
memory bound). After a warm-up of both, each row runs under each attention twice, in the order transformers',
grouped, grouped, transformers'; an arm's figure is the mean of its two. Every run must give the same predictions,
calls and tokens. Last line: `grouped attention: agent row X s -> Y s (Z x), the same predictions N/N; M first
turns A s -> B s (C x); means of 2 runs each, in the order A B B A`. Figures on a shared 2-core machine move with
its load: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

AGENT, ENVIRONMENT = "smollm2-135m-notes", "smollm2-135m"
PLAIN = "sdpa"  # transformers' SDPA attention: the groups copied wherever there is a mask


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--questions", type=int, default=50, help="held-out questions (one chunk: at most 50)"
    )
    parser.add_argument("--seed", type=int, help="the held-out draw (unset: drawn at run time)")
    args = parser.parse_args(argv)
    if not 1 <= args.questions <= 50:
        parser.error(f"--questions must be from 1 to 50 (the episodes of one batch), got {args.questions}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 * 10**6, 3 * 10**6)
    say(f"grouped attention: {args.questions} questions of held-out draw {seed}")

    from prompt_r1.agents.attention import NAME
    from prompt_r1.agents.base import AgentRequest
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.model_server import load_served_model, model_server_in_thread
    from prompt_r1.agents.trained import TRAINED_AGENTS
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
    from prompt_r1.loop.protocols import protocol_for
    from prompt_r1.tasks.notes_eval import agent_method, held_out

    cap = TRAINED_AGENTS[AGENT].turn_tokens
    agent = TransformersAgent(AgentConfig(model=AGENT, temperature=0.0, seed=seed))
    server = load_served_model(ENVIRONMENT, temperature=0.0, seed=seed)
    if agent.model.config._attn_implementation != NAME:
        say(
            f"the agent's attention is {agent.model.config._attn_implementation}, not {NAME}: nothing to compare"
        )
        return 1
    questions = held_out(args.questions, seed)
    loop = LoopConfig(max_turns=3, max_turn_tokens=cap, max_total_tokens=256)

    def attention(name: str) -> None:
        agent.model.set_attn_implementation(name)
        server.model.set_attn_implementation(name)

    with model_server_in_thread(server) as served:
        client = EnvironmentClient(
            EnvironmentConfig(model=served.name, base_url=served.base_url, max_tokens=32, temperature=0.0,
                              max_in_flight=256),
            api_key="none",
        )  # fmt: skip

        def row() -> tuple[list[dict], float]:
            started = time.perf_counter()
            rows = asyncio.run(agent_method(agent, client, questions, loop))
            return rows, time.perf_counter() - started

        for name in (PLAIN, NAME):  # warm-up: each attention's first calls
            attention(name)
            asyncio.run(agent_method(agent, client, questions[:2], loop))
        # Each arm twice, in the order A B B A, so that neither gains from going second (a warmer cache, a
        # quieter machine); each arm's figure is the mean of its two.
        order = (PLAIN, NAME, NAME, PLAIN)
        rows: dict[str, list] = {PLAIN: [], NAME: []}
        for name in order:
            attention(name)
            rows[name].append(row())
            say(f"[1] agent row under {name}: {rows[name][-1][1]:.1f} s")
    reference = rows[PLAIN][0][0]
    same = sum(
        all((a["prediction"], a["calls"], a["tokens"]) == (b["prediction"], b["calls"], b["tokens"])
            for b in (other[0][i] for other in (*rows[PLAIN][1:], *rows[NAME])))
        for i, a in enumerate(reference)
    )  # fmt: skip

    async def generated_together(requests: list) -> list:  # one batch (calls of at most 32 rows on CPU)
        return await asyncio.gather(*(agent.generate(request) for request in requests))

    protocol = protocol_for(loop)
    first = [protocol.first_prompt_ids(agent.tokenizer, q.question) for q in questions]
    generated: dict[str, list] = {PLAIN: [], NAME: []}
    for name in order:
        attention(name)
        requests = [AgentRequest(messages=[], prompt_ids=ids, max_new_tokens=cap, turn=0) for ids in first]
        started = time.perf_counter()
        outputs = asyncio.run(generated_together(requests))
        generated[name].append(([o.token_ids for o in outputs], time.perf_counter() - started))
        say(f"[2] the {len(first)} first turns in one batch under {name}: {generated[name][-1][1]:.1f} s")
    turns = [ids for name in order for ids, _ in generated[name]]
    if any(t != turns[0] for t in turns):
        say("the first turns differ between the two attentions")

    def mean(runs: list) -> float:
        return statistics.fmean(seconds for _, seconds in runs)

    plain_s, grouped_s = mean(rows[PLAIN]), mean(rows[NAME])
    gen_plain, gen_grouped = mean(generated[PLAIN]), mean(generated[NAME])
    say(
        f"grouped attention: agent row {plain_s:.1f} s -> {grouped_s:.1f} s ({grouped_s / plain_s:.2f} x), the same "
        f"predictions {same}/{len(questions)}; {len(first)} first turns {gen_plain:.1f} s -> {gen_grouped:.1f} s "
        f"({gen_grouped / gen_plain:.2f} x); means of 2 runs each, in the order A B B A"
    )
    return 0 if same == len(questions) and all(t == turns[0] for t in turns) else 1


if __name__ == "__main__":
    raise SystemExit(main())
