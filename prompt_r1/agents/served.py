"""A served agent behind an OpenAI-compatible endpoint, e.g. `vllm serve ./merged-checkpoint`.

On a vLLM server with a tokenizer at hand (`--agent-tokenizer`, the model name when it is a local folder, or, with
`--agent-token-exact on`, the folder or hub id the server loaded the model from), each
turn goes as the token ids of the running trajectory through the completions API and the sampled ids come back
with their log-probabilities: the agent reads exactly what it read in training, and the episode records its
trajectory (`token_exact`, see agents/vllm_server.py). Anywhere else (hosted fine-tunes) turns go as chat messages.

The server applies the stop sequences, so one generation ends at `</interaction_prompt>` or `</answer>`;
OpenAI-compatible chat servers drop the matched stop string from the text, and it is put back here so the turn
parses the same way whatever served it.
"""

from __future__ import annotations

import asyncio
import random

import openai

from prompt_r1.agents.base import AgentOutput, AgentRequest
from prompt_r1.clients.http_client import MalformedResponse, ResponseRefused, checked_async_client
from prompt_r1.core import redaction
from prompt_r1.core.aio import PerLoop
from prompt_r1.core.config import AgentConfig, resolve_api_key
from prompt_r1.core.errors import AgentError, AgentRefused, ContextOverflow
from prompt_r1.core.protocol import repair_stopped_text

__all__ = ["MALFORMED_RETRIES", "ServedAgent"]

MALFORMED_RETRIES = 3  # as many as the SDK's own retries of 429s and 5xx (max_retries below)


