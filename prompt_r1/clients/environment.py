"""The environment: a large LLM behind any OpenAI-compatible chat endpoint, called politely and robustly.

One `EnvironmentClient.respond(prompt, history)` call:
  1. builds the messages: the environment system prompt, every earlier (prompt, response) pair as
     user/assistant messages, then the new prompt;
  2. takes an in-flight slot and a rate-window slot from the endpoint's process-wide limiter;
  3. calls `ChatOpenAI` (its own retries off, so this module is the only retry layer) under a per-call timeout;
  4. on 429, 5xx, timeouts, dropped connections and malformed bodies retries with `tenacity`: full-jitter
     exponential backoff, or exactly the server's Retry-After when it sent one, for a bounded number of attempts;
  5. returns the text with the token usage of the call and how many attempts it took.
With a response cache (`client.cache`, set by `clients.response_cache.use_cache`), a call already answered is
replayed from it before step 2 (nothing is sent), and an answer paid for is kept in it after step 5.

    client = EnvironmentClient(EnvironmentConfig(model="gpt-4o-mini"))
    reply = await client.respond("Explain the question ...", history=[])

Several endpoints behind one `respond`, with routing and fallback: `clients.environment_pool.EnvironmentPool`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from pydantic import SecretStr
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from prompt_r1.clients.http_client import checked_async_client, classify_error, copy_for_this_loop, refusal_of
from prompt_r1.clients.ratelimit import EndpointLimiter
from prompt_r1.clients.response_cache import ResponseCache, request_key, sampling_of
from prompt_r1.clients.shared_limit import SharedLimiter, limiter_for, rate_headers
from prompt_r1.core import redaction
from prompt_r1.core.aio import PerLoop
from prompt_r1.core.config import EnvironmentConfig, resolve_api_key
from prompt_r1.core.defaults import is_local_model_name, local_endpoint
from prompt_r1.core.errors import (
    ConfigError,
    EnvironmentCallError,
    EnvironmentRefused,
    RateLimited,
    is_retryable,
)
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT
from prompt_r1.core.text import repair
from prompt_r1.core.urls import is_shared_store

__all__ = [
    "Environment",
    "EnvironmentClient",
    "EnvironmentReply",
    "as_environment",
    "environment_messages",
]

OPENAI_BASE_URL = "https://api.openai.com/v1"
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvironmentReply:
    """One successful environment call."""

    text: str
    input_tokens: int
    output_tokens: int
    attempts: int  # 1 when the first try succeeded
    latency_s: float  # from the first try to the answer, retries and waits included
    model: str = ""  # the model that answered, as its endpoint knows it (for price tables and pools)
    endpoint: str = ""  # which endpoint answered: the pool member's name, else base URL
    repaired: bool = False  # the reply held text UTF-8 cannot encode (a lone surrogate), replaced by U+FFFD
    cached: bool = False  # replayed from the response cache (clients.response_cache): not sent, not paid for

    def to_dict(self) -> dict:
        # Field by field: dataclasses.asdict deep-copies recursively, a measurable share of a turn's cost.
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def environment_messages(
    prompt: str, history: Sequence[tuple[str, str]] = (), system_prompt: str = ENVIRONMENT_SYSTEM_PROMPT
) -> list[BaseMessage]:
    """The environment's context: system prompt, earlier prompt/response pairs, then the new prompt.

    >>> [m.type for m in environment_messages("p2", [("p1", "r1")])]
    ['system', 'human', 'ai', 'human']
    """
    messages: list[BaseMessage] = [SystemMessage(system_prompt)]
    for earlier_prompt, earlier_response in history:
        messages += [HumanMessage(earlier_prompt), AIMessage(earlier_response)]
    messages.append(HumanMessage(prompt))
    return messages


class _BackoffOrRetryAfter:
    """tenacity wait: the server's Retry-After when it sent one (with up to 10% jitter so that many waiting
    episodes do not return in one burst; at most `max_retry_after`), else full-jitter exponential backoff."""

    def __init__(self, initial: float, maximum: float, max_retry_after: float) -> None:
        self.initial, self.maximum, self.max_retry_after = initial, maximum, max_retry_after

    def __call__(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, EnvironmentCallError) and exc.retry_after is not None:
            return min(exc.retry_after * (1.0 + 0.1 * random.random()), self.max_retry_after)
        ceiling = min(self.maximum, self.initial * 2 ** (state.attempt_number - 1))
        return random.uniform(0.0, ceiling)


class EnvironmentClient:
    """A rate-limited, retrying client for the large LLM. Safe to share between any number of episodes.

    Pass `chat_model` to use any LangChain chat model instead of building a `ChatOpenAI` from `config`;
    it should have its own retries off. An async HTTP connection belongs to the event loop that opened it, so
    every loop that calls the environment gets its own client: the ChatOpenAI built from `config`, or a copy of
    a given OpenAI-client model (`http_client.copy_for_this_loop`; any other chat model is used as given).
    `limiter_key` overrides which endpoints share one rate limit.
    """

    def __init__(
        self,
        config: EnvironmentConfig | None = None,
        *,
        chat_model: BaseChatModel | None = None,
        api_key: str | None = None,
        limiter_key: str | None = None,
        system_prompt: str = ENVIRONMENT_SYSTEM_PROMPT,
    ) -> None:
        self.config = config = config or EnvironmentConfig()
        if chat_model is None and config.base_url is None and is_local_model_name(config.model):
            # Sent to OpenAI's API under its name, a model meant to run here would send the questions away.
            raise ConfigError(
                f"the environment model {config.model} runs on this machine: the command that runs episodes serves "
                f"it itself (run, batch, eval, serve, train); elsewhere serve it with `prompt-r1 serve-model "
                f"{config.model}` and give its URL as --env-base-url"
            )
        self.system_prompt = system_prompt
        if chat_model is not None and (
            getattr(chat_model, "disable_streaming", True) is False or getattr(chat_model, "streaming", False)
        ):
            # As for our own ChatOpenAI: one whole reply per call, also under astream_events.
            update = {"disable_streaming": True}
            if getattr(
                chat_model, "streaming", False
            ):  # ChatOpenAI(streaming=True) streams even from ainvoke
                update["streaming"] = False
            chat_model = chat_model.model_copy(update=update)
        self.chat_model = chat_model
        if chat_model is not None:
            # Its key (given as api_key=, or read from OPENAI_API_KEY when it was built) is cut from every
            # error, log line and trace like any key this project reads itself.
            redaction.register_from(chat_model)
        shared = is_shared_store(config.rate_store)
        key = None
        if chat_model is None:
            key = api_key or resolve_api_key(config.api_key_env, config.base_url)
            redaction.register(key)
            optional = {
                k: v
                for k, v in (("temperature", config.temperature), ("max_tokens", config.max_tokens))
                if v is not None
            }
            self._openai_kwargs = dict(
                model=config.model,
                base_url=config.base_url,
                api_key=SecretStr(key),
                max_retries=0,  # one retry layer: ours, which also honours Retry-After and the shared limiter
                timeout=config.timeout,
                # A shared limit follows the provider's x-ratelimit-remaining-* headers.
                include_response_headers=shared,
                **optional,
            )
        # An async HTTP connection belongs to the event loop that opened it, so each loop gets its own model.
        self._models: PerLoop[BaseChatModel] = PerLoop(self._new_model)
        endpoint = limiter_key or f"{config.base_url or OPENAI_BASE_URL}::{config.model}"
        self.limiter: EndpointLimiter | SharedLimiter = limiter_for(config, endpoint, key)
        # Masked: the name goes into every reply's `endpoint`, log lines and errors, and a URL may hold a password.
        self.name = redaction.mask_secrets(config.base_url or OPENAI_BASE_URL)
        self.base_url = self.name  # the endpoint, whatever a pool names its member
        # A cache's key: the endpoint, but for a built-in model its name, since the process serving it listens on
        # a new port each run and the same name is the same weights wherever it is served.
        self.cache_endpoint = (
            local_endpoint(config.model) if is_local_model_name(config.model) else self.base_url
        )
        self.cache: ResponseCache | None = (
            None  # replies replayed and kept (clients.response_cache.use_cache)
        )
        self.model_name = config.model
        if chat_model is not None:
            self.model_name = str(
                getattr(chat_model, "model_name", None) or getattr(chat_model, "model", None) or config.model
            )
        self.retries = 0  # retries made by this client, for logs and progress bars

    def messages(self, prompt: str, history: Sequence[tuple[str, str]] = ()) -> list[BaseMessage]:
        return environment_messages(prompt, history, self.system_prompt)

    def _new_openai_model(self) -> BaseChatModel:
        from langchain_openai import ChatOpenAI

        client = checked_async_client(self.config.timeout)
        # Under astream_events LangChain would switch ainvoke to a streamed call: one reply is one event here,
        # and a whole response is what the retries, the timeout and the token usage are counted on.
        return ChatOpenAI(**self._openai_kwargs, http_async_client=client, disable_streaming=True)

    def _new_model(self) -> BaseChatModel:
        if self.chat_model is None:
            return self._new_openai_model()
        timeout = getattr(self.chat_model, "request_timeout", None)
        return copy_for_this_loop(self.chat_model, timeout if isinstance(timeout, int | float) else None)

    def _model(self) -> BaseChatModel:
        return self._models.get()

    def _token_estimate(self, messages: list[BaseMessage]) -> int:
        """Tokens a provider's per-minute limit counts for a request before it runs: about 4 characters per
        prompt token, plus max_tokens when set."""
        if self.config.tokens_per_minute is None and self.config.token_limit is None:
            return 0
        chars = sum(len(m.content) if isinstance(m.content, str) else len(str(m.content)) for m in messages)
        return chars // 4 + 4 * len(messages) + (self.config.max_tokens or 0)

    async def _call_once(self, messages: list[BaseMessage], run_config: RunnableConfig | None) -> AIMessage:
        model = self._model()
        async with self.limiter.slot(self._token_estimate(messages)) as slot:
            try:
                try:
                    async with asyncio.timeout(self.config.timeout):
                        message = await model.ainvoke(messages, config=run_config)
                finally:
                    slot.replied_at = time.monotonic()
                usage = message.usage_metadata or {}
                if usage:
                    slot.actual = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
                slot.headers = rate_headers((message.response_metadata or {}).get("headers"))
                refused = refusal_of(message)
                if refused is not None:
                    raise EnvironmentRefused(f"environment refused the prompt: {refused}")
                return message
            except Exception as exc:
                # A server (or a proxy before it) may repeat the request's Authorization header in an error
                # body, and the message is written to results, checkpoints and logs: the keys go first.
                mapped = classify_error(exc)
                response = getattr(exc, "response", None)
                if slot.headers is None and response is not None:  # a 429's remaining/limit headers count too
                    slot.headers = rate_headers(dict(getattr(response, "headers", None) or {}))
                if isinstance(mapped, RateLimited) and isinstance(self.limiter, SharedLimiter):
                    # One cool-down for every process: the others wait too instead of each finding out alone.
                    # Capped as the retries' wait is: a daily quota's "retry in 23h" must not park every process.
                    pause = mapped.retry_after or self.config.backoff_initial
                    await self.limiter.cool_down(min(pause, self.config.max_retry_after))
                if mapped is exc:
                    raise
                raise mapped from exc

    async def respond(
        self,
        prompt: str,
        history: Sequence[tuple[str, str]] = (),
        *,
        run_config: RunnableConfig | None = None,
        system_prompt: str | None = None,
    ) -> EnvironmentReply:
        """Answer `prompt` in the context of the earlier (prompt, response) pairs; `system_prompt` replaces the
        client's own for this call (the release protocol's differs by a trailing space).

        Raises `EnvironmentCallError` (after the retries) or `ContextOverflow`.
        """
        messages = environment_messages(prompt, history, system_prompt or self.system_prompt)
        started = time.monotonic()
        cache, key = self.cache, None
        if cache is not None:
            key = request_key(self.cache_endpoint, self.model_name, messages, sampling_of(self))
            found = cache.get(key)
            if found is not None:
                found.update(cached=True, attempts=1, latency_s=time.monotonic() - started)
                return EnvironmentReply(**found)
        run_config = {**(run_config or {}), "run_name": "environment"}
        run_config["tags"] = [*run_config.get("tags", []), "prompt-r1", "environment"]
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.config.max_retries + 1),
            wait=_BackoffOrRetryAfter(
                self.config.backoff_initial, self.config.backoff_max, self.config.max_retry_after
            ),
            retry=retry_if_exception(is_retryable),
            before_sleep=self._count_retry,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    message = await self._call_once(messages, run_config)
        except EnvironmentCallError as exc:
            exc.attempts = attempts
            raise
        usage = message.usage_metadata or {}
        # str(): LangChain's `text` is a str subclass (a text accessor); the reply keeps plain text.
        text, repaired = repair(str(message.text) if isinstance(message.text, str) else str(message.content))
        # A reply that repeats a key (an endpoint echoing its request) must not carry it into the state, the
        # checkpoint, or the agent's next prompt.
        text = redaction.redact(text)
        reply = EnvironmentReply(
            text=text,
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            attempts=attempts,
            latency_s=time.monotonic() - started,
            model=self.model_name,
            endpoint=self.name,
            repaired=repaired,
        )
        if cache is not None and key is not None:
            cache.put(key, reply.to_dict())
        return reply

    def _count_retry(self, state: RetryCallState) -> None:
        self.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        logger.info(
            "environment %s: attempt %d failed (%s: %s); retrying in %.2f s",
            self.name,
            state.attempt_number,
            type(exc).__name__,
            exc,
            wait,
        )


@runtime_checkable
class Environment(Protocol):
    """What the loop needs of an environment: one call given the earlier (prompt, response) pairs, returning the
    reply with its usage and the attempts it took; `retries` counts the retries made so far. The loop passes
    `system_prompt` only under the release protocol, so an environment without the keyword serves the paper's."""

    retries: int

    async def respond(
        self, prompt: str, history: Sequence[tuple[str, str]] = (), *, run_config: Any = None
    ) -> EnvironmentReply: ...


def as_environment(environment: Any) -> Environment:
    """The environment as the loop calls it: a LangChain chat model is wrapped in an `EnvironmentClient` (its own
    rate-limit key); a client, a pool or anything else with `respond` is returned as it is."""
    if isinstance(environment, BaseChatModel):
        return EnvironmentClient(chat_model=environment, limiter_key=f"chat-model-{id(environment)}")
    if not callable(getattr(environment, "respond", None)):
        raise TypeError(
            f"an environment needs an async `respond(prompt, history)`; got {type(environment).__name__} "
            "(pass an EnvironmentClient, an EnvironmentPool or a LangChain chat model)"
        )
    return environment
