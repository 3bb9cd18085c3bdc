"""Prompt-R1 as a LangChain chat model: a drop-in replacement wherever an app uses one today.

    from langchain_openai import ChatOpenAI
    from prompt_r1 import AgentConfig, PromptR1Chat, load_agent

    chat = PromptR1Chat(agent=load_agent(AgentConfig(model="./my-agent")), environment=ChatOpenAI(model="gpt-4o-mini"))
    chat.invoke("Which magazine was started first, Arthur's Magazine or First for Women?").content

Each call runs one episode of the loop on the text of the last user message (earlier messages and system
messages are not passed on: the agent writes the environment's prompts itself) and returns the answer as an
`AIMessage`:
- `content`: the answer, or "" when the episode ended without one;
- `response_metadata`: `status`, `turns` (the turn records), `error`, `finish_reason` ("stop" when answered,
  "length" when turns or tokens ran out) and `usage` (agent and environment counters, see graph.py);
- `usage_metadata`: agent and environment tokens added up.

`invoke`, `ainvoke`, `batch`, `abatch`, `stream`, `astream` and `astream_events` work as for any chat model, inside
LCEL chains and as the model of a LangGraph agent that needs no tool calls. Streaming yields one chunk per
per-turn event (think, prompt, response, ...; see events.py) with the event in
`additional_kwargs["prompt_r1_events"]` and empty content, then the answer; added up, the chunks give the whole
message with every event in order. An environment that fails past its retries raises `EnvironmentCallError`
(a chat model has no other way to say it has no answer); other endings are returned with their status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr

from prompt_r1.errors import EnvironmentCallError

__all__ = ["PromptR1Chat", "question_of"]

EVENTS_KEY = "prompt_r1_events"
STREAM_MODES = ["custom", "values"]  # the per-turn events, and the states for the final answer


def question_of(messages: list[BaseMessage]) -> str:
    """The text of the last user message (string content, or the text parts of a content list).

    >>> from langchain_core.messages import HumanMessage
    >>> question_of([HumanMessage("Who wrote Hamlet?")])
    'Who wrote Hamlet?'
    """
    for message in reversed(messages):
        if message.type != "human":
            continue
        content = message.content
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(
                part if isinstance(part, str) else str(part.get("text", ""))
                for part in content
                if isinstance(part, str) or part.get("type") == "text"
            )
        if not text.strip():
            raise ValueError("the last user message has no text for Prompt-R1 to answer")
        return text
    raise ValueError("Prompt-R1 needs a user message to answer; got none")


def _finish_reason(status: str | None) -> str:
    return "length" if status in ("max_turns", "context_overflow") else "stop"


def _usage_metadata(usage: dict) -> dict[str, int]:
    inputs = usage.get("agent_prompt_tokens", 0) + usage.get("env_input_tokens", 0)
    outputs = usage.get("agent_completion_tokens", 0) + usage.get("env_output_tokens", 0)
    return {"input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs}


class PromptR1Chat(BaseChatModel):
    """A chat model whose every call is one Prompt-R1 episode: the agent prompts the environment, then answers."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    agent: Any = Field(description="The agent backend (prompt_r1.load_agent(...), or any AgentBackend).")
    environment: Any = Field(
        description="The large LLM: an EnvironmentClient or EnvironmentPool, or any LangChain chat model "
        "(e.g. ChatOpenAI, which is wrapped in an EnvironmentClient)."
    )
    max_turns: int = Field(default=5, description="Most environment calls per episode (paper: 5).")
    force_final_answer: bool = Field(
        default=True, description="When turns run out, ask the agent once for an answer instead of giving up."
    )
    max_new_tokens: int | None = Field(
        default=None, description="Per-turn generation budget (None: the agent backend's own)."
    )
    max_total_tokens: int = Field(
        default=8192, description="Token budget of the whole trajectory (token-exact backends only)."
    )
    model_name: str = Field(
        default="prompt-r1", description="The name shown in traces and response metadata."
    )

    _graph: Any = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "prompt-r1"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "max_turns": self.max_turns}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(ls_provider="prompt-r1", ls_model_name=self.model_name)
        return params

    @property
    def graph(self):
        """The compiled loop, built on first use."""
        if self._graph is None:
            from prompt_r1.graph import build_graph

            self._graph = build_graph(
                self.agent,
                self.environment,
                max_turns=self.max_turns,
                force_final_answer=self.force_final_answer,
                max_new_tokens=self.max_new_tokens,
                max_total_tokens=self.max_total_tokens,
            )
        return self._graph

    def _config(self, run_manager: Any) -> dict[str, Any]:
        """The episode's run config: a child of this chat model's run, so a trace shows the episode (and its turns)
        under the call. LangChain's LLM run managers have no `get_child` (model runs are normally leaves), so the
        child manager is built the way `get_child` builds it for chains."""
        callbacks = None
        if run_manager is not None:
            from langchain_core.callbacks import AsyncCallbackManager, CallbackManager

            cls = (
                AsyncCallbackManager
                if isinstance(run_manager, AsyncCallbackManagerForLLMRun)
                else CallbackManager
            )
            callbacks = cls(handlers=[], parent_run_id=run_manager.run_id)
            callbacks.set_handlers(run_manager.inheritable_handlers)
            callbacks.add_tags(run_manager.inheritable_tags)
            callbacks.add_metadata(run_manager.inheritable_metadata)
        return {"callbacks": callbacks, "run_name": "prompt_r1_episode"}

    def _message(self, state: dict) -> AIMessage:
        if state.get("status") == "environment_error":
            raise EnvironmentCallError(state.get("error") or "the environment call failed")
        usage = state.get("usage", {})
        return AIMessage(
            content=state.get("answer") or "",
            response_metadata={
                "model_name": self.model_name,
                "status": state.get("status"),
                "finish_reason": _finish_reason(state.get("status")),
                "turns": state.get("turns", []),
                "error": state.get("error"),
                "usage": usage,
            },
            usage_metadata=_usage_metadata(usage),
        )

    # ---- whole calls ----------------------------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        state = self.graph.invoke({"question": question_of(messages)}, self._config(run_manager))
        return ChatResult(generations=[ChatGeneration(message=self._message(state))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        state = await self.graph.ainvoke({"question": question_of(messages)}, self._config(run_manager))
        return ChatResult(generations=[ChatGeneration(message=self._message(state))])

    # ---- streaming ------------------------------------------------------------------------------------------
    def _event_chunk(self, event: dict) -> ChatGenerationChunk:
        return ChatGenerationChunk(
            message=AIMessageChunk(content="", additional_kwargs={EVENTS_KEY: [event]})
        )

    def _final_chunk(self, state: dict) -> ChatGenerationChunk:
        message = self._message(state)
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=message.content,
                response_metadata=message.response_metadata,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
        )

    # LangChain hands `_stream`/`_astream` no run manager (it reports each chunk to the callbacks itself), so the
    # episode of a streamed call runs without a parent run.
    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        final: dict = {}
        for mode, data in self.graph.stream({"question": question_of(messages)}, stream_mode=STREAM_MODES):
            if mode == "values":
                final = data
            else:
                yield self._event_chunk(data)
        yield self._final_chunk(final)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        final: dict = {}
        async for mode, data in self.graph.astream(
            {"question": question_of(messages)}, stream_mode=STREAM_MODES
        ):
            if mode == "values":
                final = data
            else:
                yield self._event_chunk(data)
        yield self._final_chunk(final)
