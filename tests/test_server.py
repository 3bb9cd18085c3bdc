"""`prompt-r1 serve`: the loop as an OpenAI-compatible model, called over HTTP on 127.0.0.1 with the openai client."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest
from conftest import ANSWER, PROMPT

from prompt_r1.agents.served import ServedAgent
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.integrations.server import build_app, serving_in_thread
from prompt_r1.testing.servers import (
    Fault,
    ScriptedServer,
    echo_environment,
    max_in_window,
    relay_agent,
    scripted_agent,
)

ROOT = Path(__file__).resolve().parents[1]
EVENT_TYPES = ["think", "prompt", "response", "think", "prompt", "response", "think", "answer", "end"]


@contextlib.contextmanager
def prompt_r1_server(upstream: ScriptedServer, **options):
    """A prompt-r1 server on a free port in a thread of its own, for the agent and environment of `upstream`."""
    env_settings = dict(model="env", base_url=upstream.base_url, backoff_initial=0.01, backoff_max=0.05)
    env_settings.update(options.pop("env", {}))
    environment = EnvironmentClient(EnvironmentConfig(**env_settings), api_key="k")
    agent = ServedAgent(AgentConfig(model="agent", base_url=upstream.base_url), api_key="k")
    app = build_app(agent, environment, **options)
    with serving_in_thread(app) as url:
        yield url


@pytest.fixture
def upstream():
    agent = scripted_agent([PROMPT.format(k=1), PROMPT.format(k=2), ANSWER.format(a="Paris")])
    with ScriptedServer({"env": echo_environment(), "agent": agent}) as s:
        yield s


def post(url: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url + "/chat/completions", data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {**json.loads(exc.read()), "_headers": dict(exc.headers)}


def test_completion_returns_the_answer_with_turns_and_usage(upstream):
    with prompt_r1_server(upstream) as url:
        client = openai.OpenAI(base_url=url, api_key="unused")
        completion = client.chat.completions.create(
            model="prompt-r1",
            messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "Capital of France?"}],
            temperature=0.3,  # ignored: sampling is the agent's configuration
        )
    assert completion.choices[0].message.content == "Paris"
    assert completion.choices[0].finish_reason == "stop" and completion.model == "prompt-r1"
    extra = completion.model_extra["prompt_r1"]
    assert extra["status"] == "answered" and [t["kind"] for t in extra["turns"]] == [
        "prompt",
        "prompt",
        "answer",
    ]
    usage = extra["usage"]
    assert completion.usage.prompt_tokens == usage["agent_prompt_tokens"] + usage["env_input_tokens"] > 0
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert (
        upstream.requests_for("agent")[0]
        .body["messages"][0]["content"]
        .startswith("Question: Capital of France?")
    )


def test_streaming_sends_each_turn_event_then_the_answer_and_usage(upstream):
    with prompt_r1_server(upstream) as url:
        client = openai.OpenAI(base_url=url, api_key="unused")
        chunks = list(
            client.chat.completions.create(
                model="prompt-r1",
                messages=[{"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    def kind(chunk) -> str:
        if not chunk.choices:
            return "usage"
        if "prompt_r1_event" in (chunk.model_extra or {}):
            return chunk.model_extra["prompt_r1_event"]["type"]
        choice = chunk.choices[0]
        if choice.delta.role:
            return choice.delta.role
        return "content" if choice.delta.content else f"finish:{choice.finish_reason}"

    assert [kind(c) for c in chunks] == ["assistant", *EVENT_TYPES, "content", "finish:stop", "usage"]
    events = [c.model_extra["prompt_r1_event"] for c in chunks if "prompt_r1_event" in (c.model_extra or {})]
    assert [e["text"] for e in events if e["type"] == "response"] == ["Response 1: p1", "Response 2: p2"]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Paris"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_models_and_health(upstream):
    with prompt_r1_server(upstream, model_name="my-r1") as url:
        models = openai.OpenAI(base_url=url, api_key="unused").models.list()
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as response:
            health = json.loads(response.read())
    assert [m.id for m in models.data] == ["my-r1"]
    assert health == {"status": "ok", "model": "my-r1", "in_flight": 0, "waiting": 0}


def test_fifty_concurrent_clients_get_their_own_answers_within_the_rate_limit():
    limit, period = 20, 0.5
    with (
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as upstream,
        prompt_r1_server(
            upstream,
            max_concurrency=12,
            env={"rate_limit": limit, "rate_period": period, "timeout": 30.0},
        ) as url,
    ):

        async def ask(i: int) -> str:
            async with openai.AsyncOpenAI(base_url=url, api_key="unused", timeout=120) as client:
                completion = await client.chat.completions.create(
                    model="prompt-r1", messages=[{"role": "user", "content": f"What is item {i}?"}]
                )
                return completion.choices[0].message.content

        async def all_clients():
            return await asyncio.gather(*(ask(i) for i in range(50)))

        answers = asyncio.run(all_clients())
        env_times = [r.received_at for r in upstream.requests_for("env")]
    assert answers == [f"Response 2: What is item {i}? / part 2" for i in range(50)]
    assert len(env_times) == 100
    # Exact at the server, not only at the client: the limiter stamps a request when its reply has come (after
    # the server received it) and counts it while in flight, so a request it lets through arrives more than a
    # period after every request whose slot it took.
    assert max_in_window(env_times, period) <= limit


BAD_REQUESTS = [
    (b"{not json", 400, None),
    ({"model": "prompt-r1"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "system", "content": "only system"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "  "}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": 42}]}, 400, "messages"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages",
    ),
    ({"messages": [{"content": "no role"}]}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "q"}], "n": 2}, 400, "n"),
    ({"messages": [{"role": "user", "content": "q"}], "n": 1.0}, 400, "n"),
    ({"messages": [{"role": "user", "content": "q"}], "model": "gpt-4o"}, 404, "model"),
    ({"messages": [{"role": "user", "content": "q"}], "model": 7}, 400, "model"),
    ({"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": "q"}], "tool_choice": "required"}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "q"}], "stream": "yes"}, 400, "stream"),
    (
        {"messages": [{"role": "user", "content": "q"}], "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),  # fmt: skip
    (
        {"messages": [{"role": "user", "content": "q"}], "stream": False, "stream_options": {}},
        400,
        "stream_options",
    ),
    ({"messages": [{"role": "user", "content": "q"}], "max_turns": 99}, 400, "max_turns"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode(), 413, None),
]
# Accepted as OpenAI accepts them: no tools with tool_choice "auto" or "none", n=1, stream_options left null.
GOOD_VARIANTS = [
    {"tool_choice": "auto"},
    {"tools": [], "tool_choice": "none"},
    {"n": 1, "stream_options": None},
]


def test_malformed_requests_get_4xx_without_harming_good_ones_running_beside_them():
    with (
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.2}) as upstream,
        prompt_r1_server(upstream) as url,
    ):
        good: list[tuple[int, dict]] = []
        threads = [
            threading.Thread(
                target=lambda i=i: good.append(
                    post(url, {"messages": [{"role": "user", "content": f"Q{i}?"}]})
                )
            )
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        bad = [(post(url, body), status, param) for body, status, param in BAD_REQUESTS]
        variants = [
            post(url, {"messages": [{"role": "user", "content": f"V{i}?"}], **extra})
            for i, extra in enumerate(GOOD_VARIANTS)
        ]
        for thread in threads:
            thread.join(60)
    for (status, body), expected, param in bad:
        assert status == expected, body
        assert body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
        if param:
            assert body["error"]["param"] == param
    assert sorted(body["choices"][0]["message"]["content"] for _, body in good) == sorted(
        f"Response 2: Q{i}? / part 2" for i in range(8)
    )
    assert all(status == 200 for status, _ in good)
    assert [(status, body["choices"][0]["message"]["content"]) for status, body in variants] == [
        (200, f"Response 2: V{i}? / part 2") for i in range(len(GOOD_VARIANTS))
    ]


def test_a_full_queue_is_answered_429_with_retry_after_and_max_turns_is_per_request():
    with (
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 1.0}) as upstream,
        prompt_r1_server(upstream, max_concurrency=1, max_queue=0) as url,
    ):
        first: list[tuple[int, dict]] = []
        thread = threading.Thread(
            target=lambda: first.append(post(url, {"messages": [{"role": "user", "content": "Q?"}]}))
        )
        thread.start()
        health = url.removesuffix("/v1") + "/health"
        for _ in range(200):  # until the first episode holds the only slot
            with urllib.request.urlopen(health, timeout=10) as response:
                if json.loads(response.read())["in_flight"] == 1:
                    break
            threading.Event().wait(0.02)
        status, body = post(url, {"messages": [{"role": "user", "content": "Q2?"}]})
        thread.join(60)
        # max_turns 0: the agent is asked for its answer without any environment call.
        _, direct = post(url, {"messages": [{"role": "user", "content": "Q3?"}], "max_turns": 0})
    assert status == 429 and body["error"]["code"] == "server_busy" and body["_headers"]["Retry-After"] == "1"
    assert first[0][0] == 200
    assert direct["prompt_r1"]["usage"].get("env_calls", 0) == 0
    assert direct["prompt_r1"]["turns"][0]["response_source"] == "final_request"


def test_an_environment_that_keeps_failing_is_a_502_or_an_error_event(upstream):
    with prompt_r1_server(upstream, env={"max_retries": 1}) as url:
        upstream.inject(Fault("500"), Fault("500"), model="env")
        status, body = post(url, {"messages": [{"role": "user", "content": "Q?"}]})
        upstream.inject(Fault("400"), model="agent")  # an agent failure is the upstream's fault too
        agent_status, agent_body = post(url, {"messages": [{"role": "user", "content": "Q?"}]})
        upstream.inject(Fault("500"), Fault("500"), model="env")
        request = urllib.request.Request(
            url + "/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "Q?"}], "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            lines = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert (
        status == 502 and body["error"]["type"] == "environment_error" and "500" in body["error"]["message"]
    )
    payloads = [json.loads(line[6:]) for line in lines[:-1]]
    assert [p["prompt_r1_event"]["type"] for p in payloads if "prompt_r1_event" in p] == [
        "think",
        "prompt",
        "error",
        "end",
    ]
    assert payloads[-1]["error"]["type"] == "environment_error" and lines[-1] == "data: [DONE]"
    assert agent_status == 502 and agent_body["error"]["type"] == "agent_error"


def test_a_client_that_disconnects_cancels_its_episode():
    with (
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 2.0}) as upstream,
        prompt_r1_server(upstream) as url,
    ):
        # Not streamed: nothing is written back before the answer, so only cancellation can stop the episode.
        address = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
        body = json.dumps({"messages": [{"role": "user", "content": "Q?"}]})
        connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        for _ in range(1500):  # until the first environment call is pending
            if upstream.requests_for("env"):
                break
            threading.Event().wait(0.02)
        connection.close()
        health = url.removesuffix("/v1") + "/health"
        for _ in range(1500):
            with urllib.request.urlopen(health, timeout=10) as reply:
                if json.loads(reply.read())["in_flight"] == 0:
                    break
            threading.Event().wait(0.02)
    # Had the episode gone on, its slot would be freed only after a second agent turn and environment call.
    assert len(upstream.requests_for("agent")) == 1 and len(upstream.requests_for("env")) == 1


def test_a_stream_waiting_on_a_slow_environment_sends_keep_alive_comments():
    with (
        ScriptedServer(
            {"env": echo_environment(), "agent": relay_agent(1)}, latency={"env": 0.5}
        ) as upstream,
        prompt_r1_server(upstream, keepalive=0.1) as url,
    ):
        body = {"messages": [{"role": "user", "content": "Q?"}], "stream": True}
        request = urllib.request.Request(
            url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read().decode()
        client = openai.OpenAI(base_url=url, api_key="unused")
        chunks = list(
            client.chat.completions.create(model="prompt-r1", messages=body["messages"], stream=True)
        )
    # While the environment takes 0.5 s no event goes out: comment lines do, whole, between the events.
    blocks = raw.split("\n\n")
    assert blocks.count(": keep-alive") >= 3 and blocks[-2:] == ["data: [DONE]", ""]
    assert all(b.startswith("data: ") for b in blocks[:-1] if b != ": keep-alive")
    # The openai client skips them and reads the stream as ever.
    events = [
        c.model_extra["prompt_r1_event"]["type"] for c in chunks if "prompt_r1_event" in (c.model_extra or {})
    ]
    assert events == ["think", "prompt", "response", "think", "answer", "end"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Response 1: Q? / part 1"


def test_bearer_auth(upstream):
    with prompt_r1_server(upstream, api_key="s3cret-key") as url:
        status, body = post(url, {"messages": [{"role": "user", "content": "Q?"}]})
        ok, _ = post(
            url, {"messages": [{"role": "user", "content": "Q?"}]}, {"Authorization": "Bearer s3cret-key"}
        )
    assert status == 401 and body["error"]["code"] == "invalid_api_key" and ok == 200


def test_the_serve_command_answers_and_stops_on_ctrl_c(upstream):
    env = {**os.environ, "SERVE_TEST_KEY": "k", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "prompt_r1", "serve", "--port", "0",
         "--agent-model", "agent", "--agent-base-url", upstream.base_url, "--agent-api-key-env", "SERVE_TEST_KEY",
         "--env-model", "env", "--env-base-url", upstream.base_url, "--env-api-key-env", "SERVE_TEST_KEY",
         "--keepalive", "5", "--concurrency", "4"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith("prompt-r1: serving prompt-r1 on http://127.0.0.1:"), (
            line,
            process.stderr.read(),
        )
        url = line.split(" on ")[1].strip()
        status, body = post(url, {"model": "prompt-r1", "messages": [{"role": "user", "content": "Q?"}]})
        assert status == 200 and body["choices"][0]["message"]["content"] == "Paris"
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_max_turns_the_release_protocol_cannot_take_is_a_400(upstream):
    from prompt_r1.core.config import LoopConfig

    with prompt_r1_server(upstream, loop=LoopConfig(protocol="release")) as url:
        status, body = post(url, {"messages": [{"role": "user", "content": "Q?"}], "max_turns": 0})
    assert status == 400 and body["error"]["param"] == "max_turns"
    assert "agent turns" in body["error"]["message"]
