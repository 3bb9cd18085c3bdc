"""A local chat model behind an OpenAI-compatible HTTP API: what answers as the environment when the environment is
a built-in model (or any local model folder), with no API key and no vLLM.

    with model_server_in_thread("smollm2-135m") as server:     # http://127.0.0.1:PORT/v1, a free port
        EnvironmentClient(EnvironmentConfig(model=server.name, base_url=server.base_url))
    prompt-r1 serve-model smollm2-135m --port 8001            # the same, in the foreground until Ctrl-C

Endpoints: `POST /v1/chat/completions` (not streamed), `GET /v1/models`, `GET /health`. Each request's messages are
rendered with the model's chat template and answered by a `TransformersAgent`, which batches the requests that
arrive together into one `generate` call: a batch of episodes calling the environment at once is answered at
once, not one after another. Responses carry OpenAI's `usage` (prompt and completion tokens), so the environment
client meters and prices them as any provider's. `temperature` and `top_p` are honoured per request (requests with
the same settings share batches); unset, the server samples at `temperature` (0.7) with `top_p` 1.0, seeded by
`seed` when one is given (the same requests in the same order then give the same replies).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prompt_r1.agents.base import AgentRequest
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.core.errors import AgentError, ConfigError, ContextOverflow, RequestError
from prompt_r1.core.text import before_stop

__all__ = [
    "ModelServer",
    "build_model_app",
    "load_served_model",
    "local_environment",
    "model_server_in_thread",
    "shared_model_server",
]

MAX_BODY_BYTES = 1 << 20
MAX_STOP = 4  # as OpenAI: at most four stop sequences
DEFAULT_MAX_TOKENS = (
    256  # a reply's tokens when the request names none: a small model on a CPU writes ~20-50/s
)


@dataclass
class ModelServer:
    """The served model: its name as clients ask for it, where it was loaded from, and its generators."""

    name: str
    path: str
    model: Any
    tokenizer: Any
    temperature: float = 0.7
    seed: int | None = None
    max_batch_size: int = 32
    generate_memory_mb: int | None = None  # None: the agent's default (`TransformersAgent`)
    base_url: str = ""
    _generators: dict[tuple[float, float], Any] = field(default_factory=dict)
    requests: int = 0

    def generator(self, temperature: float, top_p: float):
        """The batching generator for one sampling setting (made on first use; all share the model's weights)."""
        from prompt_r1.agents.local import TransformersAgent

        key = (temperature, top_p)
        if key not in self._generators:
            config = AgentConfig(model=self.path, temperature=temperature, top_p=top_p, seed=self.seed,
                                 max_new_tokens=DEFAULT_MAX_TOKENS,
                                 generate_memory_mb=self.generate_memory_mb)  # fmt: skip
            agent = TransformersAgent(config, model=self.model, tokenizer=self.tokenizer,
                                      max_batch_size=self.max_batch_size)  # fmt: skip
            if self._generators:  # one generate at a time on the shared weights, whichever setting asks
                agent._generate_thread = next(iter(self._generators.values()))._generate_thread
            self._generators[key] = agent
        return self._generators[key]


def load_served_model(model: str, *, name: str | None = None, temperature: float = 0.7, seed: int | None = None,
                      device: str | None = None, max_batch_size: int = 32,
                      generate_memory_mb: int | None = None) -> ModelServer:  # fmt: skip
    """Load `model` (a built-in name, a folder or a hub id) for serving; a ConfigError when it cannot load."""
    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.agents.local import load_transformers_model

    try:
        import aiohttp  # noqa: F401
    except ImportError:
        from prompt_r1.agents.builtin import LOCAL_EXTRA, ModelNameError

        raise ModelNameError(f"serving a model here needs aiohttp: {LOCAL_EXTRA}") from None
    path = resolve_model(model)
    loaded, tokenizer = load_transformers_model(path, device=device or "cpu")
    server = ModelServer(name or model, path, loaded, tokenizer, temperature, seed, max_batch_size,
                         generate_memory_mb)  # fmt: skip
    # Made now, not on the first request: a generator seeds torch's random state as it is made, and a seeding
    # in the middle of a run would disturb whatever else samples in this process.
    server.generator(temperature, 1.0)
    return server


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise RequestError(400, f"`{key}` must be a number from {low} to {high}, got {value!r}", param=key)
    return float(value)


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list", param="messages")
    out = []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # OpenAI's content parts: the text ones, joined
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if role not in {"system", "user", "assistant"} or not isinstance(content, str):
            raise RequestError(
                400, "each message needs a role (system, user, assistant) and text content", param="messages"
            )
        out.append({"role": role, "content": content})
    return out


async def _complete(server: ModelServer, body: dict) -> dict[str, Any]:
    if body.get("stream"):
        raise RequestError(400, "this server does not stream; send stream: false", param="stream")
    asked = body.get("model")
    if asked is not None and asked != server.name:
        raise RequestError(
            404, f"the model `{asked}` does not exist here; this server serves `{server.name}`", param="model"
        )
    messages = _messages(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(
            400, f"`max_tokens` must be a positive integer, got {max_tokens!r}", param="max_tokens"
        )
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str | list):
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not isinstance(stop, tuple) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(
            400, f"`stop` must be a non-empty string or a list of at most {MAX_STOP} of them", param="stop"
        )
    temperature = _number(body, "temperature", server.temperature, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 1e-9, 1.0)
    from prompt_r1.core.tokens import initial_prompt_ids

    tokenizer = server.tokenizer
    prompt_ids = initial_prompt_ids(tokenizer, messages)
    try:
        output = await server.generator(temperature, top_p).generate(
            AgentRequest(messages=messages, prompt_ids=prompt_ids, max_new_tokens=max_tokens, stop=stop)
        )
    except ContextOverflow as exc:
        raise RequestError(
            400, f"{exc}: this model's maximum context length is exceeded", param="messages"
        ) from None
    except AgentError as exc:
        raise RequestError(500, f"generation failed: {exc}") from None
    server.requests += 1
    text = before_stop(output.text, stop)  # as OpenAI: the text ends before the stop string
    usage = {"prompt_tokens": output.prompt_tokens, "completion_tokens": output.completion_tokens,
             "total_tokens": output.prompt_tokens + output.completion_tokens}  # fmt: skip
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": server.name,
        "choices": [
            {
                "index": 0,
                "finish_reason": output.finish_reason,
                "message": {"role": "assistant", "content": text},
            }
        ],  # fmt: skip
        "usage": usage,
    }


