"""What both trainers make of the loop's episodes: TRL's token-exact trajectories, and a training prompt's question.

`Trajectories` holds the loop's settings for rollouts and turns finished episodes into TRL's rollout output
(`prompt_ids`, `completion_ids`, `logprobs`, `env_mask` and the columns the rewards read). The synchronous
trainer's `GraphRollout` (prompt_r1.training.sync.rollout) samples the episodes with the trainer's own policy; the
asynchronous worker (prompt_r1.training.asynchronous.worker) with a served one. `completion_ids` are the agent's
sampled ids (env_mask 1, with their sampling logprobs) and the environment's rendered messages (env_mask 0,
logprob placeholders 0.0), never re-tokenised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prompt_r1.core.config import LoopConfig, warn_loop_keywords
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import extract_question
from prompt_r1.loop.protocols import protocol_for
from prompt_r1.runs.episode import Episode

__all__ = ["Trajectories", "question_of"]


def question_of(prompt: Any) -> str:
    """The bare question of a training prompt: release-style messages, a Prompt-R1 first message, or plain text."""
    if isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt:
        last = prompt[-1]
        content = last.get("content") if isinstance(last, dict) else None
        if not isinstance(content, str):
            raise ConfigError(f"a training prompt's last message has no text content: {last!r}")
        prompt = content
    if not isinstance(prompt, str) or not prompt.strip():
        raise ConfigError(f"a training prompt must be a question or chat messages, got {prompt!r}")
    return extract_question(prompt) or prompt


class Trajectories:
    """The loop's settings for rollouts, and the trajectories of finished episodes.

    environment: the environment client (rate-limited, retrying), a pool, or any LangChain chat model.
    loop: the loop's settings (prompt_r1.LoopConfig; the training config's `loop_config()`). Or, as keywords:
        max_turns (paper: 5), max_turn_tokens and max_total_tokens (paper: 1,024 / 8,192), with
        force_final_answer off: running out of turns is the agent's outcome to learn from.
    train_on_environment_tokens: an ablation; the environment's tokens are trained on as the agent's own.
    """

    def __init__(
        self,
        environment: Any,
        *,
        loop: LoopConfig | None = None,
        max_turns: int | None = None,
        max_turn_tokens: int | None = None,
        max_total_tokens: int | None = None,
        train_on_environment_tokens: bool = False,
    ) -> None:
        keywords = {
            "max_turns": max_turns,
            "max_turn_tokens": max_turn_tokens,
            "max_total_tokens": max_total_tokens,
        }
        given = {k: v for k, v in keywords.items() if v is not None}
        if loop is not None and given:
            raise ConfigError(f"give loop= or the loop's keywords ({', '.join(given)}), not both")
        warn_loop_keywords(
            type(self).__name__, given
        )  # deprecated, kept for one release: loop=LoopConfig(...)
        if loop is None:
            loop = LoopConfig(**{"max_turn_tokens": 1024, **given, "force_final_answer": False})
        if loop.max_turn_tokens is None:
            raise ConfigError("a rollout needs the loop's max_turn_tokens (the policy's per-turn budget)")
        self.environment = environment
        self.loop = loop
        self.train_on_environment_tokens = train_on_environment_tokens  # an ablation: env_mask all 1

    @property
    def max_turns(self) -> int:
        return self.loop.max_turns

    @property
    def most_agent_turns(self) -> int:
        """The most agent generations an episode makes under the loop's protocol and settings."""
        return protocol_for(self.loop).most_agent_turns(
            self.loop.max_turns, bool(self.loop.force_final_answer)
        )

    @property
    def max_turn_tokens(self) -> int:
        return self.loop.max_turn_tokens

    @property
    def max_total_tokens(self) -> int:
        return self.loop.max_total_tokens

    def to_trajectories(self, results: list[Episode], tokenizer: Any) -> dict[str, list]:
        """TRL's rollout output: ids, logprobs and env_mask per episode, plus the columns the rewards read (and
        those the loop's protocol adds for its reward)."""
        protocol = protocol_for(self.loop)
        columns = ("turn_texts", "status", "answer", "num_turns", "env_calls", *protocol.reward_column_names)
        out: dict[str, list] = {
            k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", *columns)
        }
        for episode in results:
            trajectory = episode.trajectory or {}
            turns = episode.turns
            cut_off = episode.status == "context_overflow" or (
                turns and turns[-1].get("finish_reason") == "length"
            )
            completion, logprobs, mask = protocol.finish_trajectory(
                tokenizer,
                tuple(list(trajectory.get(k) or []) for k in ("completion_ids", "logprobs", "env_mask")),
                cut_off=bool(cut_off),
                max_total_tokens=self.max_total_tokens,
            )
            out["prompt_ids"].append(list(trajectory["prompt_ids"]))
            out["completion_ids"].append(completion)
            out["logprobs"].append(logprobs)
            out["env_mask"].append([1] * len(mask) if self.train_on_environment_tokens else mask)
            out["turn_texts"].append([t["text"] for t in turns])
            out["status"].append(episode.status)
            out["answer"].append(episode.answer)
            out["num_turns"].append(len(turns))
            out["env_calls"].append(episode.usage.get("env_calls", 0))
            extra = protocol.reward_columns(tokenizer, list(trajectory["prompt_ids"]), completion, mask)
            for key, value in extra.items():
                out[key].append(value)
        return out
