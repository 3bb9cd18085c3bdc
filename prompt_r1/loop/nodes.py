"""The loop's nodes and routers: what each step of an episode does, with what differs by protocol asked of the
protocol object (prompt_r1.loop.protocols).

`LoopNodes` holds what every step needs (the agent, the environment, the protocol, the loop's settings); graph.py
wires its methods into the state machine. Each node returns only the keys it changes; the routers alone decide
where to go.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END

from prompt_r1.agents.base import AgentBackend, AgentOutput, AgentRequest
from prompt_r1.clients.environment import Environment
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentRefused, ContextOverflow, EnvironmentCallError, EnvironmentRefused
from prompt_r1.core.events import emit, end_event, traced_agent_call, turn_events
from prompt_r1.core.prompts import FINAL_ANSWER_REQUEST
from prompt_r1.core.protocol import AgentTurn
from prompt_r1.core.text import repair, valid
from prompt_r1.loop.protocols import LoopProtocol, protocol_for
from prompt_r1.loop.protocols.base import TurnBudget, append_user_turn
from prompt_r1.loop.state import EpisodeState

__all__ = ["LoopNodes"]


def _outcome(record: dict) -> dict:
    """Status, answer and error of an episode whose last agent turn is `record` (an answer or malformed)."""
    if record["kind"] == "answer" and record["answer"]:
        return {"status": "answered", "answer": record["answer"], "error": None}
    return {"status": "format_error", "answer": None, "error": "; ".join(record["defects"])}


class LoopNodes:
    """The nodes and routers of one compiled loop.

    loop: the loop's settings; token_exact: keep token ids (the agent backend then has a tokenizer).
    """

    def __init__(
        self, agent: AgentBackend, environment: Environment, loop: LoopConfig, *, token_exact: bool
    ) -> None:
        self.agent = agent
        self.environment = environment
        self.loop = loop
        self.protocol: LoopProtocol = protocol_for(loop)
        self.tokenizer = getattr(agent, "tokenizer", None)
        self.token_exact = token_exact
        # The per-turn cap: the loop's, else the backend's own configured cap (paper: 1,024).
        self.per_turn = loop.max_turn_tokens or getattr(
            getattr(agent, "config", None), "max_new_tokens", None
        )
        if token_exact and self.tokenizer is None:
            raise ValueError("token_exact=True needs an agent backend with a tokenizer (local or vLLM)")
        if token_exact:
            self.protocol.check_tokenizer(self.tokenizer)

    @property
    def trajectory_tokenizer(self) -> Any:
        """The tokenizer that renders what the trajectory appends; None off the token path."""
        return self.tokenizer if self.token_exact else None

    # The agent's turn

    async def agent_node(self, state: EpisodeState, config: RunnableConfig) -> dict:
        index = len(state.get("turns", []))
        question = state.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"the input needs a non-empty 'question' string, got {question!r}")
        update: dict[str, Any] = {}
        prompt_ids, budget = None, TurnBudget(self.per_turn)
        if self.token_exact:
            prompt_ids = state.get("prompt_ids") or self.protocol.first_prompt_ids(self.tokenizer, question)
            if not state.get("prompt_ids"):
                update["prompt_ids"] = prompt_ids
            used = len(state.get("completion_ids", []))
            budget = self.protocol.turn_budget(
                len(prompt_ids), used, self.loop.max_total_tokens, self.per_turn
            )
            if budget is None:
                error = f"trajectory reached {used} of {self.loop.max_total_tokens} tokens"
                update.update(status="context_overflow", error=error)
                await emit(config, [end_event(state, update)])
                return update
            prompt_ids = prompt_ids + state.get("completion_ids", [])
        request = AgentRequest(
            messages=self.protocol.agent_messages(state),
            prompt_ids=prompt_ids,
            max_new_tokens=budget.max_new_tokens,
            stop=self.protocol.stop,
            turn=index,
        )
        try:
            output = await traced_agent_call(self.agent, request, config, index)
        except (ContextOverflow, AgentRefused) as exc:
            # A full context, or a refusal (an outcome like the environment's: recorded, never retried).
            if isinstance(exc, AgentRefused):
                update.update(status="refused", error=f"{type(exc).__name__}: {exc}", answer=None)
            else:
                update.update(status="context_overflow", error=str(exc), answer=None)
            await emit(config, [{"type": "error", "turn": index, "text": str(exc)}, end_event(state, update)])
            return update
        turn, record = self._record(state, output, index)
        update["turns"] = [record]
        update["usage"] = {
            "agent_calls": 1,
            "agent_prompt_tokens": output.prompt_tokens,
            "agent_completion_tokens": output.completion_tokens,
        }
        if self.token_exact:
            update.update(self._sampled(output, turn, budget))
        if "status" not in update and turn.kind != "prompt":
            # The agent's own turn ends the episode: settle it here rather than in one more graph step.
            update.update(_outcome(record))
        events = turn_events(record)
        if "status" in update:
            events.append(end_event(state, update))
        await emit(config, events)
        return update

    def _record(self, state: EpisodeState, output: AgentOutput, index: int) -> tuple[AgentTurn, dict]:
        """The generation parsed as the protocol reads it, and its turn record."""
        text, repaired = repair(output.text)
        turn, fields = self.protocol.read_turn(text, index=index, token_exact=self.token_exact)
        if turn.prompt is not None and not valid(turn.prompt):
            # A JSON tool call can spell half a surrogate pair as an escape (\ud800) in valid text.
            turn = dataclasses.replace(turn, prompt=repair(turn.prompt)[0])
            repaired = True
        record = turn.to_record()
        record.update(fields)
        record.update(index=index, finish_reason=output.finish_reason, agent_tokens=output.completion_tokens)
        if repaired:  # the generation held text UTF-8 cannot encode; the record has U+FFFD in its place
            record["text_repaired"] = True
        if state.get("final_request_sent"):
            record["after_final_request"] = True
        return turn, record

    def _sampled(self, output: AgentOutput, turn: AgentTurn, budget: TurnBudget) -> dict:
        """The sampled ids the trajectory keeps, and the end of the episode when the trajectory budget cut the
        turn off (the context is full)."""
        ids = output.token_ids or []
        logprobs = list(output.logprobs) if output.logprobs is not None else [0.0] * len(ids)
        ids, logprobs = self.protocol.kept_ids(self.tokenizer, ids, logprobs)
        update: dict[str, Any] = {"completion_ids": ids, "logprobs": logprobs, "env_mask": [1] * len(ids)}
        cut_by_trajectory = budget.trajectory_bound and len(ids) >= budget.max_new_tokens
        if output.finish_reason == "length" and turn.kind == "malformed" and cut_by_trajectory:
            update["status"] = "context_overflow"
            update["error"] = f"trajectory budget of {self.loop.max_total_tokens} tokens reached mid-turn"
            update["answer"] = None
        return update

    # The environment's turn

    async def environment_node(self, state: EpisodeState, config: RunnableConfig) -> dict:
        last = state["turns"][-1]
        answered = self.protocol.answer_without_environment(state, self.trajectory_tokenizer)
        if answered is not None:
            update, event = answered
            await emit(config, [event])
            return update
        system_prompt = self.protocol.environment_system_prompt
        try:
            # The environment's chat-model run carries the turn it answers, for traces.
            metadata = {**(config.get("metadata") or {}), "prompt_r1_turn": last["index"]}
            # A batching agent backend must not count on this episode's next request while the environment
            # answers (prompt_r1.agents.batching); other backends have no `away`.
            away = getattr(self.agent, "away", None)
            with away() if away is not None else contextlib.nullcontext():
                reply = await self.environment.respond(
                    last["prompt"],
                    self.protocol.environment_history(state["turns"][:-1]),
                    run_config={**config, "metadata": metadata},
                    **({} if system_prompt is None else {"system_prompt": system_prompt}),
                )
        except ContextOverflow as exc:
            await emit(config, [{"type": "error", "turn": last["index"], "text": str(exc)}])
            return self.protocol.environment_overflow(last["index"], str(exc))
        except EnvironmentCallError as exc:
            error = f"{type(exc).__name__}: {exc}"
            await emit(config, [{"type": "error", "turn": last["index"], "text": error}])
            return {
                "status": "refused" if isinstance(exc, EnvironmentRefused) else "environment_error",
                "error": error,
                "turns": [{"index": last["index"], "error": error}],
                "usage": {"env_failed_calls": 1, "env_retries": exc.attempts - 1},
            }
        update, event = self.protocol.observe(
            state, reply, self.trajectory_tokenizer, self.loop.max_total_tokens
        )
        await emit(config, [event])
        return update

    async def final_answer_node(self, state: EpisodeState, config: RunnableConfig) -> dict:
        """Turns used up while the agent still prompts (force_final_answer): ask it once for a final answer."""
        last = state["turns"][-1]
        record = {
            "index": last["index"],
            "response": FINAL_ANSWER_REQUEST,
            "response_source": "final_request",
        }
        update: dict[str, Any] = {"final_request_sent": True, "turns": [record]}
        if self.token_exact:
            update.update(
                append_user_turn(self.tokenizer, state, FINAL_ANSWER_REQUEST, self.loop.max_total_tokens)
            )
        await emit(config, [{"type": "final_request", "turn": last["index"], "text": FINAL_ANSWER_REQUEST}])
        return update

    async def finalize_node(self, state: EpisodeState, config: RunnableConfig) -> dict:
        """Endings the agent's turn did not settle: a failed call or a full context (status already set), or
        turns used up while the agent still prompts."""
        turns = state.get("turns", [])
        last = turns[-1] if turns else None
        if state.get("status"):
            update = {"answer": None}
        elif last is not None and last["kind"] != "prompt":
            update = _outcome(last)
        else:
            update = {"status": "max_turns", "answer": None, "error": None}
        await emit(config, [end_event(state, update)])
        return update

    # The routers

    def route_after_agent(
        self, state: EpisodeState
    ) -> Literal["environment", "final_answer", "finalize", "__end__"]:
        if state.get("status"):  # settled by the agent node: an answer, a malformed turn, a full context
            return END
        if state["turns"][-1]["kind"] != "prompt":
            return "finalize"
        return self.protocol.route_prompt(state, self.loop.max_turns, bool(self.loop.force_final_answer))

    def route_after_environment(self, state: EpisodeState) -> Literal["agent", "finalize"]:
        """After the environment's response or the final-answer request: on to the agent unless it failed, no
        longer fits the trajectory budget, or the protocol counts the turns used up."""
        if state.get("status"):
            return "finalize"
        return "finalize" if self.protocol.turns_used_up(state, self.loop.max_turns) else "agent"
