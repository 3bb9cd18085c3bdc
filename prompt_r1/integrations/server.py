"""The Prompt-R1 loop behind an OpenAI-compatible HTTP API, so any OpenAI client can call it as if it were a model.

    prompt-r1 serve --host 127.0.0.1 --port 8000 --agent-model ./my-agent --env-model gpt-4o-mini
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"model": "prompt-r1", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}'

Endpoints: `POST /v1/chat/completions` (streamed as server-sent events or not), `GET /v1/models`, `GET /health`.
Each completion runs one episode on the text of the last user message. One agent backend and one environment
client are built at start-up and shared by every request, so the environment's process-wide rate limit holds
across all clients; at most `max_concurrency` episodes run at once, `max_queue` more wait, and beyond that the
server answers 429 with Retry-After. Requests are validated before any work starts; a bad one gets a 4xx with an
OpenAI-style error body and never disturbs the others. A client that disconnects cancels its episode.

Responses are OpenAI `chat.completion` objects with one extension field, `prompt_r1` (status, turns, usage,
error); streamed responses carry each per-turn event (see events.py) in a chunk's `prompt_r1_event` field, then
the answer as content; while an episode waits on a slow call, a `: keep-alive` comment line goes out every
`keepalive` seconds (15) so that proxies keep the connection open. An environment that fails past its retries is
a 502 (`environment_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from prompt_r1.core import redaction
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentError, ConfigError
from prompt_r1.loop.graph import finish_reason as _finish_reason
from prompt_r1.runs.episode import Episode, EpisodeRunner, question_from_messages

__all__ = ["build_app", "serve", "serving_in_thread"]

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than any question, small enough that a flood cannot exhaust memory


class RequestError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI-style error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def _question(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list of chat messages", param="messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise RequestError(400, "every message must be an object with a string `role`", param="messages")
    try:
        return question_from_messages(messages)
    except ValueError as exc:
        raise RequestError(400, str(exc), param="messages") from None


def validate(body: Any, model_name: str) -> tuple[str, bool, bool, int | None]:
    """(question, stream, include_usage, max_turns) of a chat-completions body, or a RequestError."""
    if not isinstance(body, dict):
        raise RequestError(400, "the body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "`model` must be a string", param="model")
    if model is not None and model != model_name:
        raise RequestError(404, f"model {model!r} is not served here; use {model_name!r}", param="model",
                           code="model_not_found")  # fmt: skip
    if body.get("tools"):
        raise RequestError(
            400, "Prompt-R1 does not make tool calls; send the request without tools", param="tools"
        )
    # "auto" and "none" with no tools both mean a plain text answer, which is what every reply is.
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise RequestError(400, "Prompt-R1 does not make tool calls; `tool_choice` can only be \"none\" or "
                           "\"auto\" (with no tools)", param="tool_choice")  # fmt: skip
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != 1):
        raise RequestError(400, "only n=1 is supported", param="n")
    # null is what several clients send for a parameter they leave unset: the default, not an error.
    stream = False if body.get("stream") is None else body["stream"]
    if not isinstance(stream, bool):
        raise RequestError(400, "`stream` must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not stream:  # as OpenAI answers it
        raise RequestError(
            400, "`stream_options` is only allowed when `stream` is true", param="stream_options"
        )
    options = options or {}
    if not isinstance(options, dict):
        raise RequestError(400, "`stream_options` must be an object", param="stream_options")
    max_turns = body.get("max_turns")
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 0 <= max_turns <= 20
    ):
        raise RequestError(400, "`max_turns` must be an integer from 0 to 20", param="max_turns")
    return _question(body), stream, bool(options.get("include_usage")), max_turns


def _usage(episode: Episode) -> dict[str, int]:
    prompt, completion = episode.token_totals
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extension(episode: Episode, keys: tuple[str, ...], trajectory: bool) -> dict[str, Any]:
    """The `prompt_r1` field of a response; with `prompt_r1_trajectory: true` in the request, the token ids the
    agent read and wrote (`prompt_ids`, `completion_ids`, `env_mask`, `logprobs`), null for an agent without them."""
    extension = {k: getattr(episode, k) for k in keys}
    if trajectory:
        extension["trajectory"] = episode.trajectory
    return extension


def _environment_error(episode: Episode) -> RequestError:
    return RequestError(502, episode.error or "the environment call failed", kind="environment_error",
                        code="environment_error")  # fmt: skip


def _episode_failure(exc: Exception, episode_id: str) -> RequestError:
    """The error a client gets for an episode that raised: a failed agent call is the upstream's fault (502);
    anything else is ours (500, logged with its traceback, which the client never sees)."""
    if isinstance(exc, AgentError):
        return RequestError(502, f"the agent failed: {exc}", kind="agent_error", code="agent_error")
    logger.error("episode %s failed", episode_id, exc_info=exc)
    return RequestError(500, f"the episode failed ({type(exc).__name__}); see the server log",
                        kind="server_error", code="internal_error")  # fmt: skip


class _Slots:
    """At most `running` episodes at once and `queued` more waiting; beyond that a request is refused at once."""

    def __init__(self, running: int, queued: int) -> None:
        self.running, self.queued = running, queued
        self.in_flight = self.waiting = 0
        self._semaphore: asyncio.Semaphore | None = None

    async def __aenter__(self) -> None:
        if self._semaphore is None:  # made on the server's loop
            self._semaphore = asyncio.Semaphore(self.running)
        # in_flight + waiting counts every admitted request exactly (a waiter moves from one to the other with
        # no await in between), so the queue never holds more than `queued`, even while slots change hands.
        if self.in_flight + self.waiting >= self.running + self.queued:
            raise RequestError(429, f"the server is busy ({self.in_flight} episodes running, {self.waiting} "
                               "waiting); retry shortly", kind="rate_limit_error", code="server_busy",
                               headers={"Retry-After": "1"})  # fmt: skip
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1
        self._semaphore.release()


def build_app(
    agent: Any,
    environment: Any,
    *,
    loop: LoopConfig | None = None,
    model_name: str = "prompt-r1",
    max_concurrency: int = 32,
    max_queue: int = 256,
    api_key: str | None = None,
    keepalive: float | None = 15.0,
):
    """The aiohttp application serving the loop for `agent` and `environment` (shared by every request).

    `keepalive`: seconds a streamed response may stay silent (waiting for a slow environment call) before the
    server sends an SSE comment line, `: keep-alive`, which clients skip; proxies and load balancers cut
    connections idle for longer than their timeout (often 30–60 s). None or 0: never."""
    from aiohttp import web

    if max_concurrency < 1 or max_queue < 0:
        raise ValueError(f"max_concurrency must be ≥ 1 and max_queue ≥ 0, got {max_concurrency}, {max_queue}")
    if keepalive is not None and keepalive < 0:
        raise ValueError(f"keepalive must be ≥ 0 seconds, got {keepalive}")
    loop = loop or LoopConfig()
    runners: dict[int, EpisodeRunner] = {}

    def runner_for(max_turns: int | None) -> EpisodeRunner:
        """The runner of a request's `max_turns` (the server's loop otherwise), built once per value."""
        turns = loop.max_turns if max_turns is None else max_turns
        if turns not in runners:
            try:
                turn_loop = dataclasses.replace(loop, max_turns=turns)
            except ConfigError as exc:  # e.g. 0 turns under the release protocol, which counts agent turns
                raise RequestError(400, f"`max_turns`: {exc}", param="max_turns") from None
            runners[turns] = EpisodeRunner(agent, environment, turn_loop, tags=["serve"])
        return runners[turns]

    slots = _Slots(max_concurrency, max_queue)

    def error_response(exc: RequestError):
        # Error text may carry what an upstream server echoed, the request's Authorization header included.
        return web.json_response(exc.body(), status=exc.status, headers=exc.headers, dumps=redaction.dumps)

    @web.middleware
    async def errors_and_auth(request, handler):
        # /health stays open for load balancers and probes; it reveals nothing but counts.
        if api_key is not None and request.path.startswith("/v1/"):
            sent = request.headers.get("Authorization", "").encode()
            # A constant-time comparison: the time taken reveals nothing about how much of the key matched.
            if not hmac.compare_digest(sent, f"Bearer {api_key}".encode()):
                return error_response(
                    RequestError(
                        401,
                        "missing or wrong API key (Authorization: Bearer ...)",
                        kind="authentication_error",
                        code="invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                )
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc)

    async def health(request):
        return web.json_response({"status": "ok", "model": model_name, "in_flight": slots.in_flight,
                                  "waiting": slots.waiting})  # fmt: skip

    async def models(request):
        return web.json_response({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "prompt-r1"}]})  # fmt: skip

    async def completions(request):
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise RequestError(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"the body is larger than {MAX_BODY_BYTES} bytes") from None
        except (ValueError, UnicodeDecodeError):
            raise RequestError(400, "the body is not valid JSON") from None
        except RecursionError:  # deeply nested arrays fit in the size limit but not in json's recursion
            raise RequestError(400, "the body is nested too deeply") from None
        question, stream, include_usage, max_turns = validate(body, model_name)
        trajectory = body.get("prompt_r1_trajectory", False)
        if not isinstance(trajectory, bool):
            raise RequestError(
                400, "`prompt_r1_trajectory` must be true or false", param="prompt_r1_trajectory"
            )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        # The episode's events as they happen, then the Episode (prompt_r1.runs.episode).
        items = runner_for(max_turns).stream(
            question, id=completion_id, metadata={"served_model": model_name}
        )
        head = {"id": completion_id, "created": int(time.time()), "model": model_name}
        async with slots:
            if not stream:
                try:
                    episode = [item async for item in items][-1]
                except Exception as exc:
                    raise _episode_failure(exc, completion_id) from exc
                if episode.status == "environment_error":
                    raise _environment_error(episode)
                return web.json_response(dumps=redaction.dumps, data={
                    **head,
                    "object": "chat.completion",
                    "choices": [{"index": 0, "finish_reason": _finish_reason(episode.status),
                                 "message": {"role": "assistant", "content": episode.answer or ""}}],
                    "usage": _usage(episode),
                    "prompt_r1": _extension(episode, ("status", "turns", "usage", "error"), trajectory),
                })  # fmt: skip
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            clock = asyncio.get_running_loop().time
            written = clock()  # when the last bytes went out
            lock = asyncio.Lock()  # a keep-alive line never lands inside a payload

            async def write(data: bytes) -> None:
                nonlocal written
                async with lock:
                    await response.write(data)
                    written = clock()

            async def send(payload: dict[str, Any] | str) -> None:
                data = payload if isinstance(payload, str) else redaction.dumps(payload)
                await write(f"data: {data}\n\n".encode())

            async def keep_alive(every: float) -> None:
                with contextlib.suppress(
                    ConnectionError
                ):  # the client went away: the handler is cancelled too
                    while True:
                        await asyncio.sleep(max(written + every - clock(), 0.0))
                        if clock() - written >= every:
                            await write(b": keep-alive\n\n")

            def chunk(delta: dict, finish: str | None = None, **extra: Any) -> dict[str, Any]:
                return {**head, "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip

            await send(chunk({"role": "assistant"}))
            episode: Episode | None = None
            failure: RequestError | None = None
            pinger = asyncio.create_task(keep_alive(keepalive)) if keepalive else None
            try:
                async for item in items:
                    if isinstance(item, Episode):
                        episode = item
                    else:
                        await send(chunk({}, prompt_r1_event=item))
            except ConnectionError:  # the client went away mid-write: there is no one left to tell
                raise
            except Exception as exc:  # the status line is sent: the error can only travel in the stream
                failure = _episode_failure(exc, completion_id)
            finally:
                if pinger is not None:
                    pinger.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pinger
            if failure is None and episode.status == "environment_error":
                failure = _environment_error(episode)
            if failure is not None:
                await send(failure.body())
            else:
                await send(chunk({"content": episode.answer or ""}))
                await send(chunk({}, _finish_reason(episode.status),
                                 prompt_r1=_extension(episode, ("status", "usage", "error"), trajectory)))  # fmt: skip
                if include_usage:
                    await send(
                        {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(episode)}
                    )
            await send("[DONE]")
            await response.write_eof()
            return response

    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def serve(app, host: str = "127.0.0.1", port: int = 8000, *, ready=None) -> None:
    """Serve `app` until cancelled (Ctrl-C). `ready(url)` is called once the socket listens."""
    from aiohttp import web

    # aiohttp cancels a handler whose client went away, which cancels the episode and its environment calls.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        if ready is not None:
            bound_host, bound_port = runner.addresses[0][:2]  # port 0 asks the system for a free port
            if ":" in bound_host:  # an IPv6 address goes in brackets in a URL
                bound_host = f"[{bound_host}]"
            ready(f"http://{bound_host}:{bound_port}/v1")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def serving_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` from a thread and event loop of its own (port 0: a free one); yield its base URL, stop on exit.

    For embedding the server in a synchronous program (a demo, a test, a notebook) without `prompt-r1 serve`.
    """
    import threading

    loop = asyncio.new_event_loop()
    started = threading.Event()
    urls: list[str] = []

    def ready(url: str) -> None:
        urls.append(url)
        started.set()

    async def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # cancelled to stop, as Ctrl-C stops the command
            await serve(app, host, port, ready=ready)

    task = loop.create_task(run())
    thread = threading.Thread(target=loop.run_until_complete, args=(task,), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the server did not start")
    try:
        yield urls[0]
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(30)
