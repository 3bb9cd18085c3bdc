"""One episode contract for every surface: what an environment must offer, what an episode returns, and how it
runs, alone or many at a time.

    runner = EpisodeRunner(agent, environment, LoopConfig(max_turns=5))
    episode = await runner.run("Who wrote Hamlet?", id="q1")
    episode.status, episode.answer, episode.failed, episode.to_row()

- `Environment`: what the loop needs of an environment (a call with the history, the retries it made). The
  client (`EnvironmentClient`), the pool (`EnvironmentPool`) and any LangChain chat model (wrapped by
  `as_environment`) are one.
- `Episode`: the frozen result of one episode: id, question, status, answer, error, turns, usage, cost,
  trajectory (the token-exact agent's ids), latency. `failed` is true for the statuses a rerun retries
  (`FAILED_STATUSES`), the same set for every surface.
- `EpisodeRunner.run`: one episode through the graph, with the trace name, tags and metadata every surface
  shares, resumed from a LangGraph checkpoint when one is given; whatever one episode raises becomes that
  episode's failure (`agent_error`, `internal_error`), never the caller's exception.
- `EpisodeRunner.run_many`: many items through a worker pool into a `ResultStore` (prompt_r1.runs.pool): what is a
  surface's own (batch's pricing and budget, eval's methods and scoring) comes in as the `work` callable and a
  stop rule.

Nothing here imports a surface (batch, eval, serve, the chat model, training); they import this.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prompt_r1.agents.base import AgentBackend
from prompt_r1.clients.environment import Environment, as_environment
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentError
from prompt_r1.core.text import valid
from prompt_r1.loop.graph import trajectory_of
from prompt_r1.runs.output_files import FAILED_STATUSES

__all__ = [
    "EPISODE_RUN_NAME",
    "FAILED_STATUSES",
    "Environment",
    "Episode",
    "EpisodeRunner",
    "as_environment",
    "describe_exception",
    "question_from_messages",
]

EPISODE_RUN_NAME = "prompt_r1_episode"  # the trace name of one episode, on every surface
STREAM_MODES = ["custom", "values"]  # the graph's per-turn events, and its states for the final one


def question_from_messages(messages: Sequence[Any]) -> str:
    """The question of a chat: the text of the last user message, an OpenAI-style dict (`role: user`) or a
    LangChain message (`type: human`), its content a string or text parts. Any other part (an image, audio, a
    file) is refused with a `ValueError`, as is an empty or invalid text: dropping a part would answer a
    different question than the one asked.

    >>> question_from_messages([{"role": "user", "content": "Who wrote Hamlet?"}])
    'Who wrote Hamlet?'
    """
    for message in reversed(messages):
        if isinstance(message, dict):
            is_user, content = message.get("role") == "user", message.get("content")
        else:
            is_user, content = getattr(message, "type", None) == "human", getattr(message, "content", None)
        if not is_user:
            continue
        if isinstance(content, list):
            texts = []
            for part in content:
                if isinstance(part, str):
                    texts.append(part)
                elif (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    texts.append(part["text"])
                else:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ValueError(
                        f"Prompt-R1 answers text only: the last user message has a content part of type {kind!r}; "
                        'send its text as a string or text parts ({"type": "text", "text": ...})'
                    )
            content = "\n".join(texts)
        if not isinstance(content, str):
            raise ValueError("a user message's content must be a string or text parts")
        if not content.strip():
            raise ValueError("the last user message has no text for Prompt-R1 to answer")
        if not valid(content):
            raise ValueError(
                "the last user message is not valid Unicode text (it holds a lone surrogate such as \\ud800)"
            )
        return content
    raise ValueError("Prompt-R1 needs a user message to answer; got none")


def describe_exception(exc: BaseException) -> str:
    """`Type: message (at file:line)`, the line being where it was raised, for a bug report."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
    return text


