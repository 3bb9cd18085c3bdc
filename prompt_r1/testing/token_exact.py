"""The token-exactness check of real-model episodes: the ids the agent produced are the ids the trainer scores.

    agent = RecordingAgent(backend)                  # remembers each generate's prompt ids and sampled ids
    episodes = [await runner.run(q) for q in questions]
    rollout = Trajectories(environment, loop=loop).to_trajectories(episodes, tokenizer)   # what TRL receives
    problems = token_exact_problems(tokenizer, episodes, rollout, agent.calls)           # [] when exact

Checked per episode, on the real chat template and BPE tokenizer:
- every generate call's prompt ids are a prefix of the trainer's prompt + completion ids, and its sampled ids
  follow at once (the agent read exactly what the trainer scores it on, and wrote exactly what is trained);
- the trainer's mask-1 tokens are exactly the sampled ones (0 environment tokens trained on);
- each mask-0 span decodes to the chat template's rendering of the reply that came back (`<interaction_response>`
  message and the next assistant header), and nothing else;
- re-rendering the whole conversation with the chat template gives the same ids (no drift across turns).
"""

from __future__ import annotations

from typing import Any

from prompt_r1.agents.base import AgentOutput, AgentRequest

__all__ = ["RecordingAgent", "token_exact_problems"]


class RecordingAgent:
    """A backend that records, for each generate call, (prompt ids, sampled ids); everything else is the
    backend's own (its tokenizer, batching and episode registration)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.calls: list[tuple[list[int], list[int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def generate(self, request: AgentRequest) -> AgentOutput:
        output = await self.backend.generate(request)
        if request.prompt_ids is not None and output.token_ids is not None:
            self.calls.append((list(request.prompt_ids), list(output.token_ids)))
        return output


def _spans(mask: list[int], value: int) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 1 - value]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            spans.append((start, i))
            start = None
    return spans


def token_exact_problems(
    tokenizer: Any, episodes: list[Any], rollout: dict[str, list], calls: list[tuple[list[int], list[int]]]
) -> list[str]:
    """What is not token-exact in `episodes` (see the module doc); [] when everything is."""
    from prompt_r1.agents.vllm_server import rendering_drift
    from prompt_r1.core.prompts import interaction_response
    from prompt_r1.core.tokens import user_turn_ids

    problems: list[str] = []
    unmatched = list(calls)
    for n, episode in enumerate(episodes):
        where = f"episode {n} ({episode.status}, {len(episode.turns)} turns)"
        prompt, completion = rollout["prompt_ids"][n], rollout["completion_ids"][n]
        mask = rollout["env_mask"][n]
        full = prompt + completion
        mine = [c for c in unmatched if full[: len(c[0]) + len(c[1])] == c[0] + c[1]]
        for c in mine:
            unmatched.remove(c)
        if len(mine) != len(episode.turns):
            problems.append(f"{where}: {len(mine)} of its {len(episode.turns)} agent turns are found in the ids "
                            "the trainer scores")  # fmt: skip
            continue
        sampled = sorted((len(p) - len(prompt), len(p) - len(prompt) + len(ids)) for p, ids in mine)
        trained = _spans(mask, 1)
        if trained != sampled:
            problems.append(f"{where}: the trained tokens {trained} are not the sampled ones {sampled}")
            continue
        replies = [t for t in episode.turns if t.get("response") is not None]
        environment_spans = _spans(mask, 0)
        if (
            environment_spans
            and environment_spans[-1][1] == len(completion)
            and len(environment_spans) > len(replies)
        ):
            # The end-of-turn marker the trainer appends after a last turn that stopped on a stop string.
            a, b = environment_spans.pop()
            if b - a > 2 or tokenizer.eos_token_id not in completion[a:b]:
                problems.append(
                    f"{where}: it ends on {tokenizer.decode(completion[a:b])!r}, not the end of a turn"
                )
        if len(environment_spans) != len(replies):
            problems.append(f"{where}: {len(environment_spans)} masked spans for {len(replies)} replies")
            continue
        for (a, b), turn, (_, ids) in zip(environment_spans, replies, mine, strict=False):
            body = turn["response"]
            body = interaction_response(body) if turn.get("response_source") == "environment" else body
            expected = user_turn_ids(tokenizer, body, ids)
            if completion[a:b] != expected:
                problems.append(f"{where}: a masked span decodes to {tokenizer.decode(completion[a:b])[:120]!r}, "
                                f"not the template's {tokenizer.decode(expected)[:120]!r}")  # fmt: skip
        drift = rendering_drift(tokenizer, {"question": episode.question, "turns": episode.turns})
        if drift["differs"]:
            problems.append(
                f"{where}: re-rendering the conversation differs from token {drift['first_difference']}"
            )
    return problems
