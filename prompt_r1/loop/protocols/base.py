"""What a loop protocol decides, as one interface: the loop's nodes, the GRPO rollout and evaluation ask it.

A protocol is everything that differs between the paper's loop and the reference release's rollout:

- what the agent is shown: its chat (`agent_messages`), its first prompt as token ids (`first_prompt_ids`, through
  `chat_template`: None for the agent tokenizer's own), and its token budget before each turn (`turn_budget`);
- how its output is parsed: the stop strings a turn ends on (`stop`), the turn record (`read_turn`) and the
  sampled ids the trajectory keeps (`kept_ids`);
- what the environment receives and what comes back: its system prompt (`environment_system_prompt`), its
  history (`environment_history`), an answer given without calling it (`answer_without_environment`), the reply
  as the agent reads it (`observe`), and an overflow of its context (`environment_overflow`);
- how turns end: where a prompting turn goes (`route_prompt`) and when the turns are used up after a reply
  (`turns_used_up`);
- what the trainer and the evaluation score: the reward preset (`reward_preset`, `fixed_reward_preset`), the
  trajectory as the trainer gets it (`finish_trajectory`) with the columns the reward reads (`reward_columns`),
  and an episode's own reward in an evaluation (`episode_reward`).

One object per protocol, chosen once from `LoopConfig.protocol` (`prompt_r1.loop.protocols.protocol_for`). The
checks a loop config must pass under a protocol are data in `prompt_r1.core.config.PROTOCOL_RULES`, a layer
below, so a config is refused where it is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from prompt_r1.core.protocol import AgentTurn
from prompt_r1.core.tokens import user_turn_ids

__all__ = ["LoopProtocol", "TurnBudget", "append_user_turn", "reply_usage"]


@dataclass(frozen=True)
class TurnBudget:
    """The generation budget of the next agent turn: `max_new_tokens` (None: the backend's own), and whether the
    trajectory budget, not the per-turn one, sets it (a turn cut off then means the context is full)."""

    max_new_tokens: int | None
    trajectory_bound: bool = False


class LoopProtocol(ABC):
    """The interface; `PaperProtocol` and `ReleaseProtocol` are its two implementations."""

    name: ClassVar[str]
    # The strings an agent turn ends at (the closing action tags; none: the end-of-turn token alone).
    stop: ClassVar[tuple[str, ...]]
    # The environment's system prompt; None: the environment client's own.
    environment_system_prompt: ClassVar[str | None] = None
    # The reward preset this protocol's episodes are scored with when none is named (prompt_r1.scoring.rewards).
    reward_preset: ClassVar[str]
    # True when no other preset may score this protocol's trajectories (training refuses one).
    fixed_reward_preset: ClassVar[bool] = False
    # The columns `reward_columns` adds to the trainer's rollout output.
    reward_column_names: ClassVar[tuple[str, ...]] = ()

    # What the agent is shown

    def chat_template(self) -> str | None:
        """The chat template the first prompt is rendered with; None: the agent tokenizer's own."""
        return None

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Refuse, in one line, an agent tokenizer this protocol's token stream cannot be written with; any
        tokenizer with a chat template serves by default."""
        return None

    @abstractmethod
    def agent_messages(self, state: dict) -> list[dict[str, str]]:
        """The agent's chat for a chat-only backend, from the episode's state (question and turn records)."""

    @abstractmethod
    def first_prompt_ids(self, tokenizer: Any, question: str) -> list[int]:
        """The token ids of the agent's first prompt."""

    @abstractmethod
    def turn_budget(
        self, prompt_tokens: int, used: int, max_total_tokens: int, per_turn: int | None
    ) -> TurnBudget | None:
        """The next turn's budget, given the first prompt's length and the trajectory so far; None: the context
        is full and the episode ends before the turn."""

    # How its output is parsed

    @abstractmethod
    def read_turn(self, text: str, *, index: int, token_exact: bool) -> tuple[AgentTurn, dict[str, Any]]:
        """One generation as a parsed turn, and the fields its record adds."""

    def kept_ids(
        self, tokenizer: Any, ids: list[int], logprobs: list[float]
    ) -> tuple[list[int], list[float]]:
        """The sampled ids (and their logprobs) the trajectory keeps."""
        return ids, logprobs

    # What the environment receives

    @abstractmethod
    def environment_history(self, turns: Sequence[dict]) -> list[tuple[str, str]]:
        """The (prompt, reply) pairs the environment sees before the next call, oldest first."""

    def answer_without_environment(self, state: dict, tokenizer: Any) -> tuple[dict, dict] | None:
        """The state update and event when the last turn's call is answered without the environment (a call
        the protocol refuses); None: call the environment. `tokenizer` is None off the token path."""
        return None

    @abstractmethod
    def observe(self, state: dict, reply: Any, tokenizer: Any, max_total_tokens: int) -> tuple[dict, dict]:
        """The state update and event for the environment's `reply` to the last turn; with a `tokenizer` (the
        token path) the reply's rendered ids are appended to the trajectory, masked."""

    @abstractmethod
    def environment_overflow(self, index: int, error: str) -> dict:
        """The state update when the environment's context cannot hold the call."""

    # How turns end

    @abstractmethod
    def route_prompt(
        self, state: dict, max_turns: int, force_final_answer: bool
    ) -> Literal["environment", "final_answer", "finalize"]:
        """Where a turn that prompts the environment goes."""

    @abstractmethod
    def turns_used_up(self, state: dict, max_turns: int) -> bool:
        """After the environment's reply: True when the episode ends there."""

    @abstractmethod
    def most_agent_turns(self, max_turns: int, force_final_answer: bool) -> int:
        """The most agent generations an episode can make under these settings (the step lines' turns)."""

    # What the trainer and the evaluation score

    @abstractmethod
    def finish_trajectory(
        self,
        tokenizer: Any,
        trajectory: tuple[list[int], list[float], list[int]],
        *,
        cut_off: bool,
        max_total_tokens: int,
    ) -> tuple[list[int], list[float], list[int]]:
        """The (completion ids, logprobs, env_mask) the trainer gets from an episode's trajectory; `cut_off`: a
        budget ended the episode."""

    def reward_columns(
        self, tokenizer: Any, prompt_ids: list[int], completion: list[int], mask: list[int]
    ) -> dict:
        """Extra rollout columns the reward reads for one episode (named in `reward_column_names`)."""
        return {}

    def episode_reward(self, question: str, turns: list[dict], golden_answers: Any) -> Any:
        """The protocol's own reward of an evaluated episode (a `RewardScore`), beside every preset's score of
        its turns; None: those are all."""
        return None


def reply_usage(reply: Any) -> dict[str, int]:
    """The usage counters of one answered environment call."""
    return {
        "env_calls": 1,
        "env_input_tokens": reply.input_tokens,
        "env_output_tokens": reply.output_tokens,
        "env_retries": reply.attempts - 1,
    }


def append_user_turn(tokenizer: Any, state: dict, content: str, max_total_tokens: int) -> dict:
    """A user message rendered by the agent's chat template and appended to the trajectory, masked; or, when it
    would overrun the trajectory budget, the end of the episode: the trajectory then stops after the agent's
    last turn instead of holding a cut-off message."""
    completion = state.get("completion_ids", [])
    ids = user_turn_ids(tokenizer, content, completion[-3:])
    if len(completion) + len(ids) > max_total_tokens:
        return {
            "status": "context_overflow",
            "error": f"the next message ({len(ids)} tokens) does not fit the trajectory budget of {max_total_tokens}",
        }
    return {"completion_ids": ids, "logprobs": [0.0] * len(ids), "env_mask": [0] * len(ids)}
