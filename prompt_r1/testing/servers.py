"""Offline stand-ins for the outside world: a scripted OpenAI-compatible HTTP server and a tiny local model.

`ScriptedServer` is a real HTTP server on 127.0.0.1 (aiohttp, in a background thread) that answers
`/v1/chat/completions` and `/v1/models` from Python functions, one per model name, so one server can play both
the environment and a served agent (the responders, and in-process doubles that use the same ones, are in
prompt_r1.testing.scripted). It records every request, applies `stop` like a real server, and injects
faults (429 with Retry-After, 500, slow replies past the client's timeout, dropped connections, malformed bodies)
for testing the retry layer: queued one by one (`inject`), or drawn at random per request at given rates
(`fault_rates`, seeded). `server_rate_limit=(n, period)` makes it answer 429 with Retry-After to any request
beyond n accepted in the last `period` seconds, as a provider does. Tiny local models are built by
`prompt_r1.testing.tiny_models`. Needs the `dev` extra (aiohttp).

    with ScriptedServer({"env": echo_environment(), "agent": scripted_agent([...])}) as server:
        EnvironmentConfig(model="env", base_url=server.base_url)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAULT_KINDS",
    "Fault",
    "RecordedRequest",
    "ScriptedServer",
    "echo_environment",
    "max_in_window",
    "relay_agent",
    "scripted_turns",
    "scripted_agent",
]

from prompt_r1.testing.hostile_replies import HOSTILE_KINDS, hostile_reply
from prompt_r1.testing.scripted import (  # the responders, re-exported: a server and the in-process doubles share them
    Responder,
    echo_environment,
    max_in_window,
    relay_agent,
    scripted_agent,
    scripted_turns,
)

FAULT_KINDS = (
    frozenset({"429", "408", "409", "500", "502", "503", "timeout", "drop", "malformed", "context", "400"})
    | HOSTILE_KINDS
)


@dataclass(frozen=True)
class Fault:
    """One injected failure.

    kind: "429", "408", "409", "500", "502", "503" (each with a Retry-After header when `retry_after` is given),
    "timeout" (the reply comes after `delay` s), "drop" (connection closed without a reply), "malformed" (a body
    that is not JSON), "context" (a 400 saying the context length was exceeded), "400" (a plain bad request).
    Hostile servers, each a 200 unless named by its status: "echo-400" / "echo-401" / "echo-403" / "echo-500" (an
    error whose body and headers repeat the request's Authorization header), "html" (an HTML page), "bad-utf8" (a
    completion whose bytes are not UTF-8), "error-200" (`{"error": ...}` saying the server is overloaded),
    "empty-choices" (`choices: []`), "content-filter" (finish_reason content_filter), "refusal" (a `refusal`
    instead of content), "filter-400" (Azure's 400 with code content_filter), "surrogate" (a reply holding half a
    surrogate pair, `\\ud800`), "huge" (a reply of about 1 MB), "forge" (a reply that closes the response block
    and forges an answer).
    """

    kind: str
    retry_after: float | None = None
    delay: float = 5.0


@dataclass
class RecordedRequest:
    received_at: float  # time.monotonic() on arrival
    model: str
    body: dict
    fault: str | None = None
    headers: dict = field(default_factory=dict)
    completed_at: float | None = None  # time.monotonic() when a normal reply was sent


@dataclass
class _Route:
    responder: Responder
    latency: float | Callable[[], float] = 0.0


class ScriptedServer:
    """A real OpenAI-compatible server on 127.0.0.1 backed by Python functions. Use as a context manager."""

    def __init__(
        self,
        responders: dict[str, Responder] | Responder,
        *,
        latency: float | Callable[[], float] | dict[str, float | Callable[[], float]] = 0.0,
        port: int = 0,
        fault_rates: dict[str, float] | None = None,
        fault_models: Sequence[str] | None = None,
        fault_retry_after: float | None = 0.05,
        fault_delay: float = 5.0,
        seed: int = 0,
        server_rate_limit: tuple[int, float] | None = None,
        rate_limited_models: Sequence[str] | None = None,
        record: bool = True,
        fault_rule: Callable[[str, dict], Fault | None] | None = None,
        tokenizer: Any = None,
        vllm_version: str | None = None,
        model_roots: dict[str, str] | None = None,
        token_ids: Callable[[list[int]], list[int] | None] | None = None,
        token_logprobs: bool = True,
        provider_limit: Any = None,
    ) -> None:
        """latency: seconds per reply, or a function giving them (of no argument, or of the request body), for
            every model or per model (a dict).
        fault_rates: kind → probability per request (kinds as in `Fault`), for `fault_models` (default: all).
        server_rate_limit: (requests, period s) accepted per window for `rate_limited_models` (default: all).
        record: keep every request in `requests` (turn off for very long benchmark runs).
        fault_rule: (model, body) → a Fault or None, asked first for every request; may be replaced later.
        tokenizer, vllm_version: play a vLLM server: `/version` answers `vllm_version`, and `/v1/completions` takes
            token-id prompts and returns the responder's text with its ids (`return_token_ids`), the stop string
            kept (`include_stop_str_in_output`).
        provider_limit: a `prompt_r1.testing.rate_limit_simulator.ProviderLimit`: requests and tokens per period per API key,
            as a provider counts them, with its 429s and x-ratelimit-* headers (for `rate_limited_models`).
        model_roots: model name → the `root` its `/v1/models` entry gives (where vLLM loaded it from).
        token_ids: rewrites the ids a completions reply returns (None: the reply has no `token_ids`, as a server
            without `return_token_ids`), to play a server that misbehaves on the token-id path.
        token_logprobs: False plays a server whose completions replies carry no `logprobs`, whatever was asked."""
        import random

        if callable(responders):
            responders = {"*": responders}
        latencies = latency if isinstance(latency, dict) else dict.fromkeys(responders, latency)
        self.routes = {model: _Route(fn, latencies.get(model, 0.0)) for model, fn in responders.items()}
        self.fault_rates = dict(fault_rates or {})
        if sum(self.fault_rates.values()) > 1:
            raise ValueError(f"fault rates add up to more than 1: {self.fault_rates}")
        self.fault_models = set(fault_models) if fault_models is not None else None
        self.fault_retry_after, self.fault_delay = fault_retry_after, fault_delay
        self._random = random.Random(seed)
        self.server_rate_limit = server_rate_limit
        self.rate_limited_models = set(rate_limited_models) if rate_limited_models is not None else None
        self._accepted: deque[float] = deque()
        self.rejected_by_rate_limit = 0
        self.record = record
        self.counts: dict[str, int] = {}  # requests per model, kept even when record=False
        self.fault_rule = fault_rule
        self.tokenizer, self.vllm_version = tokenizer, vllm_version
        self.version_headers: list[dict] = []  # the headers of each /version request
        self.model_roots = dict(model_roots or {})
        self.token_ids, self.token_logprobs = token_ids, token_logprobs
        self.provider_limit = provider_limit
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0  # most requests the server was handling at once
        self._faults: dict[str | None, deque[Fault]] = {}
        self._fault_lock = threading.Lock()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, *faults: Fault, model: str | None = None) -> None:
        """Queue faults; each of the next requests (for `model`, or for any model) takes one, in order."""
        with self._fault_lock:
            self._faults.setdefault(model, deque()).extend(faults)

    def _next_fault(self, model: str, body: dict | None = None) -> Fault | None:
        if self.fault_rule is not None:
            fault = self.fault_rule(model, body or {})
            if fault is not None:
                return fault
        with self._fault_lock:
            for key in (model, None):
                queue = self._faults.get(key)
                if queue:
                    return queue.popleft()
        if self.fault_rates and (self.fault_models is None or model in self.fault_models):
            draw = self._random.random()
            for kind, rate in self.fault_rates.items():
                if draw < rate:
                    return Fault(kind, retry_after=self.fault_retry_after, delay=self.fault_delay)
                draw -= rate
        return None

    def _over_rate_limit(self, model: str, now: float) -> float | None:
        """Seconds until a slot frees when this request is beyond the server's limit, else None (and counted)."""
        if self.server_rate_limit is None:
            return None
        if self.rate_limited_models is not None and model not in self.rate_limited_models:
            return None
        limit, period = self.server_rate_limit
        while self._accepted and now - self._accepted[0] >= period:
            self._accepted.popleft()
        if len(self._accepted) >= limit:
            return self._accepted[0] + period - now
        self._accepted.append(now)
        return None

    def requests_for(self, model: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.model == model]

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> ScriptedServer:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
            except BaseException as exc:  # surfaced to start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-openai-server", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application(
            client_max_size=64 << 20
        )  # conversations with huge replies, as real servers take
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        if self.vllm_version is not None:
            app.router.add_get("/version", self._version)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    # ---- handlers --------------------------------------------------------------------------------------------
    async def _models(self, request):
        from aiohttp import web

        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        **({"root": self.model_roots[m]} if m in self.model_roots else {}),
                    }
                    for m in self.routes
                    if m != "*"
                ],
            }
        )

    async def _version(self, request):
        from aiohttp import web

        self.version_headers.append(dict(request.headers))
        return web.json_response({"version": self.vllm_version})

    async def _chat(self, request):
        from aiohttp import web

        arrived = time.monotonic()
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response(
                {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}, status=400
            )
        model = body.get("model", "")
        route = self.routes.get(model) or self.routes.get("*")
        self.counts[model] = self.counts.get(model, 0) + 1
        limited = self.rate_limited_models is None or model in self.rate_limited_models
        if self.provider_limit is not None and limited and route is not None:
            return await self._as_provider(request, body, model, route, arrived)
        wait = self._over_rate_limit(model, arrived)
        fault = (
            Fault("429", retry_after=round(wait, 3)) if wait is not None else self._next_fault(model, body)
        )
        if wait is not None:
            self.rejected_by_rate_limit += 1
        recorded = RecordedRequest(arrived, model, body, fault.kind if fault else None, dict(request.headers))
        if self.record:
            self.requests.append(recorded)
        if route is None:
            return web.json_response(
                {"error": {"message": f"model {model!r} not found", "type": "not_found"}}, status=404
            )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            response = await self._reply(request, body, model, route, fault)
            if fault is None:
                recorded.completed_at = time.monotonic()
            return response
        finally:
            self.in_flight -= 1

    async def _as_provider(self, request, body: dict, model: str, route: _Route, arrived: float):
        """A request under `provider_limit`: admitted or answered 429 with the provider's headers; a reply's
        completion tokens counted as it is sent, with the headers that say what is left."""
        from aiohttp import web

        key = request.headers.get("Authorization", "")
        count = self.provider_limit.count_tokens
        prompt_tokens = sum(count(str(m.get("content", ""))) for m in body.get("messages") or [])
        verdict = self.provider_limit.arrive(key, prompt_tokens, arrived)
        if not verdict.accepted:
            self.rejected_by_rate_limit += 1
            error = {"message": "rate limit reached for requests or tokens", "type": "rate_limit"}
            return web.json_response({"error": error}, status=429, headers=verdict.headers)
        if self.record:
            self.requests.append(RecordedRequest(arrived, model, body, None, dict(request.headers)))
        response = await self._reply(request, body, model, route, None)
        reply = json.loads(response.body)
        # The usage reported is what the provider counted, by its own token count.
        completion = sum(count(c["message"]["content"] or "") for c in reply.get("choices", []))
        reply["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        headers = self.provider_limit.complete(key, completion, time.monotonic())
        return web.json_response(reply, headers=headers)

    async def _reply(self, request, body: dict, model: str, route: _Route, fault: Fault | None):
        from aiohttp import web

        tokens = request.path.endswith("/v1/completions")
        if fault is not None and fault.kind == "huge" and tokens:
            return web.json_response(self._token_completion(model, "x" * (1 << 20), body))
        if fault is not None and fault.kind in HOSTILE_KINDS:
            return hostile_reply(fault.kind, request, body, model)
        if fault is not None:
            if fault.kind in {"429", "408", "409", "500", "502", "503"}:
                headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
                error = {
                    "message": f"injected {fault.kind}",
                    "type": "rate_limit" if fault.kind == "429" else "server_error",
                }
                return web.json_response({"error": error}, status=int(fault.kind), headers=headers)
            if fault.kind == "timeout":
                await asyncio.sleep(fault.delay)
            if fault.kind == "drop":
                request.transport.close()
                raise asyncio.CancelledError  # aiohttp drops the connection without a response
            if fault.kind == "malformed":
                return web.Response(text="{not json", content_type="application/json")
            if fault.kind == "context":
                message = "This model's maximum context length is 128 tokens. (context_length_exceeded)"
                error = {
                    "message": message,
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
                return web.json_response({"error": error}, status=400)
            if fault.kind == "400":
                return web.json_response(
                    {"error": {"message": "injected bad request", "type": "invalid_request_error"}},
                    status=400,
                )
        latency = route.latency
        if callable(latency):
            import inspect

            latency = latency(body) if inspect.signature(latency).parameters else latency()
        if latency:
            await asyncio.sleep(latency)
        text = route.responder(body)
        if tokens:
            return web.json_response(self._token_completion(model, text, body))
        finish = "stop"
        for stop in body.get("stop") or []:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]  # like OpenAI and vLLM: the matched stop string is not returned
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
        completion_tokens = len(text.split())
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if max_tokens is not None and completion_tokens > max_tokens:
            text, completion_tokens, finish = " ".join(text.split()[:max_tokens]), max_tokens, "length"
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    def _token_completion(self, model: str, text: str, body: dict) -> dict:
        """A vLLM completions reply: the text up to and including the first stop string, and its token ids."""
        finish = "stop"
        for stop in body.get("stop") or []:
            cut = text.find(stop)
            if cut >= 0:
                text = text[: cut + len(stop)]  # include_stop_str_in_output: the stop string was sampled
        ids = (
            list(self.tokenizer.encode(text, add_special_tokens=False)) if self.tokenizer is not None else []
        )
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
            text = self.tokenizer.decode(ids)
        logprobs = {"tokens": [], "token_logprobs": [-0.5] * len(ids), "top_logprobs": [], "text_offset": []}
        prompt = body.get("prompt") or []
        choice = {"index": 0, "text": text, "token_ids": ids, "logprobs": logprobs, "finish_reason": finish}
        if not self.token_logprobs:
            choice["logprobs"] = None
        if self.token_ids is not None:
            choice["token_ids"] = self.token_ids(ids)
            if choice["token_ids"] is None:
                del choice["token_ids"]
        return {
            "id": f"cmpl-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }


if __name__ == "__main__":  # `python -m prompt_r1.testing.servers`: the command line lives in its own module
    from prompt_r1.testing.server_command import main

    raise SystemExit(main(ScriptedServer, FAULT_KINDS))
