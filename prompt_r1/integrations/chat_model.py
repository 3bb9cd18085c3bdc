"""Prompt-R1 as a LangChain chat model: a drop-in replacement wherever an app uses one today.

    from langchain_openai import ChatOpenAI
    from prompt_r1 import AgentConfig, PromptR1Chat, load_agent

    chat = PromptR1Chat(agent=load_agent(AgentConfig(model="./my-agent")), environment=ChatOpenAI(model="gpt-4o-mini"))
    chat = PromptR1Chat(agent="smollm2-135m", environment="smollm2-135m")   # the built-in model, offline
    chat.invoke("Which magazine was started first, Arthur's Magazine or First for Women?").content

Each call runs one episode of the loop on the text of the last user message (earlier messages and system
messages are not passed on: the agent writes the environment's prompts itself; a non-text part such as an image
raises ValueError) and returns the answer as an `AIMessage`:
- `content`: the answer, or "" when the episode ended without one;
- `response_metadata`: `status`, `turns` (the turn records), `error`, `finish_reason` ("stop" when answered,
  "length" when turns or tokens ran out) and `usage` (agent and environment counters, see graph.py);
- `usage_metadata`: agent and environment tokens added up.

`invoke`, `ainvoke`, `batch`, `abatch`, `stream`, `astream` and `astream_events` work as for any chat model, inside
LCEL chains and as the model of a LangGraph agent that needs no tool calls (`bind_tools([])` is the model itself;
tools or `with_structured_output` raise NotImplementedError: the answer is text). Every call, streamed or not,
traces its episode as a run named `prompt_r1_episode` under the chat model's own run. A stream carries the answer's
text and nothing else (no empty chunks). The per-turn events (think, prompt, response, ...; see events.py) arrive as
they happen as custom callback events named `prompt_r1` (`astream_events`' `on_custom_event`, or any callback
handler's `on_custom_event`), and all of them, in order, in the message's `additional_kwargs["prompt_r1_events"]`,
streamed or not. An environment that fails past its retries raises `EnvironmentCallError`
(a chat model has no other way to say it has no answer); other endings are returned with their status.

An unknown keyword is refused; of LangChain's standard parameters `stop` (at construction or per call) cuts the
answer before the first stop sequence, `streaming` is LangChain's own flag, and the others are accepted, checked
and ignored, named in `response_metadata["ignored"]` (chat_options.py). A `ChatOpenAI` environment is copied per
event loop (environment.py), so sync and async calls mix in one process.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.runnables.config import var_child_runnable_config
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from prompt_r1.core import redaction
from prompt_r1.core.config import LoopConfig, warn_loop_keywords
from prompt_r1.core.errors import EnvironmentCallError
from prompt_r1.core.text import before_stop
from prompt_r1.integrations.chat_options import CallOptions, call_options
from prompt_r1.loop.graph import finish_reason as _finish_reason
from prompt_r1.runs.episode import Episode, EpisodeRunner, question_from_messages

__all__ = ["PromptR1Chat", "question_of"]

EVENTS_KEY = "prompt_r1_events"
# PromptR1Chat's former loop keywords → LoopConfig's fields.
_LOOP_KEYWORDS = {
    "max_turns": "max_turns",
    "force_final_answer": "force_final_answer",
    "max_new_tokens": "max_turn_tokens",
    "max_total_tokens": "max_total_tokens",
}
NO_TOOLS = (
    "PromptR1Chat answers with text and makes no tool calls; use it with tools=[] (e.g. as the model of an agent "
    "without tools), or put a tool-calling model in front of it"
)


class _Parent(NamedTuple):
    """What the episode's runs inherit from the chat model's run: its id and its inheritable callbacks."""

    run_id: uuid.UUID
    handlers: list
    tags: list[str]
    metadata: dict[str, Any]


# The chat model's run, for a `_stream`/`_astream` that LangChain starts without it (see PromptR1Chat): set only
# while `_stream` starts, as (model, parent) so that another PromptR1Chat called inside never takes it for its own.
_STREAM_PARENT: ContextVar[tuple[Any, _Parent] | None] = ContextVar("prompt_r1_stream_parent", default=None)
_END = object()


def question_of(messages: list[BaseMessage]) -> str:
    """The text of the last user message (prompt_r1.runs.episode.question_from_messages).

    >>> from langchain_core.messages import HumanMessage
    >>> question_of([HumanMessage("Who wrote Hamlet?")])
    'Who wrote Hamlet?'
    """
    return question_from_messages(messages)


def _usage_metadata(episode: Episode) -> dict[str, int]:
    inputs, outputs = episode.token_totals
    return {"input_tokens": inputs, "output_tokens": outputs, "total_tokens": inputs + outputs}


class PromptR1Chat(BaseChatModel):
    """A chat model whose every call is one Prompt-R1 episode: the agent prompts the environment, then answers."""

    # An unknown keyword is an error: `max_turn=1`, a typo, must not leave max_turns at its default.
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    agent: Any = Field(
        default=None,
        description="The agent backend (prompt_r1.load_agent(...), or any AgentBackend), or a model name (a built-in "
        "model such as smollm2-135m, a folder, a hub id). None: as the command line's default (core/defaults.py).",
    )
    environment: Any = Field(
        default=None,
        description="The large LLM: an EnvironmentClient or EnvironmentPool, any LangChain chat model "
        "(e.g. ChatOpenAI, which is wrapped in an EnvironmentClient), or a model name (OpenAI's, or a built-in "
        "model served by this process). None: OpenAI's gpt-4o-mini, or the built-in model where OPENAI_API_KEY "
        "is not set.",
    )
    loop: LoopConfig | None = Field(
        default=None,
        description="How each episode runs (prompt_r1.LoopConfig: max_turns, force_final_answer, "
        "max_turn_tokens, max_total_tokens); None: LoopConfig()'s defaults.",
    )
    # The loop's settings as keywords, before LoopConfig was the one source: still read, with a warning.
    max_turns: int = Field(default=5, description="Deprecated: loop=LoopConfig(max_turns=...).")
    force_final_answer: bool = Field(
        default=True, description="Deprecated: loop=LoopConfig(force_final_answer=...)."
    )
    max_new_tokens: int | None = Field(
        default=None, description="Deprecated: loop=LoopConfig(max_turn_tokens=...)."
    )
    max_total_tokens: int = Field(
        default=8192, description="Deprecated: loop=LoopConfig(max_total_tokens=...)."
    )
    model_name: str = Field(
        default="prompt-r1", description="The name shown in traces and response metadata."
    )
    # LangChain's standard parameters (see chat_options.py): stop and streaming are honoured, the rest ignored.
    stop: list[str] | None = Field(
        default=None, description="Stop sequences: the answer is cut before the first (a call's stop= wins)."
    )
    streaming: bool = Field(default=False, description="invoke streams the episode (LangChain's own flag).")
    temperature: float | None = Field(default=None, description="Ignored (the agent's own settings sample).")
    max_tokens: int | None = Field(
        default=None, description="Ignored (the episode sets the answer's length)."
    )
    timeout: float | None = Field(default=None, description="Ignored (the environment client has its own).")
    max_retries: int | None = Field(default=None, description="Ignored (the environment client has its own).")

    @model_validator(mode="after")
    def _players(self) -> PromptR1Chat:
        """Model names (and nothing) become the agent and the environment they name (runs/players.py)."""
        if (
            self.agent is None
            or isinstance(self.agent, str)
            or self.environment is None
            or isinstance(self.environment, str)
        ):
            import warnings

            from prompt_r1.runs.players import players

            agent, environment, why = players(self.agent, self.environment)
            if why is not None:
                warnings.warn(f"PromptR1Chat: {why}", stacklevel=4)
            object.__setattr__(self, "agent", agent)
            object.__setattr__(self, "environment", environment)
        return self

    @model_validator(mode="after")
    def _one_loop(self) -> PromptR1Chat:
        """`loop` and the deprecated keywords become one LoopConfig, mirrored in the keywords' fields."""
        given = [name for name in _LOOP_KEYWORDS if name in self.model_fields_set]
        if given and self.loop is not None:
            raise ValueError(f"give loop= or the loop's keywords ({', '.join(given)}), not both")
        warn_loop_keywords("PromptR1Chat", given, _LOOP_KEYWORDS, stacklevel=5)
        loop = self.loop or LoopConfig(**{_LOOP_KEYWORDS[name]: getattr(self, name) for name in given})
        for name, field_name in _LOOP_KEYWORDS.items():
            object.__setattr__(self, name, getattr(loop, field_name))
        object.__setattr__(self, "loop", loop)
        call_options(self, self.stop, {})  # the standard parameters' values, checked
        return self

    _runner: Any = PrivateAttr(default=None)
    _runner_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "prompt-r1"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "max_turns": self.max_turns}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        params = super()._get_ls_params(stop=stop if stop is not None else self.stop, **kwargs)
        # Traced as what they are: the ignored parameters are not the episode's sampling settings.
        for name in ("ls_temperature", "ls_max_tokens"):
            params.pop(name, None)
        params.update(ls_provider="prompt-r1", ls_model_name=kwargs.get("model", self.model_name))
        return params

    @property
    def runner(self) -> EpisodeRunner:
        """The episode runner, built once on first use (a batch's threads may all ask for it at once)."""
        if self._runner is None:
            with self._runner_lock:
                if self._runner is None:
                    self._runner = EpisodeRunner(self.agent, self.environment, self.loop)
        return self._runner

    @property
    def graph(self):
        """The compiled loop (the runner's)."""
        return self.runner.graph

    # ---- no tools -------------------------------------------------------------------------------------------
    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> PromptR1Chat:
        """The model itself for an empty tool list (what an agent without tools binds); tools are refused."""
        if tools:
            raise NotImplementedError(NO_TOOLS)
        return self

    def with_structured_output(self, schema: Any, *, include_raw: bool = False, **kwargs: Any) -> Any:
        """Refused: structured output needs tool calls or a JSON mode."""
        raise NotImplementedError(f"{NO_TOOLS}; for structured output, parse its text answer instead")

    # ---- the episode's place in a trace ---------------------------------------------------------------------
    # The episode runs as a child of this chat model's run, so a trace shows it (and its turns) under the call.
    # Two things stand in the way. LangChain calls `_stream`/`_astream` without their run manager (it reports each
    # chunk itself), from `stream`, `astream` and the streaming branch of `invoke`: those entry points hand it on
    # through _STREAM_PARENT. And a graph started inside a caller's run (a node of a parent graph) merges its
    # config with the caller's, whose run would win as the parent: the episode starts with the caller's config
    # in context carrying this run's callbacks instead, as LangChain does for a chain's steps.

    def _episode(self, parent: _Parent | None, *, is_async: bool) -> tuple[list[str], RunnableConfig | None]:
        """The episode's extra tags (none: the runner names and tags every episode), and the caller's config as
        the graph must see it when it starts (None: unchanged). LangChain's LLM run managers have no `get_child`
        (model runs are normally leaves), so the child manager is built the way `get_child` builds it for
        chains."""
        if parent is None:
            return [], None
        callbacks = (AsyncCallbackManager if is_async else CallbackManager)(
            handlers=[], parent_run_id=parent.run_id
        )
        callbacks.set_handlers(parent.handlers)
        callbacks.add_tags(parent.tags)
        callbacks.add_metadata(parent.metadata)
        return [], {**(var_child_runnable_config.get() or {}), "callbacks": callbacks}

    def _stream_parent(self, run_manager: Any) -> _Parent | None:
        if run_manager is not None:  # LangChain's v2 streaming path does hand it on
            return _parent_of(run_manager)
        current = _STREAM_PARENT.get()
        return current[1] if current is not None and current[0] is self else None

    def _streamed_call(
        self, config: RunnableConfig | None, stop: list[str] | None, **kwargs: Any
    ) -> tuple[RunnableConfig, tuple[Any, _Parent]]:
        """The config `stream`/`astream` hand on, naming the id their run will have and holding its inheritable
        callbacks already set up, so that the episode's runs get the very handlers the run has (LangSmith's
        tracer among them, which matches a child to its parent by its own records)."""
        config = ensure_config(config)
        config["run_id"] = config.get("run_id") or uuid.uuid4()
        manager = CallbackManager.configure(
            config.get("callbacks"),
            None,
            self.verbose,
            config.get("tags"),
            None,
            {**(config.get("metadata") or {}), **self._get_ls_params(stop=stop, **kwargs)},
        )
        config["callbacks"] = manager
        parent = _Parent(
            config["run_id"],
            manager.inheritable_handlers,
            manager.inheritable_tags,
            manager.inheritable_metadata,
        )
        return config, (self, parent)

    def _generate_with_cache(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with _set(_STREAM_PARENT, (self, _parent_of(run_manager)) if run_manager else None):
            return super()._generate_with_cache(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate_with_cache(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with _set(_STREAM_PARENT, (self, _parent_of(run_manager)) if run_manager else None):
            return await super()._agenerate_with_cache(messages, stop=stop, run_manager=run_manager, **kwargs)

    def stream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        config, parent = self._streamed_call(config, stop, **kwargs)
        yield from _first_step_with(
            _STREAM_PARENT, parent, super().stream(input, config, stop=stop, **kwargs)
        )

    async def astream(
        self,
        input: Any,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        config, parent = self._streamed_call(config, stop, **kwargs)
        chunks = super().astream(input, config, stop=stop, **kwargs)
        async for chunk in _afirst_step_with(_STREAM_PARENT, parent, chunks):
            yield chunk

    def _message(self, episode: Episode, options: CallOptions, events: list[dict]) -> AIMessage:
        if episode.status == "environment_error":
            raise EnvironmentCallError(redaction.redact(episode.error) or "the environment call failed")
        usage = episode.usage
        return AIMessage(
            content=before_stop(episode.answer or "", options.stop),
            additional_kwargs={EVENTS_KEY: events},
            response_metadata={
                "model_name": self.model_name,
                "status": episode.status,
                "finish_reason": _finish_reason(episode.status),
                "turns": episode.turns,
                "error": episode.error,
                "usage": usage,
                "ignored": options.ignored,
            },
            usage_metadata=_usage_metadata(episode),
        )

    # ---- whole calls ----------------------------------------------------------------------------------------
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        question, options = question_of(messages), call_options(self, stop, kwargs)
        tags, caller = self._episode(run_manager and _parent_of(run_manager), is_async=False)
        with _set(var_child_runnable_config, caller):
            episode, events = _split(list(self.runner.stream_sync(question, tags=tags)))
        return ChatResult(generations=[ChatGeneration(message=self._message(episode, options, events))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        question, options = question_of(messages), call_options(self, stop, kwargs)
        tags, caller = self._episode(run_manager and _parent_of(run_manager), is_async=True)
        with _set(var_child_runnable_config, caller):
            episode, events = _split([item async for item in self.runner.stream(question, tags=tags)])
        return ChatResult(generations=[ChatGeneration(message=self._message(episode, options, events))])

    # ---- streaming ------------------------------------------------------------------------------------------
    # A stream carries text only: a chunk per turn event with empty content would reach every consumer of the
    # stream (a chain's `stream`, a chat UI, StrOutputParser) as an empty string. The turn events are custom
    # callback events named `prompt_r1` as they happen (the graph dispatches them to the run's callbacks, which
    # include the chat model's: `astream_events` and any handler's `on_custom_event` see them), and the answer's
    # chunk carries them all, in order, in `additional_kwargs[EVENTS_KEY]`, as the message `invoke` returns does.
    def _final_chunk(self, episode: Episode, options: CallOptions, events: list[dict]) -> ChatGenerationChunk:
        message = self._message(episode, options, events)
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=message.content,
                additional_kwargs=message.additional_kwargs,
                response_metadata=message.response_metadata,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        question, options = question_of(messages), call_options(self, stop, kwargs)
        tags, caller = self._episode(self._stream_parent(run_manager), is_async=False)
        items = self.runner.stream_sync(question, tags=tags)
        events: list[dict] = []
        for item in _first_step_with(var_child_runnable_config, caller, items):
            if isinstance(item, Episode):
                yield self._final_chunk(item, options, events)
            else:
                events.append(item)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        question, options = question_of(messages), call_options(self, stop, kwargs)
        tags, caller = self._episode(self._stream_parent(run_manager), is_async=True)
        items = self.runner.stream(question, tags=tags)
        events: list[dict] = []
        async for item in _afirst_step_with(var_child_runnable_config, caller, items):
            if isinstance(item, Episode):
                yield self._final_chunk(item, options, events)
            else:
                events.append(item)


def _split(items: list[Any]) -> tuple[Episode, list[dict]]:
    """An episode stream's items as (the Episode, which comes last; the events before it, in order)."""
    return items[-1], items[:-1]


def _parent_of(run_manager: Any) -> _Parent:
    return _Parent(
        run_manager.run_id,
        run_manager.inheritable_handlers,
        run_manager.inheritable_tags,
        run_manager.inheritable_metadata,
    )


@contextlib.contextmanager
def _set(var: ContextVar, value: Any) -> Iterator[None]:
    """`var` set to `value` inside the block (left as it is for None)."""
    if value is None:
        yield
        return
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


# A generator reads such context when it starts, within its first step. Set for that step only, the variable
# never outlives it, however the caller interleaves or abandons the iteration (whose later steps may even run in
# another context, where resetting it would fail).
def _first_step_with(var: ContextVar, value: Any, iterator: Iterator) -> Iterator:
    """The items of `iterator`, with `var` set to `value` (unless None) while it makes the first."""
    try:
        with _set(var, value):
            first = next(iterator, _END)
        if first is _END:
            return
        yield first
        yield from iterator
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


async def _afirst_step_with(var: ContextVar, value: Any, iterator: AsyncIterator) -> AsyncIterator:
    """The items of `iterator`, with `var` set to `value` (unless None) while it makes the first."""
    try:
        with _set(var, value):
            first = await anext(iterator, _END)
        if first is _END:
            return
        yield first
        async for item in iterator:
            yield item
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