@dataclass(frozen=True)
class Episode:
    """What one episode came to. `turns` and `usage` are the graph's records (prompt_r1.loop.graph); `trajectory` the
    token-exact agent's ids (None for a text-only agent); `cost_usd` None when unpriced or not asked for;
    `resumed` how a checkpointed episode continued ("interrupted", "failed_call", "finished"), else None."""

    id: str | None
    question: str
    status: str
    answer: str | None = None
    error: str | None = None
    turns: list[dict] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    golden_answers: list[str] | None = None
    trajectory: dict | None = None
    cost_usd: float | None = None
    latency_s: float = 0.0
    resumed: str | None = None
    # What a failed episode raised, for a caller that must not lose its traceback (a training step); never in a row.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def failed(self) -> bool:
        """A failure of the infrastructure or of this code, not an outcome: a rerun retries it."""
        return self.status in FAILED_STATUSES

    @property
    def token_totals(self) -> tuple[int, int]:
        """(tokens read, tokens written) by both models together: the agent's prompt and completion tokens plus
        the environment's input and output tokens. What an OpenAI-style usage block reports."""
        usage = self.usage
        read = usage.get("agent_prompt_tokens", 0) + usage.get("env_input_tokens", 0)
        written = usage.get("agent_completion_tokens", 0) + usage.get("env_output_tokens", 0)
        return read, written

    @classmethod
    def from_state(cls, state: dict[str, Any], *, id: str | None = None, **fields: Any) -> Episode:
        """The episode a finished graph state describes; `fields` sets the rest (cost_usd, latency_s, ...)."""
        return cls(
            id=id,
            question=state.get("question", ""),
            status=state.get("status") or "internal_error",
            answer=state.get("answer"),
            error=state.get("error"),
            turns=list(state.get("turns") or []),
            usage=dict(state.get("usage") or {}),
            golden_answers=state.get("golden_answers") or None,
            trajectory=trajectory_of(state),
            **fields,
        )

    @classmethod
    def failure(cls, status: str, error: str, **fields: Any) -> Episode:
        return cls(status=status, error=error, **fields)

    def to_row(self) -> dict[str, Any]:
        """The episode as a results row: id first (how a results file's rows begin), optional keys only when
        set."""
        row: dict[str, Any] = {"id": self.id, "question": self.question}
        if self.golden_answers:
            row["golden_answers"] = self.golden_answers
        row.update(
            answer=self.answer, status=self.status, error=self.error, turns=self.turns, usage=self.usage
        )
        if self.trajectory is not None:
            row["trajectory"] = self.trajectory
        if self.resumed:
            row["resumed"] = self.resumed
        row["cost_usd"] = self.cost_usd
        row["latency_s"] = round(self.latency_s, 3)
        return row