class ServedAgent:
    """`tokenizer` is set when turns go as token ids (the graph then keeps a token-exact trajectory); `token_exact`
    says how turns go and why; `drift_tokenizer` (any tokenizer found) serves the drift check."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        api_key: str | None = None,
        max_in_flight: int = 64,
        timeout: float = 300.0,
    ):
        if not config.base_url:
            raise AgentError("a served agent needs a base URL (--agent-base-url)")
        self.config = config
        self._api_key = api_key or resolve_api_key(config.api_key_env, config.base_url, what="agent")
        redaction.register(self._api_key)
        self._timeout = timeout
        self._in_flight = max_in_flight
        from prompt_r1.agents.vllm_server import plan_token_exact

        plan = plan_token_exact(config, self._api_key)
        self.tokenizer, self.token_exact, self.drift_tokenizer = (
            plan.tokenizer,
            plan.reason,
            plan.drift_tokenizer,
        )
        # Async HTTP connections and semaphores belong to one event loop: one client and cap per loop.
        self._clients: PerLoop[tuple[openai.AsyncOpenAI, asyncio.Semaphore]] = PerLoop(self._new_client)

    def _new_client(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        client = openai.AsyncOpenAI(
            base_url=self.config.base_url,
            api_key=self._api_key,
            max_retries=3,
            timeout=self._timeout,
            http_client=checked_async_client(self._timeout),
        )
        return client, asyncio.Semaphore(self._in_flight)

    async def generate(self, request: AgentRequest) -> AgentOutput:
        try:
            return await self._generate(request)
        except (AgentError, ContextOverflow) as exc:
            # The server's error text may repeat the Authorization header it was sent.
            raise redaction.redact_exception(exc) from None

    async def _generate(self, request: AgentRequest) -> AgentOutput:
        if self.tokenizer is not None and request.prompt_ids is not None:
            return await self._generate_tokens(request)
        cfg = self.config
        kwargs = dict(
            model=cfg.model,
            messages=request.messages,
            stop=list(request.stop),
            max_tokens=request.max_new_tokens or cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
        )
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        client, in_flight = self._clients.get()
        async with in_flight:
            response = await self._create(client.chat.completions.create, kwargs)
        if not response.choices:
            raise AgentError("served agent returned no choices")
        choice = response.choices[0]
        # A served model could only have a key in its text if something put one there; it goes before the state.
        text = redaction.redact(choice.message.content or "")
        finish = "length" if choice.finish_reason == "length" else "stop"
        if finish == "stop" and request.stop:  # no stop strings sent (--protocol release): nothing was cut
            # vLLM reports the matched stop string as `stop_reason` (None: EOS); other servers report nothing.
            extra = choice.model_extra or {}
            text = (
                repair_stopped_text(text, extra["stop_reason"])
                if "stop_reason" in extra
                else repair_stopped_text(text)
            )
        usage = response.usage
        return AgentOutput(
            text=text,
            finish_reason=finish,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )

    async def _generate_tokens(self, request: AgentRequest) -> AgentOutput:
        """One turn from token ids: vLLM's completions API with the running trajectory as the prompt."""
        cfg = self.config
        kwargs = dict(
            model=cfg.model,
            prompt=list(request.prompt_ids),
            stop=list(request.stop),
            max_tokens=request.max_new_tokens or cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            logprobs=0,
            # vLLM's extensions: the sampled ids, the stop string kept in them (it was sampled), nothing skipped.
            extra_body={
                "return_token_ids": True,
                "include_stop_str_in_output": True,
                "skip_special_tokens": False,
            },
        )
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        client, in_flight = self._clients.get()
        async with in_flight:
            response = await self._create(client.completions.create, kwargs)
        if not response.choices:
            raise AgentError("served agent returned no choices")
        choice = response.choices[0]
        ids = (choice.model_extra or {}).get("token_ids")
        if not isinstance(ids, list):
            raise AgentError(
                "the served agent returned no token ids (vLLM's return_token_ids); upgrade the server, or run with "
                "--agent-token-exact off"
            )
        vocabulary = len(self.tokenizer)
        budget = kwargs["max_tokens"]
        if len(ids) > budget or not all(isinstance(i, int) and 0 <= i < vocabulary for i in ids):
            raise AgentError(
                f"the served agent returned {len(ids)} token ids for a budget of {budget}, or ids outside the "
                f"tokenizer's {vocabulary}: is --agent-tokenizer the served model's?"
            )
        # The sampled tokens' log-probabilities (logprobs=0 asks for them, and vLLM sends them): a trajectory
        # keeps them, and an async trainer's importance ratio divides by them, so a missing one is an error,
        # never a placeholder (0.0 would read as "certain").
        token_logprobs = choice.logprobs.token_logprobs if choice.logprobs is not None else None
        if ids and (
            not isinstance(token_logprobs, list)
            or len(token_logprobs) != len(ids)
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in token_logprobs)
        ):
            if not token_logprobs:
                got = "no"
            elif len(token_logprobs) != len(ids):
                got = str(len(token_logprobs))
            else:
                got = f"{len(token_logprobs)} (some missing or not numbers)"
            raise AgentError(
                f"the served agent returned {len(ids)} token ids but {got} log-probabilities for them: a "
                "token-exact agent needs vLLM's completions API with logprobs; run with --agent-token-exact off "
                "otherwise"
            )
        logprobs = [float(x) for x in token_logprobs or []]
        usage = response.usage
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if (
            redaction.redact(text) != text
        ):  # the ids spell a key: they must not reach the state or a checkpoint
            raise AgentError("the served agent's reply repeated an API key; it was not kept")
        return AgentOutput(
            text=text,
            token_ids=list(ids),
            logprobs=logprobs,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            prompt_tokens=usage.prompt_tokens if usage else len(request.prompt_ids),
            completion_tokens=usage.completion_tokens if usage else len(ids),
        )

    async def _create(self, call, kwargs: dict):
        """One completion (`call`: the chat or the completions endpoint). The SDK retries 429, 5xx and dropped
        connections itself (max_retries); a 200 whose body is not a completion (prompt_r1.clients.http_client) is retried
        here the same number of times, with backoff."""
        cfg = self.config
        for attempt in range(MALFORMED_RETRIES + 1):
            try:
                return await call(**kwargs)
            except MalformedResponse as exc:
                if attempt == MALFORMED_RETRIES:
                    raise AgentError(f"served agent failed: {exc}") from exc
                await asyncio.sleep(random.uniform(0.0, 0.5 * 2**attempt))
            except ResponseRefused as exc:
                raise AgentRefused(f"the served agent refused: {exc}") from exc
            except openai.BadRequestError as exc:
                if "context" in str(exc).lower() and (
                    "length" in str(exc).lower() or "maximum" in str(exc).lower()
                ):
                    raise ContextOverflow(f"agent context overflow: {exc.message}") from exc
                raise AgentError(f"served agent rejected the request: {exc.message}") from exc
            except openai.APIConnectionError as exc:
                raise AgentError(f"cannot reach the served agent at {cfg.base_url}: {exc}") from exc
            except openai.APIError as exc:
                raise AgentError(f"served agent failed: {exc}") from exc
            except openai.OpenAIError as exc:
                raise AgentError(f"served agent failed: {exc}") from exc
        raise AssertionError("unreachable")