def build_model_app(server: ModelServer):
    """The aiohttp application serving `server`'s model."""
    from aiohttp import web

    async def health(request):
        return web.json_response({"status": "ok", "model": server.name, "requests": server.requests})

    async def models(request):
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": server.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "prompt-r1",
                        "root": server.path,
                    }
                ],
            }
        )

    async def completions(request):
        try:
            try:
                body = json.loads(await request.read())
            except (ValueError, UnicodeDecodeError, RecursionError):
                raise RequestError(400, "the body is not valid JSON") from None
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, f"the body is larger than {MAX_BODY_BYTES} bytes") from None
            if not isinstance(body, dict):
                raise RequestError(400, "the body must be a JSON object")
            return web.json_response(await _complete(server, body))
        except RequestError as exc:
            return web.json_response(exc.body(), status=exc.status)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    return app


@contextlib.contextmanager
def model_server_in_thread(model: str | ModelServer, *, host: str = "127.0.0.1", port: int = 0,
                           **load: Any) -> Iterator[ModelServer]:  # fmt: skip
    """Serve `model` (a name to load, or a loaded ModelServer) from a thread of this process while the block runs;
    `server.base_url` is where it listens (port 0: a free port). Stopped, its port closed, when the block ends."""
    from aiohttp import web

    server = model if isinstance(model, ModelServer) else load_served_model(model, **load)
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(build_model_app(server), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started["runner"] = loop.run_until_complete(start())
        except BaseException as exc:  # noqa: BLE001 (any failure must reach the waiting caller, not hang it)
            started["error"] = exc
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(started["runner"].cleanup())

    thread = threading.Thread(target=run, name=f"model-server-{server.name}", daemon=True)
    thread.start()
    ready.wait()
    if "error" in started:
        loop.close()
        exc = started["error"]
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"cannot serve the model on {host}:{port}: {reason}") from None
    bound_host, bound_port = started["runner"].addresses[0][:2]
    bound_host = f"[{bound_host}]" if ":" in bound_host else bound_host  # an IPv6 address goes in brackets
    server.base_url = f"http://{bound_host}:{bound_port}/v1"
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=60)
        if (
            not thread.is_alive()
        ):  # a loop still cleaning up is left to finish; closing it under it would fail
            loop.close()


_SHARED: dict[str, ModelServer] = {}
_SHARED_LOCK = threading.Lock()
_SHARED_STOPS = contextlib.ExitStack()


def shared_model_server(model: str) -> ModelServer:
    """One server of `model` for the whole process, started on first use on a free port of 127.0.0.1 and stopped
    when the process exits (or by `stop_shared_model_servers`): every environment client naming a built-in model
    in this process calls the same server, so its requests batch together."""
    with _SHARED_LOCK:
        if model not in _SHARED:
            if not _SHARED:
                atexit.register(stop_shared_model_servers)
            _SHARED[model] = _SHARED_STOPS.enter_context(model_server_in_thread(model))
        return _SHARED[model]


def stop_shared_model_servers() -> None:
    """Stop every server `shared_model_server` started (a command's end; the process's exit)."""
    with _SHARED_LOCK:
        _SHARED.clear()
        _SHARED_STOPS.close()


def local_environment(config: EnvironmentConfig) -> EnvironmentConfig:
    """`config` itself, or, for a built-in environment model with no base URL, the same settings pointed at this
    process's server of that model (`shared_model_server`)."""
    from prompt_r1.agents.builtin import is_builtin

    if config.base_url is not None or not is_builtin(config.model):
        return config
    server = shared_model_server(config.model)
    return dataclasses.replace(config, base_url=server.base_url)