class EpisodeRunner:
    """Runs episodes of one agent against one environment under one `LoopConfig`, every surface's way.

    `checkpointer`: LangGraph's (one thread per episode id); an episode whose id has a thread continues it: after
    its last completed step when interrupted, from the environment call that failed when it failed, and as it
    stands when it finished but was never recorded. `price`: an episode's cost from its final state (None when
    unpriced). `tags` and `metadata` go on every episode's trace beside the shared ones."""

    def __init__(
        self,
        agent: AgentBackend,
        environment: Any,
        loop: LoopConfig | None = None,
        *,
        checkpointer: Any = None,
        price: Callable[[dict[str, Any]], float | None] | None = None,
        tags: Iterable[str] = (),
        graph: Any = None,
    ) -> None:
        from prompt_r1.loop.graph import build_graph

        self.agent, self.environment = agent, as_environment(environment)
        self.loop = loop or LoopConfig()
        self.checkpointer, self.price = checkpointer, price
        self.tags = ["prompt-r1", *tags]
        self.graph = graph or build_graph(
            self.agent, self.environment, loop=self.loop, checkpointer=checkpointer
        )

    def run_config(
        self, id: str | None, metadata: dict[str, Any] | None = None, tags: Iterable[str] = ()
    ) -> dict[str, Any]:
        """The LangChain run config of one episode: its trace name, tags, metadata and checkpoint thread."""
        config: dict[str, Any] = {
            "run_name": EPISODE_RUN_NAME,
            "tags": [*self.tags, *tags],
            # Without an id, a caller's own `episode_id` (inherited through its config) stands.
            "metadata": {**({"episode_id": id} if id is not None else {}), **(metadata or {})},
        }
        if self.checkpointer is not None:
            config["configurable"] = {"thread_id": id}
        return config

    def _inputs(self, question: str, golden_answers: Sequence[str] | None) -> dict[str, Any]:
        inputs: dict[str, Any] = {"question": question}
        if golden_answers:
            inputs["golden_answers"] = list(golden_answers)
        return inputs

    async def stream(
        self,
        question: str,
        *,
        id: str | None = None,
        golden_answers: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
        tags: Iterable[str] = (),
    ) -> AsyncIterator[dict[str, Any] | Episode]:
        """The episode as it happens: each event it emits (prompt_r1.core.events: think, prompt, response, answer,
        end) as a dict, then the `Episode` last. Unlike `run`, what the episode raises reaches the caller (a
        server maps it to an HTTP error, a chat model raises it)."""
        started = time.monotonic()
        state: dict[str, Any] = {}
        config = self.run_config(id, metadata, tags)
        async for mode, data in self.graph.astream(
            self._inputs(question, golden_answers), config, stream_mode=STREAM_MODES
        ):
            if mode == "values":
                state = data
            else:
                yield data
        yield self._finished(state, id, started)

    def stream_sync(
        self,
        question: str,
        *,
        id: str | None = None,
        metadata: dict[str, Any] | None = None,
        tags: Iterable[str] = (),
    ) -> Iterator[dict[str, Any] | Episode]:
        """`stream` for synchronous callers (a chat model's `invoke` and `stream`), on the graph's sync path."""
        started = time.monotonic()
        state: dict[str, Any] = {}
        config = self.run_config(id, metadata, tags)
        for mode, data in self.graph.stream(self._inputs(question, None), config, stream_mode=STREAM_MODES):
            if mode == "values":
                state = data
            else:
                yield data
        yield self._finished(state, id, started)

    def _finished(
        self, state: dict[str, Any], id: str | None, started: float, resumed: str | None = None
    ) -> Episode:
        """The Episode of a finished graph state, priced, timed from `started`."""
        cost = self.price(state) if self.price is not None and state else None
        return Episode.from_state(
            state, id=id, cost_usd=cost, latency_s=time.monotonic() - started, resumed=resumed
        )

    async def run(
        self,
        question: str,
        *,
        id: str | None = None,
        golden_answers: Sequence[str] | None = None,
        metadata: dict[str, Any] | None = None,
        on_event: Callable[[dict[str, Any]], Any] | None = None,
    ) -> Episode:
        """One episode. Never raises for what the episode meets: an agent's failure is `agent_error`, anything
        unexpected `internal_error` (with where it was raised), each recorded in the episode. `on_event` is
        called with each event as it happens (see `stream`; not with a checkpointer, whose resumed episodes
        replay none)."""
        if self.checkpointer is not None and id is None:
            raise ValueError("a checkpointed episode needs an id (its checkpoint thread)")
        if self.checkpointer is not None and on_event is not None:
            # A resumed episode replays no events: a caller would see only part of it.
            raise ValueError("on_event needs a runner without a checkpointer")
        started = time.monotonic()
        golden = list(golden_answers) if golden_answers else None
        common = dict(id=id, question=question, golden_answers=golden)
        try:
            if on_event is not None:
                async for item in self.stream(question, id=id, golden_answers=golden, metadata=metadata):
                    if isinstance(item, Episode):
                        return item
                    on_event(item)
            state, resumed = await self._invoke(question, golden, self.run_config(id, metadata))
            # Pricing runs a surface's code on the state: inside the guard, so its failure is this episode's.
            return self._finished(state, id, started, resumed)
        except AgentError as exc:
            return Episode.failure(
                "agent_error",
                f"{type(exc).__name__}: {exc}",
                latency_s=time.monotonic() - started,
                exception=exc,
                **common,
            )
        except Exception as exc:
            # Whatever else one episode raises (a bug, a library's unexpected error) is that episode's failure:
            # recorded and retried by the next run; the other episodes go on.
            return Episode.failure(
                "internal_error",
                describe_exception(exc),
                latency_s=time.monotonic() - started,
                exception=exc,
                **common,
            )

    async def _invoke(
        self, question: str, golden: list[str] | None, config: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        inputs = self._inputs(question, golden)
        if self.checkpointer is None:
            return await self.graph.ainvoke(inputs, config), None
        snapshot = await self.graph.aget_state(config)
        values = snapshot.values or {}
        if values and values.get("question") == question:
            if snapshot.next:  # interrupted mid-episode: continue after its last completed step
                return await self.graph.ainvoke(None, config, durability="sync"), "interrupted"
            if values.get("status") not in FAILED_STATUSES:  # finished, but its row was never written
                return values, "finished"
            async for earlier in self.graph.aget_state_history(config):
                if earlier.next == ("environment",):  # just before the call that failed
                    return await self.graph.ainvoke(None, earlier.config, durability="sync"), "failed_call"
        if values:  # another question under this id: start over
            await self.checkpointer.adelete_thread(config["configurable"]["thread_id"])
        return await self.graph.ainvoke(inputs, config, durability="sync"), None

    async def forget(self, id: str) -> None:
        """Drop a finished episode's checkpoint thread (nothing to do without a checkpointer)."""
        if self.checkpointer is not None:
            await self.checkpointer.adelete_thread(id)

    async def run_many(
        self, items: Iterable[Any], store: Any, *, work: Callable | None = None, **options: Any
    ):
        """Many items through `prompt_r1.runs.pool.run_many` into `store`; `work` defaults to running each item's
        episode (`item.question`, `item.id`, `item.golden_answers`) and writing `Episode.to_row()`."""
        from prompt_r1.runs.pool import run_many

        async def episode_row(item: Any) -> dict[str, Any]:
            episode = await self.run(
                item.question, id=item.id, golden_answers=getattr(item, "golden_answers", None)
            )
            return episode.to_row()

        return await run_many(items, work or episode_row, store, **options)
