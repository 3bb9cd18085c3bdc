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
import functools
import hmac
import json
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

from prompt_r1.core import redaction, signals
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import AgentError, ConfigError
from prompt_r1.core.text import before_stop
from prompt_r1.integrations.server_requests import ChatRequest, RequestError, read_request
from prompt_r1.loop.graph import finish_reason as _finish_reason
from prompt_r1.runs.episode import Episode, EpisodeRunner

__all__ = ["build_app", "serve", "serving_in_thread"]

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 1 << 20  # 1 MiB: far more than any question, small enough that a flood cannot exhaust memory
_STREAM = "prompt_r1_stream"  # a request's key of its prepared stream and writer, once streaming
SHUTDOWN_TIMEOUT = 60.0  # seconds the requests in flight get to finish once a stop signal arrives


def _usage(episode: Episode) -> dict[str, int]:
    prompt, completion = episode.token_totals
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _extension(episode: Episode, keys: tuple[str, ...], request: ChatRequest) -> dict[str, Any]:
    """The `prompt_r1` field of a response: `ignored`, the request's fields the server ignored (see
    server_requests.py); with `prompt_r1_trajectory: true` in the request, the token ids the agent read and wrote
    (`prompt_ids`, `completion_ids`, `env_mask`, `logprobs`), null for an agent without them."""
    extension = {k: getattr(episode, k) for k in keys}
    extension["ignored"] = list(request.ignored)
    if request.trajectory:
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


@functools.cache
def _slots_key():
    """The app's key of its _Slots (the requests running and waiting), which serve reads when it stops."""
    from aiohttp import web

    return web.AppKey("prompt_r1_slots", _Slots)


class _Handlers:
    """The request handlers running, so that a second stop signal can end them with an error response each
    (`abort`) instead of cutting their connections."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.aborting = False

    def abort(self) -> int:
        self.aborting = True
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)


@functools.cache
def _handlers_key():
    from aiohttp import web

    return web.AppKey("prompt_r1_handlers", _Handlers)


STOPPED = "the server was stopped while this request ran: it was cancelled; send it again to a running server"


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
    handlers = _Handlers()

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
        task = asyncio.current_task()
        handlers.tasks.add(task)
        try:
            return await handler(request)
        except RequestError as exc:
            return error_response(exc)
        except asyncio.CancelledError:
            if not handlers.aborting:  # the client went away (aiohttp cancels its handler): no one to answer
                raise
            task.uncancel()  # cancelled by a second stop signal: the client still gets an answer
            stopped = RequestError(503, STOPPED, kind="server_error", code="server_stopped")
            stream = request.get(_STREAM)
            if stream is None:
                return error_response(stopped)
            response, send = stream
            with contextlib.suppress(ConnectionError):
                await send(stopped.body())
                await send("[DONE]")
                await response.write_eof()
            return response
        finally:
            handlers.tasks.discard(task)

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
        asked = read_request(body, model_name)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        # The episode's events as they happen, then the Episode (prompt_r1.runs.episode).
        items = runner_for(asked.max_turns).stream(
            asked.question, id=completion_id, metadata={"served_model": model_name}
        )

        def answer(episode: Episode) -> str:
            return before_stop(episode.answer or "", asked.stop)

        head = {"id": completion_id, "created": int(time.time()), "model": model_name}
        async with slots:
            if not asked.stream:
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
                                 "message": {"role": "assistant", "content": answer(episode)}}],
                    "usage": _usage(episode),
                    "prompt_r1": _extension(episode, ("status", "turns", "usage", "error"), asked),
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

            request[_STREAM] = (response, send)  # where a stop at once writes its error

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
                await send(chunk({"content": answer(episode)}))
                await send(chunk({}, _finish_reason(episode.status),
                                 prompt_r1=_extension(episode, ("status", "usage", "error"), asked)))  # fmt: skip
                if asked.include_usage:
                    await send(
                        {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(episode)}
                    )
            await send("[DONE]")
            await response.write_eof()
            return response

    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_BODY_BYTES)
    app[_slots_key()] = slots
    app[_handlers_key()] = handlers
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


class _MalformedRequests(logging.Filter):
    """aiohttp answers a request it cannot parse (a bad Content-Length, a broken header) with a 400 itself, and
    logs it with a traceback as if the server had failed: here it is one line naming the client and the fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            peer = record.getMessage().rpartition(" from ")[2] or "a client"
            problem = str(exc.message).strip().splitlines()[0].rstrip(":") if exc.message else "malformed"
            record.msg, record.args = "prompt-r1: answered %s to a malformed request from %s: %s", (exc.code, peer,
                                                                                                     problem)  # fmt: skip
            record.exc_info, record.exc_text, record.levelno, record.levelname = (
                None,
                None,
                logging.WARNING,
                "WARNING",
            )
        return True


async def serve(
    app, host: str = "127.0.0.1", port: int = 8000, *, ready=None, stopping=None, aborting=None
) -> str:
    """Serve `app` until SIGINT or SIGTERM (or until cancelled); return the signal's name ("" if cancelled).

    `ready(url)` is called once the socket listens. On the first signal the server stops taking connections,
    calls `stopping(name, requests in flight)`, and lets the requests in flight finish (up to
    SHUTDOWN_TIMEOUT seconds, then they are cancelled); a second signal calls `aborting(name, requests ended)`
    and ends them at once, each with an error response (503, or an error chunk and [DONE] in a stream), then the
    server stops as after the first. Signals are handled in the main thread only: from another thread
    (serving_in_thread) the caller stops it by cancelling."""
    from aiohttp import web

    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _MalformedRequests) for f in server_log.filters):
        server_log.addFilter(_MalformedRequests())
    # aiohttp cancels a handler whose client went away, which cancels the episode and its environment calls.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    loop = asyncio.get_running_loop()
    stop, received, installed = asyncio.Event(), [], []

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        signals.note(name)
        if received:  # the second: the requests in flight end now, each with an error response
            handlers = app.get(_handlers_key())  # an app of another kind (serve-model's) keeps none
            ended = handlers.abort() if handlers is not None else 0
            if aborting is not None:
                aborting(name, ended)
            return
        received.append(name)
        if stopping is not None:
            stopping(name, app[_slots_key()].in_flight + app[_slots_key()].waiting)
        stop.set()

    with signals.restoring(signal.SIGINT, signal.SIGTERM):
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(signum, on_signal, signum)
                installed.append(signum)
        try:
            if ready is not None:
                bound_host, bound_port = runner.addresses[0][:2]  # port 0 asks the system for a free port
                if ":" in bound_host:  # an IPv6 address goes in brackets in a URL
                    bound_host = f"[{bound_host}]"
                ready(f"http://{bound_host}:{bound_port}/v1")
            await stop.wait()
        finally:
            try:
                await runner.cleanup()  # stops listening, then waits for the handlers still running
            finally:
                for signum in installed:
                    loop.remove_signal_handler(signum)
    return received[0] if received else ""


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
