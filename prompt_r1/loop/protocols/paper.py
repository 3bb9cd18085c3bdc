"""The `paper` protocol (the default): the loop as the paper describes it (Appendix A, Fig. 7).

The agent's first message is the question and the instruction template, rendered by the agent's own chat template;
a turn ends at its first closing action tag; a prompt goes to the environment with every earlier (prompt,
response) pair; the response reaches the agent as `<interaction_response>…</interaction_response>` with any markup
inside it defused; `max_turns` counts environment calls, and a prompt after the last one gets one request for a
final answer when `force_final_answer` is on. The trajectory is bounded by `max_total_tokens`, the last turn cut to
fit, and each episode is scored by the `paper` reward preset (or any other the trainer names).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from prompt_r1.core.prompts import agent_messages, interaction_response, question_message
from prompt_r1.core.protocol import STOP_SEQUENCES, AgentTurn, parse_agent_output
from prompt_r1.core.tokens import initial_prompt_ids, turn_end_ids
from prompt_r1.loop.protocols.base import LoopProtocol, TurnBudget, append_user_turn, reply_usage

__all__ = ["PaperProtocol"]


class PaperProtocol(LoopProtocol):
    name = "paper"
    stop = STOP_SEQUENCES
    reward_preset = "paper"

    def agent_messages(self, state: dict) -> list[dict[str, str]]:
        return agent_messages(state)

    def first_prompt_ids(self, tokenizer: Any, question: str) -> list[int]:
        return initial_prompt_ids(tokenizer, [{"role": "user", "content": question_message(question)}])

    def turn_budget(
        self, prompt_tokens: int, used: int, max_total_tokens: int, per_turn: int | None
    ) -> TurnBudget | None:
        # The trajectory after the first prompt is bounded; the last turn is cut to what is left.
        remaining = max_total_tokens - used
        if remaining <= 0:
            return None
        bound = per_turn is None or remaining < per_turn
        return TurnBudget(remaining if bound else per_turn, trajectory_bound=bound)

    def read_turn(self, text: str, *, index: int, token_exact: bool) -> tuple[AgentTurn, dict[str, Any]]:
        return parse_agent_output(text), {}

    def environment_history(self, turns: Sequence[dict]) -> list[tuple[str, str]]:
        return [(t["prompt"], t["response"]) for t in turns if t.get("response_source") == "environment"]

    def observe(self, state: dict, reply: Any, tokenizer: Any, max_total_tokens: int) -> tuple[dict, dict]:
        index = state["turns"][-1]["index"]
        record = {
            "index": index,
            "response": reply.text,
            "response_source": "environment",
            "environment_call": reply.to_dict(),
        }
        update: dict[str, Any] = {"turns": [record], "usage": reply_usage(reply)}
        if tokenizer is not None:
            update.update(
                append_user_turn(tokenizer, state, interaction_response(reply.text), max_total_tokens)
            )
        event = {
            "type": "response",
            "turn": index,
            "text": reply.text,
            "attempts": reply.attempts,
            "latency_s": round(reply.latency_s, 3),
        }
        return update, event

    def environment_overflow(self, index: int, error: str) -> dict:
        return {"status": "context_overflow", "error": error, "turns": [{"index": index, "error": error}]}

    def route_prompt(
        self, state: dict, max_turns: int, force_final_answer: bool
    ) -> Literal["environment", "final_answer", "finalize"]:
        if state.get("final_request_sent"):
            return "finalize"
        if len(self.environment_history(state["turns"])) < max_turns:
            return "environment"
        return "final_answer" if force_final_answer else "finalize"

    def turns_used_up(self, state: dict, max_turns: int) -> bool:
        return False  # the router before the environment counts its calls

    def most_agent_turns(self, max_turns: int, force_final_answer: bool) -> int:
        # A turn per call, the turn after the last reply, and the final-answer request if that turn prompts.
        return max_turns + 1 + int(force_final_answer)

    def finish_trajectory(
        self,
        tokenizer: Any,
        trajectory: tuple[list[int], list[float], list[int]],
        *,
        cut_off: bool,
        max_total_tokens: int,
    ) -> tuple[list[int], list[float], list[int]]:
        # Close the agent's last turn as the chat template does when the agent stopped on a stop string (the
        # template's end-of-turn marker, not trained on): TRL reads a completion that does not end on EOS as
        # truncated. Episodes cut off by a budget stay as they are, and are truncated.
        completion, logprobs, mask = (list(part) for part in trajectory)
        if not cut_off or not completion:
            end = turn_end_ids(tokenizer, completion[-3:])
            if not completion or len(completion) + len(end) <= max_total_tokens:
                completion += end
                logprobs += [0.0] * len(end)
                mask += [0] * len(end)
        return completion, logprobs, mask
