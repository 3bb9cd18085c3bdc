"""Per-turn events of an episode, streamed as they happen so a UI can show the collaboration live.

The graph's nodes emit one small JSON dict per thing that happened, in order:

    {"type": "think",    "turn": 0, "text": "..."}    the agent's reasoning for turn 0
    {"type": "prompt",   "turn": 0, "text": "..."}    the prompt it sends to the environment
    {"type": "response", "turn": 0, "text": "...", "attempts": 1, "latency_s": 0.8}   the environment's reply
    {"type": "call_error", "turn": 0, "text": "Error: No tool name"}   --protocol release: a malformed call's answer
    {"type": "final_request", "turn": 4, "text": "..."}   turns used up: the agent is asked once for an answer
    {"type": "answer",   "turn": 1, "text": "..."}    the agent's final answer
    {"type": "malformed", "turn": 1, "text": "<raw generation>", "defects": ["..."]}
    {"type": "error",    "turn": 1, "text": "EnvironmentTimeout: ..."}   a failed call or a full context
    {"type": "end", "status": "answered", "answer": "...", "turns": 2, "error": null}   always last

Two ways to receive them, both standard LangGraph/LangChain:
- `graph.astream(inputs, stream_mode="custom")` (or `["custom", "values"]` to get the final state as well);
  when the loop is a subgraph of a parent graph, pass `subgraphs=True` to the parent's `astream`.
- `graph.astream_events(inputs, version="v2")`: events named `prompt_r1` (`on_custom_event`) carry the same dicts,
  also from inside a parent graph or from a `PromptR1Chat` model's `astream_events` (its episode runs as a child
  of the model's run, so the events reach the model's listeners).

    async for mode, data in graph.astream({"question": q}, stream_mode=["custom", "values"]):
        if mode == "custom":
            print(format_event(data))
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

__all__ = [
    "EVENT_NAME",
    "EVENT_TYPES",
    "emit",
    "end_event",
    "format_event",
    "traced_agent_call",
    "turn_events",
]

EVENT_NAME = "prompt_r1"  # the name of the custom events in astream_events
EVENT_TYPES = (
    "think",
    "prompt",
    "response",
    "call_error",
    "final_request",
    "answer",
    "malformed",
    "error",
    "end",
)


def turn_events(record: dict) -> list[dict[str, Any]]:
    """The events of one parsed agent turn (a turn record, see protocol.AgentTurn.to_record).

    >>> [e["type"] for e in turn_events({"index": 0, "kind": "prompt", "think": "t", "prompt": "p"})]
    ['think', 'prompt']
    """
    index = record["index"]
    events: list[dict[str, Any]] = []
    if record.get("think"):
        events.append({"type": "think", "turn": index, "text": record["think"]})
    if record["kind"] == "prompt" and record.get("prompt") is not None:
        events.append({"type": "prompt", "turn": index, "text": record["prompt"]})
    elif record["kind"] == "answer" and record.get("answer"):
        events.append({"type": "answer", "turn": index, "text": record["answer"]})
    else:
        events.append(
            {
                "type": "malformed",
                "turn": index,
                "text": record.get("text", ""),
                "defects": record.get("defects", []),
            }
        )
    return events


def end_event(state: dict, update: dict) -> dict[str, Any]:
    """The closing event, from the state before the last step and that step's update."""
    turns = len(state.get("turns", [])) + sum(
        1 for t in update.get("turns", []) if t["index"] >= len(state.get("turns", []))
    )
    return {
        "type": "end",
        "status": update.get("status", state.get("status")),
        "answer": update.get("answer"),
        "turns": turns,
        "error": update.get("error", state.get("error")),
    }


def _has_handlers(config: RunnableConfig | None) -> bool:
    callbacks = (config or {}).get("callbacks")
    if callbacks is None:
        return False
    handlers = callbacks if isinstance(callbacks, list) else getattr(callbacks, "handlers", None)
    return bool(handlers)


