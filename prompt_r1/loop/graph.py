"""The Prompt-R1 loop as a LangGraph state machine, shared by inference, batch runs and GRPO rollouts.

    START ─▶ begin ─▶ agent ──route_after_agent──▶ environment ──route_after_environment──▶ agent …
                          │  │                  ├─▶ final_answer ──(same router)──▶ agent   (turns used up: ask once)
                          │  │                  └─▶ finalize ─▶ END          (environment error, overflow, turns used up)
                          │  └─▶ END     (the agent's turn settled the episode: an answer, a malformed turn, a full context)

`begin` starts each new input as a new episode (on a thread, whatever the last episode left is dropped).

Nodes do the work and return only the keys they change; the two routers alone decide where to go, and
`max_turns` lives in the router. The state is plain JSON (question, turn records, usage, and for backends with a
tokenizer the token-exact trajectory), so it checkpoints, streams and crosses process boundaries as it is.
Clients and models come in through the closure, never through the state.

    graph = build_graph(agent, EnvironmentClient(EnvironmentConfig(model="gpt-4o-mini")), max_turns=5)
    result = await graph.ainvoke({"question": "Who wrote Hamlet?"})
    result["answer"], result["status"], result["turns"], result["usage"]
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Overwrite

from prompt_r1.agents.base import AgentBackend, AgentRequest
from prompt_r1.clients.environment import Environment, as_environment
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentRefused, ContextOverflow, EnvironmentCallError, EnvironmentRefused
from prompt_r1.core.events import emit, end_event, traced_agent_call, turn_events
from prompt_r1.core.prompts import FINAL_ANSWER_REQUEST, agent_messages, interaction_response
from prompt_r1.core.protocol import STOP_SEQUENCES, parse_agent_output
from prompt_r1.core.text import repair, valid
from prompt_r1.core.tokens import initial_prompt_ids, user_turn_ids
from prompt_r1.loop import release
from prompt_r1.loop.graph_runnables import inline, sync_and_async

__all__ = [
    "STATUSES",
    "EpisodeInput",
    "EpisodeState",
    "build_graph",
    "finish_reason",
    "trajectory_of",
]

Status = Literal["answered", "max_turns", "format_error", "refused", "environment_error", "context_overflow"]
STATUSES: tuple[str, ...] = (
    "answered",
    "max_turns",
    "format_error",
    "refused",  # the environment's content filter or model refused a prompt: an outcome, not retried
    "environment_error",
    "context_overflow",
)


TRAJECTORY_KEYS: tuple[str, ...] = ("prompt_ids", "completion_ids", "env_mask", "logprobs")


def trajectory_of(state: dict) -> dict | None:
    """The token ids the agent read and wrote, with the environment mask and log-probabilities, or None for an
    episode without them (a text-only backend leaves the id lists empty and no prompt ids)."""
    return {k: state.get(k) for k in TRAJECTORY_KEYS} if state.get("prompt_ids") else None


def finish_reason(status: str | None) -> str:
    """An episode's status as an OpenAI `finish_reason`, for the surfaces that speak OpenAI's API."""
    if status == "refused":  # OpenAI's own word for a reply a content filter withheld
        return "content_filter"
    return "length" if status in ("max_turns", "context_overflow") else "stop"


def merge_turns(left: list[dict] | None, right: list[dict] | None) -> list[dict]:
    """Reducer for `turns`: a record whose `index` exists updates that turn, any other is appended."""
    merged = [dict(t) for t in (left or [])]
    for update in right or []:
        index = update["index"]
        if index < len(merged):
            merged[index] = {**merged[index], **update}
        else:
            merged.append(dict(update))
    return merged


def add_usage(left: dict | None, right: dict | None) -> dict:
    """Reducer for `usage`: counters add up key by key."""
    total = dict(left or {})
    for key, value in (right or {}).items():
        total[key] = total.get(key, 0) + value
    return total


class EpisodeInput(TypedDict):
    question: str
    golden_answers: NotRequired[list[str]]


class EpisodeState(TypedDict, total=False):
    question: str
    golden_answers: list[str]
    # One record per agent turn: think, prompt or answer, defects, then the response it got (see protocol.py).
    turns: Annotated[list[dict], merge_turns]
    usage: Annotated[dict, add_usage]
    final_request_sent: bool
    # Set by a node that ends the episode early (environment_error, context_overflow); finalize fills in the rest.
    status: Status | None
    answer: str | None
    error: str | None
    # Token-exact trajectory, kept when the agent backend has a tokenizer. completion_ids holds the agent's
    # sampled ids (env_mask 1, with their logprobs) and the rendered environment turns (env_mask 0, logprob 0).
    prompt_ids: list[int]
    completion_ids: Annotated[list[int], operator.add]
    logprobs: Annotated[list[float], operator.add]
    env_mask: Annotated[list[int], operator.add]


class _BeginState(EpisodeState, total=False):
    # Private to the begin node (not in the graph's output): the question and golden answers the thread's last
    # episode began with, to tell golden answers a new input gave from those the earlier question left behind.
    asked: dict


# What an episode starts from: on a thread (a checkpointer), whatever the previous episode left is replaced, the
# lists and counters that grow through reducers included (Overwrite bypasses them).
_FRESH: dict[str, Any] = {
    "turns": Overwrite([]),
    "usage": Overwrite({}),
    "final_request_sent": False,
    "status": None,
    "answer": None,
    "error": None,
    "prompt_ids": [],
    "completion_ids": Overwrite([]),
    "logprobs": Overwrite([]),
    "env_mask": Overwrite([]),
}


def begin_episode(state: _BeginState) -> dict:
    """A new input starts a new episode. Without a checkpointer the state is fresh already; on a thread that has
    run an episode (LangGraph Studio, a chat UI, `langgraph dev` reuse threads) the earlier episode's turns,
    usage, status and trajectory would otherwise carry into this one: the agent would see the earlier question's
    turns and answer from them. Golden answers go with the input that gives them: those the earlier question
    came with are dropped for a different question. Resuming an interrupted episode (input None) never passes
    here: LangGraph continues from its last step."""
    asked = {"question": state.get("question"), "golden_answers": state.get("golden_answers")}
    if not state.get("turns") and state.get("status") is None:  # nothing ran on this thread yet
        return {"asked": asked}
    previous = state.get("asked") or {}
    update = {**_FRESH, "asked": asked}
    stale = asked["golden_answers"] is not None and asked["golden_answers"] == previous.get("golden_answers")
    if stale and asked["question"] != previous.get("question"):
        update["golden_answers"] = None
        update["asked"] = {**asked, "golden_answers": None}
    return update


def environment_history(turns: Sequence[dict]) -> list[tuple[str, str]]:
    """The (prompt, response) pairs the environment has answered, oldest first."""
    return [(t["prompt"], t["response"]) for t in turns if t.get("response_source") == "environment"]


def _outcome(record: dict) -> dict:
    """Status, answer and error of an episode whose last agent turn is `record` (an answer or malformed)."""
    if record["kind"] == "answer" and record["answer"]:
        return {"status": "answered", "answer": record["answer"], "error": None}
    return {"status": "format_error", "answer": None, "error": "; ".join(record["defects"])}


# build_graph's loop keywords and their defaults (a LoopConfig of them has LoopConfig's own defaults).
_LOOP_KEYWORDS = {
    "max_turns": 5,
    "force_final_answer": None,
    "max_new_tokens": None,
    "max_total_tokens": 8192,
    "protocol": "paper",
}


def build_graph(
    agent: AgentBackend,
    environment: Environment | BaseChatModel,
    *,
    loop: LoopConfig | None = None,
    max_turns: int = 5,
    force_final_answer: bool | None = None,
    max_new_tokens: int | None = None,
    max_total_tokens: int = 8192,
    protocol: str = "paper",
    token_exact: bool | None = None,
    checkpointer: Any = None,
    name: str = "prompt_r1",
):
    """Compile the loop. The result is a LangChain Runnable (`invoke`, `ainvoke`, `abatch`, `astream`) and can be
    added as a node of a parent graph whose state has `question` (and optionally `golden_answers`).

    loop: the loop's settings in one object (prompt_r1.LoopConfig), instead of the five keywords below.
    max_turns: most environment calls per episode (paper: 5); under the release protocol, most agent turns.
    force_final_answer: when the agent prompts after its last allowed call, ask it once for a final answer
        (unset: on under the paper protocol, the inference default); off, the episode ends with status
        `max_turns` (the training setting, and the release protocol's).
    max_new_tokens: per-turn generation budget (None: the backend config's `max_new_tokens`; paper: 1,024).
    max_total_tokens: budget of the whole trajectory after the first prompt (paper: 8,192); token-exact only.
        Under the release protocol: the limit on prompt + trajectory, checked before each agent turn.
    protocol: "paper", or "release" for the reference release's training rollout (prompt_r1/loop/release.py).
    token_exact: keep token ids (default: whenever the backend has a tokenizer).
    checkpointer: a LangGraph checkpointer (threads): each input on a thread is a new episode, and `invoke(None,
        thread)` resumes an interrupted one (graphs/README.md, "Threads").
    """
    passed = dict(
        max_turns=max_turns,
        force_final_answer=force_final_answer,
        max_new_tokens=max_new_tokens,
        max_total_tokens=max_total_tokens,
        protocol=protocol,
    )
    if loop is not None:
        given = [k for k, default in _LOOP_KEYWORDS.items() if passed[k] != default]
        if given:
            raise ValueError(f"give loop= or the loop's keywords ({', '.join(given)}), not both")
    elif max_turns < 0:
        raise ValueError(f"max_turns must be >= 0, got {max_turns}")
    else:  # LoopConfig names the per-turn budget max_turn_tokens
        loop = LoopConfig(max_turn_tokens=passed.pop("max_new_tokens"), **passed)
    options = loop.graph_options()
    max_turns, force_final_answer = options["max_turns"], options["force_final_answer"]
    max_new_tokens, max_total_tokens = options["max_new_tokens"], options["max_total_tokens"]
    by_release = options["protocol"] == "release"
    environment = as_environment(environment)
    tokenizer = getattr(agent, "tokenizer", None)
    token_exact = tokenizer is not None if token_exact is None else token_exact
    # The per-turn cap: the given one, else the backend's own configured cap (paper: 1,024).
    per_turn = max_new_tokens or getattr(getattr(agent, "config", None), "max_new_tokens", None)
    if token_exact and tokenizer is None:
        raise ValueError("token_exact=True needs an agent backend with a tokenizer (local or vLLM)")
    if by_release and token_exact:
        release.check_tokenizer(tokenizer)
    # The release's turns end on the end-of-turn token alone; the paper's at the first closing action tag.
    stop = () if by_release else STOP_SEQUENCES
    # The environment's system prompt under the release (a trailing space); None: the environment's own.
    system_prompt = release.ENVIRONMENT_SYSTEM_PROMPT_RELEASE if by_release else None

    async def agent_node(state: EpisodeState, config: RunnableConfig) -> dict:
        turns = state.get("turns", [])
        index = len(turns)
        question = state.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"the input needs a non-empty 'question' string, got {question!r}")
        messages = release.agent_messages(question, turns) if by_release else agent_messages(state)
        update: dict[str, Any] = {}
        prompt_ids = None
        budget = per_turn
        trajectory_bound = False  # True when the trajectory budget, not the per-turn one, caps this turn
        if token_exact:
            prompt_ids = state.get("prompt_ids") or (
                release.first_prompt_ids(tokenizer, question)
                if by_release
                else initial_prompt_ids(tokenizer, messages[:1])
            )
            if not state.get("prompt_ids"):
                update["prompt_ids"] = prompt_ids
            used = len(state.get("completion_ids", []))
            remaining = max_total_tokens - used
            # The release stops before a turn once prompt + trajectory exceed its limit, and never cuts a turn
            # short to fit; ours bounds the trajectory and cuts the last turn to what is left.
            over = len(prompt_ids) + used > max_total_tokens if by_release else remaining <= 0
            if over:
                update.update(
                    status="context_overflow", error=f"trajectory reached {used} of {max_total_tokens} tokens"
                )
                await emit(config, [end_event(state, update)])
                return update
            trajectory_bound = not by_release and (per_turn is None or remaining < per_turn)
            budget = remaining if trajectory_bound else per_turn
            prompt_ids = prompt_ids + state.get("completion_ids", [])
        request = AgentRequest(messages=messages, prompt_ids=prompt_ids, max_new_tokens=budget, stop=stop)
        try:
            output = await traced_agent_call(agent, request, config, index)
        except ContextOverflow as exc:
            update.update(status="context_overflow", error=str(exc), answer=None)
            await emit(config, [{"type": "error", "turn": index, "text": str(exc)}, end_event(state, update)])
            return update
        except AgentRefused as exc:  # an outcome like the environment's refusal: recorded, never retried
            update.update(status="refused", error=f"{type(exc).__name__}: {exc}", answer=None)
            await emit(config, [{"type": "error", "turn": index, "text": str(exc)}, end_event(state, update)])
            return update
        text, repaired = repair(output.text)
        if by_release and token_exact and index > 0:
            text = release.PREFILL + text  # the turn as the agent's context has it: the prefill is its start
        turn = parse_agent_output(text)
        if by_release:
            turn, call_fields = release.release_turn(turn, text)
        if turn.prompt is not None and not valid(turn.prompt):
            # A JSON tool call can spell half a surrogate pair as an escape (\ud800) in valid text.
            turn = dataclasses.replace(turn, prompt=repair(turn.prompt)[0])
            repaired = True
        record = turn.to_record()
        if by_release:
            record.update(call_fields)
        record.update(index=index, finish_reason=output.finish_reason, agent_tokens=output.completion_tokens)
        if repaired:  # the generation held text UTF-8 cannot encode; the record has U+FFFD in its place
            record["text_repaired"] = True
        if state.get("final_request_sent"):
            record["after_final_request"] = True
        update["turns"] = [record]
        update["usage"] = {
            "agent_calls": 1,
            "agent_prompt_tokens": output.prompt_tokens,
            "agent_completion_tokens": output.completion_tokens,
        }
        if token_exact:
            ids = output.token_ids or []
            logprobs = list(output.logprobs) if output.logprobs is not None else [0.0] * len(ids)
            if by_release and tokenizer.pad_token_id in ids:
                # The release drops padding ids from what was sampled (Qwen3's <|endoftext|> also ends a turn).
                kept = [k for k, token in enumerate(ids) if token != tokenizer.pad_token_id]
                ids, logprobs = [ids[k] for k in kept], [logprobs[k] for k in kept]
            update["completion_ids"] = ids
            update["logprobs"] = logprobs
            update["env_mask"] = [1] * len(ids)
            # Cut off by the trajectory budget rather than by the per-turn budget: the context is full.
            if (
                output.finish_reason == "length"
                and turn.kind == "malformed"
                and trajectory_bound
                and len(ids) >= budget
            ):
                update["status"] = "context_overflow"
                update["error"] = f"trajectory budget of {max_total_tokens} tokens reached mid-turn"
                update["answer"] = None
        if "status" not in update and turn.kind != "prompt":
            # The agent's own turn ends the episode: settle it here rather than in one more graph step.
            update.update(_outcome(record))
        events = turn_events(record)
        if "status" in update:
            events.append(end_event(state, update))
        await emit(config, events)
        return update

    async def environment_node(state: EpisodeState, config: RunnableConfig) -> dict:
        turns = state["turns"]
        last = turns[-1]
        if by_release and last.get("call_error"):
            return await _release_observation(state, config, last["call_error"], None)
        try:
            # The environment's chat-model run carries the turn it answers, for traces.
            metadata = {**(config.get("metadata") or {}), "prompt_r1_turn": last["index"]}
            history = (
                release.environment_history(turns[:-1]) if by_release else environment_history(turns[:-1])
            )
            extra = {} if system_prompt is None else {"system_prompt": system_prompt}
            reply = await environment.respond(
                last["prompt"], history, run_config={**config, "metadata": metadata}, **extra
            )
        except ContextOverflow as exc:
            await emit(config, [{"type": "error", "turn": last["index"], "text": str(exc)}])
            return {
                # The release would show the API's error text; like any failed call here, it fails the episode.
                "status": "environment_error" if by_release else "context_overflow",
                "error": str(exc),
                "turns": [{"index": last["index"], "error": str(exc)}],
                **({"usage": {"env_failed_calls": 1}} if by_release else {}),
            }
        except EnvironmentCallError as exc:
            error = f"{type(exc).__name__}: {exc}"
            await emit(config, [{"type": "error", "turn": last["index"], "text": error}])
            return {
                "status": "refused" if isinstance(exc, EnvironmentRefused) else "environment_error",
                "error": error,
                "turns": [{"index": last["index"], "error": error}],
                "usage": {"env_failed_calls": 1, "env_retries": exc.attempts - 1},
            }
        if by_release:
            return await _release_observation(state, config, reply.text.strip(), reply)
        update: dict[str, Any] = {
            "turns": [
                {
                    "index": last["index"],
                    "response": reply.text,
                    "response_source": "environment",
                    "environment_call": reply.to_dict(),
                }
            ],
            "usage": {
                "env_calls": 1,
                "env_input_tokens": reply.input_tokens,
                "env_output_tokens": reply.output_tokens,
                "env_retries": reply.attempts - 1,
            },
        }
        if token_exact:
            update.update(_append_user_turn(state, interaction_response(reply.text)))
        await emit(
            config,
            [
                {
                    "type": "response",
                    "turn": last["index"],
                    "text": reply.text,
                    "attempts": reply.attempts,
                    "latency_s": round(reply.latency_s, 3),
                }
            ],
        )
        return update

    async def _release_observation(
        state: EpisodeState, config: RunnableConfig, text: str, reply: Any
    ) -> dict:
        """The release's answer to a call (a reply, or the call's error text when `reply` is None)."""
        index = state["turns"][-1]["index"]
        update, event = release.observation_update(index, text, reply, tokenizer if token_exact else None)
        await emit(config, [event])
        return update

    async def final_answer_node(state: EpisodeState, config: RunnableConfig) -> dict:
        last = state["turns"][-1]
        update: dict[str, Any] = {
            "final_request_sent": True,
            "turns": [
                {"index": last["index"], "response": FINAL_ANSWER_REQUEST, "response_source": "final_request"}
            ],
        }
        if token_exact:
            update.update(_append_user_turn(state, FINAL_ANSWER_REQUEST))
        await emit(config, [{"type": "final_request", "turn": last["index"], "text": FINAL_ANSWER_REQUEST}])
        return update

    def _append_user_turn(state: EpisodeState, content: str) -> dict:
        """The rendered message's ids, or, when they would overrun the trajectory budget, the end of the episode:
        the trajectory then stops after the agent's last turn instead of holding a cut-off message."""
        completion = state.get("completion_ids", [])
        ids = user_turn_ids(tokenizer, content, completion[-3:])
        if len(completion) + len(ids) > max_total_tokens:
            return {
                "status": "context_overflow",
                "error": f"the next message ({len(ids)} tokens) does not fit the trajectory budget of {max_total_tokens}",
            }
        return {"completion_ids": ids, "logprobs": [0.0] * len(ids), "env_mask": [0] * len(ids)}

    async def finalize_node(state: EpisodeState, config: RunnableConfig) -> dict:
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

    def route_after_agent(
        state: EpisodeState,
    ) -> Literal["environment", "final_answer", "finalize", "__end__"]:
        if state.get("status"):  # settled by the agent node: an answer, a malformed turn, a full context
            return END
        last = state["turns"][-1]
        if last["kind"] != "prompt":
            return "finalize"
        if by_release:  # every call is answered, the last turn's too; the turn limit is checked after it
            return "environment"
        if state.get("final_request_sent"):
            return "finalize"
        if len(environment_history(state["turns"])) < max_turns:
            return "environment"
        return "final_answer" if force_final_answer else "finalize"

    def route_after_environment(state: EpisodeState) -> Literal["agent", "finalize"]:
        """After the environment's response or the final-answer request: on to the agent unless it failed or
        no longer fits the trajectory budget; under the release protocol, once the agent has had its turns."""
        if state.get("status"):
            return "finalize"
        return "finalize" if by_release and len(state["turns"]) >= max_turns else "agent"

    builder = StateGraph(EpisodeState, input_schema=EpisodeInput)
    builder.add_node("begin", inline(begin_episode, "begin"), input_schema=_BeginState)
    builder.add_node("agent", sync_and_async(agent_node, "agent"))
    builder.add_node("environment", sync_and_async(environment_node, "environment"))
    builder.add_node("final_answer", sync_and_async(final_answer_node, "final_answer"))
    builder.add_node("finalize", sync_and_async(finalize_node, "finalize"))
    builder.add_edge(START, "begin")
    builder.add_edge("begin", "agent")
    # The routes named, since a wrapped router hides its return type: the drawing shows every edge it can take.
    builder.add_conditional_edges(
        "agent",
        inline(route_after_agent, "route_after_agent", trace=False),
        ["environment", "final_answer", "finalize", END],
    )
    after_environment = inline(route_after_environment, "route_after_environment", trace=False)
    builder.add_conditional_edges("environment", after_environment, ["agent", "finalize"])
    builder.add_conditional_edges("final_answer", after_environment, ["agent", "finalize"])
    builder.add_edge("finalize", END)
    return builder.compile(checkpointer=checkpointer, name=name)


def mermaid() -> str:
    """The loop's topology as Mermaid, drawn from the compiled graph (the drawing in docs/concepts.md is this text:
    `python -m prompt_r1.loop.graph` prints it)."""
    return build_graph(_Unplayed(), _Unplayed()).get_graph().draw_mermaid()


class _Unplayed:
    """Agent and environment for drawing the topology, which calls neither (the loop imports no test double)."""

    tokenizer = None

    async def generate(self, request: AgentRequest) -> Any:
        raise NotImplementedError("drawn, not played")

    async def respond(self, prompt: str, history: Sequence[tuple[str, str]], **kwargs: Any) -> Any:
        raise NotImplementedError("drawn, not played")


if __name__ == "__main__":
    print(mermaid(), end="")
