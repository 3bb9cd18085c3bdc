"""The environment client against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest

from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.clients.environment_pool import EnvironmentPool
from prompt_r1.core.config import EnvironmentConfig, resolve_api_key
from prompt_r1.core.errors import (
    ConfigError,
    ContextOverflow,
    EnvironmentCallError,
    EnvironmentRejected,
    EnvironmentServerError,
    MissingCredentials,
)
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, max_in_window


def client_for(server, **overrides) -> EnvironmentClient:
    settings = dict(
        model="env", base_url=server.base_url, backoff_initial=0.01, backoff_max=0.05, timeout=5.0
    )
    settings.update(overrides)
    return EnvironmentClient(EnvironmentConfig(**settings), api_key="sk-test-secret-123")


async def test_messages_system_prompt_history_and_usage(server):
    client = client_for(server)
    reply = await client.respond("p3", history=[("p1", "r1"), ("p2", "r2")])
    sent = server.requests_for("env")[-1].body["messages"]
    assert sent == [
        {"role": "system", "content": ENVIRONMENT_SYSTEM_PROMPT},
        {"role": "user", "content": "p1"},
        {"role": "assistant", "content": "r1"},
        {"role": "user", "content": "p2"},
        {"role": "assistant", "content": "r2"},
        {"role": "user", "content": "p3"},
    ]
    assert reply.text == "Response 3: p3"
    assert reply.attempts == 1
    assert reply.input_tokens > 0 and reply.output_tokens == 3


async def test_retry_after_is_honoured(server):
    client = client_for(server)
    server.inject(Fault("429", retry_after=0.4))
    started = time.monotonic()
    reply = await client.respond("p")
    elapsed = time.monotonic() - started
    assert reply.attempts == 2 and client.retries == 1
    assert elapsed >= 0.4  # waited what the server asked, not the 10-50 ms backoff
    first, second = server.requests_for("env")[-2:]
    assert second.received_at - first.received_at >= 0.4


@pytest.mark.parametrize(
    "fault", [Fault("500"), Fault("timeout", delay=1.5), Fault("drop"), Fault("malformed"), Fault("429")]
)
async def test_transient_faults_are_retried(server, fault):
    client = client_for(server, timeout=0.5)
    server.inject(fault, fault)
    reply = await client.respond("p")
    assert reply.text == "Response 1: p"
    assert reply.attempts == 3
    assert [r.fault for r in server.requests_for("env")] == [fault.kind, fault.kind, None]


async def test_retries_are_bounded(server):
    client = client_for(server, max_retries=2)
    server.inject(*[Fault("500")] * 5)
    with pytest.raises(EnvironmentServerError):
        await client.respond("p")
    assert len(server.requests_for("env")) == 3


async def test_client_errors_are_not_retried(server):
    client = client_for(server)
    server.inject(Fault("400"))
    with pytest.raises(EnvironmentRejected) as info:
        await client.respond("p")
    assert info.value.status_code == 400
    assert len(server.requests_for("env")) == 1


async def test_unknown_model_is_rejected(server):
    client = client_for(server, model="no-such-model")
    with pytest.raises(EnvironmentRejected, match="404"):
        await client.respond("p")


async def test_context_length_error_is_context_overflow(server):
    client = client_for(server)
    server.inject(Fault("context"))
    with pytest.raises(ContextOverflow):
        await client.respond("p")


async def test_rate_limit_holds_at_the_server():
    """40 concurrent calls under 8 requests per 0.5 s: the server never sees more than 8 in any 0.5 s window."""
    with ScriptedServer({"env": echo_environment()}) as server:
        clients = [client_for(server, rate_limit=8, rate_period=0.5) for _ in range(4)]  # one shared limiter
        started = time.monotonic()
        await asyncio.gather(*(clients[i % 4].respond(f"p{i}") for i in range(40)))
        elapsed = time.monotonic() - started
        times = [r.received_at for r in server.requests]
    assert len(times) == 40
    assert max_in_window(times, 0.5) <= 8
    assert (
        elapsed >= 4 * 0.5 - 0.05
    )  # 40 requests at 8 per window need at least 4 more windows after the first


async def test_in_flight_cap_holds_at_the_server():
    with ScriptedServer({"env": echo_environment()}, latency=0.1) as server:
        client = client_for(server, max_in_flight=3)
        await asyncio.gather(*(client.respond(f"p{i}") for i in range(12)))
        assert server.max_in_flight == 3


def test_same_endpoint_different_limits_is_an_error(server):
    client_for(server, rate_limit=10)
    with pytest.raises(ConfigError, match="already has limits"):
        client_for(server, rate_limit=20)


def test_limiter_key_separates_endpoints(server):
    a = client_for(server, rate_limit=10)
    b = EnvironmentClient(
        EnvironmentConfig(model="env", base_url=server.base_url, rate_limit=20),
        api_key="k",
        limiter_key="other",
    )
    assert a.limiter is not b.limiter


def test_sync_and_async_loops_share_one_client(server):
    """The same client serves two different event loops (each gets its own HTTP connections)."""
    client = client_for(server)
    first = asyncio.run(client.respond("a"))
    second = asyncio.run(client.respond("b"))
    assert (first.text, second.text) == ("Response 1: a", "Response 1: b")


async def test_api_key_is_sent_but_never_shown(server, monkeypatch):
    secret = "sk-super-secret-value"
    monkeypatch.setenv("MY_ENV_KEY", secret)
    client = EnvironmentClient(
        EnvironmentConfig(model="env", base_url=server.base_url, api_key_env="MY_ENV_KEY", max_retries=0)
    )
    await client.respond("p")
    assert server.requests_for("env")[-1].headers["Authorization"] == f"Bearer {secret}"
    server.inject(Fault("400"))
    with pytest.raises(EnvironmentRejected) as info:
        await client.respond("p")
    shown = " ".join([repr(client._model()), repr(client.__dict__), str(info.value), repr(info.value)])
    assert secret not in shown


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(MissingCredentials, match="OPENAI_API_KEY"):
        EnvironmentClient(EnvironmentConfig())
    # A custom endpoint (e.g. a local vLLM server) may need no key at all.
    assert resolve_api_key("UNSET_VARIABLE_XYZ", "http://127.0.0.1:8000/v1") == "EMPTY"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rate_limit", 0),
        ("rate_period", 0),
        ("max_in_flight", 0),
        ("timeout", -1),
        ("max_retries", -1),
        ("base_url", "localhost:8000"),
    ],
)
def test_bad_settings_say_what_to_fix(field, value):
    with pytest.raises(ConfigError):
        EnvironmentConfig(**{field: value})


@pytest.mark.parametrize("kind", ["503", "502"])
async def test_retry_after_is_honoured_on_server_errors_too(server, kind):
    client = client_for(server)
    server.inject(Fault(kind, retry_after=0.3))
    reply = await client.respond("p")
    first, second = server.requests_for("env")[-2:]
    assert reply.attempts == 2 and second.received_at - first.received_at >= 0.3


async def test_retry_after_is_capped(server):
    client = client_for(server, max_retry_after=0.2)
    server.inject(Fault("429", retry_after=3600))
    started = time.monotonic()
    await client.respond("p")
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("kind", ["408", "409"])
async def test_request_timeout_and_conflict_are_retried(server, kind):
    server.inject(Fault(kind))
    assert (await client_for(server).respond("p")).attempts == 2


async def test_failed_call_reports_its_attempts(server):
    server.inject(*[Fault("500")] * 3)
    with pytest.raises(EnvironmentServerError) as info:
        await client_for(server, max_retries=2).respond("p")
    assert info.value.attempts == 3


async def test_any_chat_model_failure_becomes_a_final_environment_error():
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    class Broken(FakeListChatModel):
        async def _agenerate(self, *args, **kwargs):
            raise RuntimeError("Event loop is closed")

    client = EnvironmentClient(chat_model=Broken(responses=["x"]), limiter_key="broken")
    with pytest.raises(EnvironmentCallError, match="RuntimeError: Event loop is closed") as info:
        await client.respond("p")
    assert not info.value.retryable and info.value.attempts == 1


async def test_pool_trips_a_member_on_its_own_failures_not_on_rejected_requests():
    with (
        ScriptedServer({"env": echo_environment()}) as home,
        ScriptedServer({"env": echo_environment()}) as backup,
    ):
        # Weight 0: the backup takes calls only as the fallback.
        pool = EnvironmentPool(
            [client_for(home, max_retries=0), client_for(backup)],
            [1, 0],
            names=["home", "backup"],
            trip_after=2,
            cooldown=60,
        )

        async def ask(i: int) -> str:
            reply = await pool.respond(f"p{i}", run_config={"configurable": {"thread_id": f"t{i}"}})
            return reply.endpoint

        # Three requests in a row that home rejects (400: the request's fault) fall back, but home stays in use.
        home.inject(*[Fault("400")] * 3)
        assert [await ask(i) for i in range(3)] == ["backup"] * 3
        assert await ask(3) == "home"
        # Two server errors in a row (the endpoint's fault) trip it: the next call goes straight to the backup.
        home.inject(*[Fault("500")] * 2)
        assert [await ask(i) for i in range(4, 7)] == ["backup"] * 3
        assert [r.fault for r in home.requests_for("env")] == ["400"] * 3 + [None] + ["500"] * 2


async def test_a_key_echoed_in_an_error_body_is_cut_from_the_error():
    class Echoing(
        ScriptedServer
    ):  # a server (or proxy) that repeats the Authorization header when it refuses
        async def _reply(self, request, body, model, route, fault):
            from aiohttp import web

            message = f"bad key {request.headers.get('Authorization')}"
            return web.json_response({"error": {"message": message}}, status=401)

    with Echoing({"env": echo_environment()}) as echoing, pytest.raises(EnvironmentRejected) as info:
        await client_for(echoing).respond("p")
    assert "bad key Bearer ***" in str(info.value) and "sk-test-secret-123" not in str(info.value)
