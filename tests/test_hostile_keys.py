"""No configured secret in any error: a server (or a gateway before it) that repeats the caller's Authorization
header in a 401, 403 or 500, in its body and in its headers, through every surface: the chat model with a plain
`ChatOpenAI` environment (its key given as `api_key=` or read from OPENAI_API_KEY), the environment client,
`prompt-r1 run`, `batch`'s result rows and `serve`. What is checked: the exception's message, its whole cause
chain as a traceback prints it, log lines, traces (every run a callback handler records) and rows. Real HTTP
servers on 127.0.0.1; each test uses keys of its own, so no other test's registration can hide a leak."""

from __future__ import annotations

import asyncio
import json
import logging
import traceback
import uuid

import pytest
from langchain_core.tracers.run_collector import RunCollectorCallbackHandler

from prompt_r1.agents.served import ServedAgent
from prompt_r1.cli.main import main
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.core.errors import EnvironmentCallError
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment, scripted_agent

PROMPT = "<think>t</think><interaction_prompt>p</interaction_prompt>"
ANSWER = "<think>f</think><answer>Paris</answer>"
KINDS = ["echo-401", "echo-403", "echo-500"]


def fresh_key(what: str) -> str:
    return f"sk-{what}-{uuid.uuid4().hex}"


def echoing(model_to_fail: str, kind: str) -> ScriptedServer:
    return ScriptedServer(
        {"env": echo_environment(), "agent": scripted_agent([PROMPT, ANSWER])},
        fault_rule=lambda model, body: Fault(kind) if model == model_to_fail else None,
    )


def chain_text(exc: BaseException) -> str:
    """Everything a traceback of `exc` shows, its causes and contexts included, and their attributes' text."""
    parts = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        parts += [
            repr(current.args),
            repr(getattr(current, "body", None)),
            str(getattr(current, "message", "")),
        ]
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return "\n".join(parts)


def traced_text(collector: RunCollectorCallbackHandler) -> str:
    def walk(run):
        yield run
        for child in run.child_runs:
            yield from walk(child)

    # Every field of every run: inputs, outputs, error, events, metadata.
    return "\n".join(repr(run.model_dump()) for root in collector.traced_runs for run in walk(root))


def assert_no_key(key: str, *texts: str | bytes) -> None:
    for text in texts:
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        assert key not in text
        assert key not in text.replace("\\", "")  # nor JSON-escaped


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key_from", ["api_key", "OPENAI_API_KEY"])
def test_the_chat_model_with_a_chat_openai_environment_shows_no_key(kind, key_from, monkeypatch, caplog):
    from langchain_openai import ChatOpenAI

    from prompt_r1.integrations.chat_model import PromptR1Chat

    key = fresh_key("chatopenai")
    with echoing("env", kind) as server:
        agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url), api_key="EMPTY")
        if key_from == "api_key":
            environment = ChatOpenAI(model="env", base_url=server.base_url, api_key=key, max_retries=0)
        else:
            monkeypatch.setenv("OPENAI_API_KEY", key)
            environment = ChatOpenAI(model="env", base_url=server.base_url, max_retries=0)
        # A 500 is retried: the same model in a client that backs off briefly, to keep this fast.
        if kind == "echo-500":
            fast = EnvironmentConfig(max_retries=1, backoff_initial=0.01, backoff_max=0.02)
            environment = EnvironmentClient(fast, chat_model=environment)
        chat = PromptR1Chat(agent=agent, environment=environment)
        collector = RunCollectorCallbackHandler()
        with caplog.at_level(logging.DEBUG), pytest.raises(EnvironmentCallError) as caught:
            chat.invoke("Where?", config={"callbacks": [collector]})
        env_requests = server.requests_for("env")
    assert env_requests and all(r.headers["Authorization"] == f"Bearer {key}" for r in env_requests)
    assert "Bearer ***" in str(caught.value)  # what the server said is kept, the key cut
    assert_no_key(key, chain_text(caught.value), caplog.text, traced_text(collector))


@pytest.mark.parametrize("kind", KINDS)
def test_the_environment_client_raises_no_key_anywhere_in_its_chain(kind, caplog):
    key = fresh_key("client")
    with echoing("env", kind) as server:
        client = EnvironmentClient(
            EnvironmentConfig(
                model="env", base_url=server.base_url, max_retries=1, backoff_initial=0.01, backoff_max=0.02
            ),
            api_key=key,
        )
        with caplog.at_level(logging.DEBUG), pytest.raises(EnvironmentCallError) as caught:
            asyncio.run(client.respond("hello"))
    assert "Bearer ***" in str(caught.value)
    assert_no_key(key, chain_text(caught.value), caplog.text)


# A served agent's 500s are retried by the SDK with its own backoff (seconds): its 401 and 403 are enough here.
@pytest.mark.parametrize(
    ("failing", "kind"), [("env", kind) for kind in KINDS] + [("agent", "echo-401"), ("agent", "echo-403")]
)
def test_run_and_batch_rows_show_no_key(failing, kind, tmp_path, monkeypatch, capsys):
    env_key, agent_key = fresh_key("env"), fresh_key("agent")
    monkeypatch.setenv("KEYS_ENV_KEY", env_key)
    monkeypatch.setenv("KEYS_AGENT_KEY", agent_key)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "Where?"}) + "\n")
    out = tmp_path / "rows.jsonl"
    with echoing(failing, kind) as server:
        flags = [
            "--agent-model", "agent", "--agent-base-url", server.base_url, "--agent-api-key-env", "KEYS_AGENT_KEY",
            "--env-model", "env", "--env-base-url", server.base_url, "--env-api-key-env", "KEYS_ENV_KEY",
            "--env-backoff-initial", "0.01", "--env-backoff-max", "0.02", "--env-max-retries", "1",
        ]  # fmt: skip
        run_code = main(["run", "Where?", "--json", *flags])
        batch_code = main(["batch", str(questions), "--out", str(out), "--no-progress", *flags])
    captured = capsys.readouterr()
    assert run_code == 1 and batch_code != 0
    rows = out.read_bytes()
    assert b"Bearer ***" in rows
    assert_no_key(env_key, captured.out, captured.err, rows)
    assert_no_key(agent_key, captured.out, captured.err, rows)


@pytest.mark.parametrize("kind", KINDS)
def test_serve_returns_no_key(kind):
    import urllib.error
    import urllib.request

    from prompt_r1.integrations.server import build_app, serving_in_thread

    key = fresh_key("serve")
    with echoing("env", kind) as upstream:
        environment = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=upstream.base_url, max_retries=0), api_key=key
        )
        agent = ServedAgent(AgentConfig(model="agent", base_url=upstream.base_url), api_key="EMPTY")
        with serving_in_thread(build_app(agent, environment)) as url:
            body = json.dumps({"messages": [{"role": "user", "content": "Where?"}]}).encode()
            request = urllib.request.Request(
                url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, text, headers = response.status, response.read(), str(response.headers)
            except urllib.error.HTTPError as exc:
                status, text, headers = exc.code, exc.read(), str(exc.headers)
    assert status == 502 and b"Bearer ***" in text
    assert_no_key(key, text, headers)


def test_a_refused_recipe_key_names_the_key_but_never_prints_a_text_value():
    from prompt_r1.training.shared.config import unknown_keys_message

    line = unknown_keys_message(
        "async trainer",
        ["api_key", "beta"],
        {"api_key": "sk-live-0123456789abcdef", "beta": 0.001},
        lambda key: "drop it",
    )
    assert "sk-live" not in line and "api_key: <str of length 24> (drop it)" in line
    assert "beta: 0.001 (drop it)" in line  # numbers say what was set