async def emit(config: RunnableConfig | None, events: list[dict[str, Any]]) -> None:
    """Send `events` to the graph's custom stream and, where a callback handler listens (astream_events,
    tracers), as custom callback events. Costs nothing measurable when nobody listens."""
    if not events:
        return
    from langgraph.config import get_stream_writer

    try:
        writer = get_stream_writer()
    except RuntimeError:  # called outside a graph run
        writer = None
    if writer is not None:
        for event in events:
            writer(event)
    if _has_handlers(config):
        from langchain_core.callbacks import adispatch_custom_event

        for event in events:
            await adispatch_custom_event(EVENT_NAME, event, config=config)


def format_event(event: dict[str, Any]) -> str:
    """One human-readable line (or block) for an event, as `prompt-r1 run` prints them.

    >>> format_event({"type": "prompt", "turn": 0, "text": "Who wrote Hamlet?"})
    'turn 1  prompt:    Who wrote Hamlet?'
    """
    kind = event["type"]
    if kind == "end":
        tail = f" · answer: {event['answer']}" if event.get("answer") is not None else ""
        error = f" · {event['error']}" if event.get("error") else ""
        return f"end     {event['status']} after {event['turns']} turn(s){tail}{error}"
    text = str(event.get("text", "")).strip()
    if kind == "malformed":
        # What is missing, then what the agent wrote instead (cut: an untrained model may ramble for pages).
        wrote = text if len(text) <= 400 else text[:400] + " …"
        defects = "; ".join(event.get("defects", []))
        text = f"{defects}\nwrote: {wrote}" if defects and wrote else defects or wrote
    label = {"final_request": "asked:", "malformed": "defects:", "call_error": "answered:"}.get(
        kind, f"{kind}:"
    )
    body = text.replace("\n", "\n" + " " * 19)  # under the text of the first line
    return f"turn {event['turn'] + 1:<2} {label:<10} {body}"


async def traced_agent_call(agent: Any, request: Any, config: RunnableConfig | None, turn: int) -> Any:
    """`agent.generate(request)`, shown to callback handlers (LangSmith, any tracer) as a chat-model run named
    `agent` with the turn index, model and token usage, nested under the graph's `agent` node. Backends talk to
    their model directly, not through LangChain, so without this the agent's calls would not appear in a trace.
    Nothing is done when no handler listens."""
    from langchain_core.runnables.config import get_async_callback_manager_for_config

    # Built from the config and the process's tracing hooks (LangSmith's environment variables, collect_runs),
    # so a tracer enabled either way sees the call.
    manager = get_async_callback_manager_for_config(config or {})
    if not manager.handlers:
        return await agent.generate(request)
    from langchain_core.messages import AIMessage, convert_to_messages
    from langchain_core.outputs import ChatGeneration, LLMResult

    model = str(getattr(getattr(agent, "config", None), "model", None) or type(agent).__name__)
    manager.add_tags(["prompt-r1", "agent"], inherit=False)
    manager.add_metadata(
        {"prompt_r1_turn": turn, "ls_model_name": model, "ls_provider": "prompt-r1"}, inherit=False
    )
    (run,) = await manager.on_chat_model_start(
        {"name": "agent", "id": ["prompt_r1", "agent", type(agent).__name__]},
        [convert_to_messages(request.messages)],
        name="agent",
        invocation_params={"max_new_tokens": request.max_new_tokens, "stop": list(request.stop)},
    )
    try:
        output = await agent.generate(request)
    except BaseException as exc:
        await run.on_llm_error(exc)
        raise
    usage = {
        "input_tokens": output.prompt_tokens,
        "output_tokens": output.completion_tokens,
        "total_tokens": output.prompt_tokens + output.completion_tokens,
    }
    message = AIMessage(
        output.text, usage_metadata=usage, response_metadata={"finish_reason": output.finish_reason}
    )
    await run.on_llm_end(
        LLMResult(generations=[[ChatGeneration(message=message)]], llm_output={"model": model})
    )
    return output
