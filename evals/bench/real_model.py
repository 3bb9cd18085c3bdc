"""Real models in the loop, on this machine: throughput of the built-in model (SmolLM2-135M-Instruct) as agent and
as environment, and the token-exactness of its episodes.

    python evals/bench/real_model.py                     # 64 questions; the four rows below, then token-exact on 50
    python evals/bench/real_model.py --questions 16 --exact 10 --out /tmp/real.json

Rows, side by side in one run, all on the same questions (HotpotQA, the bundled set) and one environment server
(the built-in model served on 127.0.0.1 by agents/model_server.py, replies of at most 48 tokens):
[1] concurrent: the batch runner (EpisodeRunner, every episode in flight at once) with the local transformers
    agent guided into the protocol's tags (one environment call, then the answer), against
[2] lockstep: the reference release's rollout loop on the same players: the batch advances turn by turn, each
    turn's agent calls, then its environment calls, waiting for the slowest (evals/bench/batch_throughput.py).
[3] local agent, unguided, and [4] the same model as a served agent (chat completions through a second server of
    it): one turn each (the untrained model writes no tags by itself), agent tokens per second.
Then [5] token-exact: `--exact` episodes of 2-3 environment replies (guided, max_turns 2 and 3) through the trainer's
trajectory builder, checked by prompt_r1.testing.token_exact: episodes whose ids the trainer scores are exactly the
ids sampled, and environment tokens trained on.

Last line: `real model: concurrent X eps/min, lockstep Y (Z×); served A agent tok/s, local B; token-exact N/M,
env tokens trained on K`. Figures on a shared 2-core machine move with its load: run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "evals" / "bench"))

from batch_throughput import _lockstep  # noqa: E402  (the reference release's rollout loop)

from prompt_r1.agents.local import TransformersAgent  # noqa: E402
from prompt_r1.agents.model_server import load_served_model, model_server_in_thread  # noqa: E402
from prompt_r1.agents.served import ServedAgent  # noqa: E402
from prompt_r1.clients.environment import EnvironmentClient  # noqa: E402
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig  # noqa: E402
from prompt_r1.data.datasets import load_samples  # noqa: E402
from prompt_r1.runs.episode import EpisodeRunner  # noqa: E402

MODEL = "smollm2-135m"


def _agent_tokens(episodes) -> int:
    return sum(e.usage.get("agent_completion_tokens", 0) for e in episodes)


async def _concurrent(agent, environment, questions, loop) -> tuple[float, list]:
    runner = EpisodeRunner(agent, environment, loop)
    start = time.monotonic()
    episodes = await asyncio.gather(*(runner.run(q) for q in questions))
    return time.monotonic() - start, episodes


def _row(name: str, seconds: float, episodes: int, agent_tokens: int, env_calls: int) -> dict:
    line = (f"{name:<28} {episodes / seconds * 60:7.1f} eps/min  {agent_tokens / seconds:7.1f} agent tok/s  "
            f"{env_calls:4d} env calls  {seconds:6.1f} s")  # fmt: skip
    print(line, flush=True)
    return {"seconds": seconds, "episodes": episodes, "eps_per_min": episodes / seconds * 60,
            "agent_tokens_per_s": agent_tokens / seconds, "env_calls": env_calls}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--exact", type=int, default=50, help="episodes of the token-exact check (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-only", action="store_true", help="only the token-exact part [5]")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    # Distinct questions for every episode of the token-exact part too: two episodes of one question may sample
    # the same first turn, and the check could not tell whose it was.
    pool = [s.question for s in load_samples("hotpot", limit=max(args.questions, args.exact))]
    questions = pool[: args.questions]
    results: dict = {"questions": len(questions), "seed": args.seed}
    guided = AgentConfig(model=MODEL, guide_calls=1, seed=args.seed, max_new_tokens=96)
    loop = LoopConfig(max_turns=1, max_turn_tokens=96)
    with model_server_in_thread(MODEL, seed=args.seed) as env_server:
        environment = EnvironmentClient(
            EnvironmentConfig(
                model=env_server.name, base_url=env_server.base_url, max_tokens=48, max_in_flight=256
            ),
            api_key="none",
        )
        if args.exact_only:
            exact = _token_exact(environment, pool, args.exact, args.seed)
            print(f"real model: token-exact {exact['exact']}/{exact['episodes']}, replies per episode "
                  f"{exact['replies']}, env tokens trained on {exact['env_tokens_trained']}")  # fmt: skip
            if args.out:
                args.out.write_text(json.dumps({"token_exact": exact, "seed": args.seed}, indent=2) + "\n")
            return 0
        local = TransformersAgent(guided)
        seconds, episodes = asyncio.run(_concurrent(local, environment, questions, loop))
        calls = sum(e.usage.get("env_calls", 0) for e in episodes)
        results["concurrent"] = _row(
            "[1] concurrent (batch runner)", seconds, len(episodes), _agent_tokens(episodes), calls
        )
        before = env_server.requests
        start = time.monotonic()
        asyncio.run(_lockstep(local, environment, questions, len(questions)))
        seconds = time.monotonic() - start
        results["lockstep"] = _row(
            "[2] lockstep per turn", seconds, len(questions), 0, env_server.requests - before
        )
        speedup = results["concurrent"]["eps_per_min"] / results["lockstep"]["eps_per_min"]
        print(f"    concurrent / lockstep: {speedup:.2f}x (target >= 3x)", flush=True)

        plain = AgentConfig(model=MODEL, seed=args.seed, max_new_tokens=96)
        one_turn = LoopConfig(max_turns=1, max_turn_tokens=96)
        seconds, episodes = asyncio.run(
            _concurrent(TransformersAgent(plain), environment, questions, one_turn)
        )
        results["local"] = _row(
            "[3] local agent, unguided", seconds, len(episodes), _agent_tokens(episodes), 0
        )
        agent_server = load_served_model(
            MODEL, name="agent", temperature=0.7, seed=args.seed, max_batch_size=64
        )
        with model_server_in_thread(agent_server) as served_at:
            served = ServedAgent(AgentConfig(model="agent", base_url=served_at.base_url, max_new_tokens=96,
                                             token_exact="off"), api_key="none")  # fmt: skip
            seconds, episodes = asyncio.run(_concurrent(served, environment, questions, one_turn))
        results["served"] = _row(
            "[4] served agent (chat API)", seconds, len(episodes), _agent_tokens(episodes), 0
        )

        exact = {"episodes": 0, "exact": 0, "env_tokens_trained": 0}
        if args.exact:
            exact = _token_exact(environment, pool, args.exact, args.seed)
            print(f"[5] token-exact: {exact['exact']}/{exact['episodes']} episodes, replies per episode "
                  f"{exact['replies']}, env tokens trained on {exact['env_tokens_trained']}", flush=True)  # fmt: skip
        results["token_exact"] = exact
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"real model: concurrent {results['concurrent']['eps_per_min']:.1f} eps/min, lockstep "
          f"{results['lockstep']['eps_per_min']:.1f} ({speedup:.2f}x); served "
          f"{results['served']['agent_tokens_per_s']:.1f} agent tok/s, local {results['local']['agent_tokens_per_s']:.1f}; "
          f"token-exact {exact['exact']}/{exact['episodes']}, env tokens trained on {exact['env_tokens_trained']}")  # fmt: skip
    return 0


def _token_exact(environment, questions: list[str], n: int, seed: int) -> dict:
    """`n` guided episodes, half with 2 replies and half with 3, checked as the tests check them."""
    from prompt_r1.testing.token_exact import RecordingAgent, token_exact_problems
    from prompt_r1.training.shared.trajectories import Trajectories

    backend = TransformersAgent(AgentConfig(model=MODEL, guide_calls=3, seed=seed, max_new_tokens=48))
    exact = trained_env = 0
    replies: dict[int, int] = {}
    done = 0
    for calls in (2, 3):
        count = n // 2 if calls == 2 else n - n // 2
        loop = LoopConfig(max_turns=calls, max_turn_tokens=48, max_total_tokens=4096)
        for start in range(0, count, 25):  # at most 25 episodes in flight
            agent = RecordingAgent(backend)
            chunk = [questions[(done + i) % len(questions)] for i in range(start, min(start + 25, count))]
            _, episodes = asyncio.run(_concurrent(agent, environment, chunk, loop))
            rollout = Trajectories(environment, loop=loop).to_trajectories(episodes, backend.tokenizer)
            for i, episode in enumerate(episodes):
                one = {k: [v[i]] for k, v in rollout.items()}
                mine = [
                    c
                    for c in agent.calls
                    if (one["prompt_ids"][0] + one["completion_ids"][0])[: len(c[0])] == c[0]
                ]
                problems = token_exact_problems(backend.tokenizer, [episode], one, mine)
                exact += not problems
                for problem in problems[:1]:
                    print(f"    not token-exact: {problem}", flush=True)
                # Environment tokens trained on: mask-1 tokens that the agent did not sample.
                sampled = sum(len(ids) for _, ids in mine)
                trained_env += max(0, sum(one["env_mask"][0]) - sampled)
                got = episode.usage.get("env_calls", 0)
                replies[got] = replies.get(got, 0) + 1
        done += count
    return {
        "episodes": sum(replies.values()),
        "exact": exact,
        "env_tokens_trained": trained_env,
        "replies": replies,
    }


if __name__ == "__main__":
    sys.exit(main())
