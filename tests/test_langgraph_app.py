"""graphs/langgraph.json served by `langgraph dev` (the in-memory LangGraph server), called with langgraph-sdk."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import ANSWER, PROMPT

from prompt_r1.testing.servers import ScriptedServer, echo_environment, scripted_agent

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"
EVENT_TYPES = ["think", "prompt", "response", "think", "prompt", "response", "think", "answer", "end"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_langgraph_dev_serves_the_loop_to_the_sdk():
    from langgraph_sdk import get_client

    agent = scripted_agent([PROMPT.format(k=1), PROMPT.format(k=2), ANSWER.format(a="Paris")])
    with ScriptedServer({"env": echo_environment(), "agent": agent}) as upstream:
        port = free_port()
        env = {
            **os.environ,
            "LANGSMITH_TRACING": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "PROMPT_R1_AGENT_MODEL": "agent",
            "PROMPT_R1_AGENT_BASE_URL": upstream.base_url,
            "PROMPT_R1_AGENT_API_KEY_ENV": "APP_TEST_KEY",
            "PROMPT_R1_ENV_MODEL": "env",
            "PROMPT_R1_ENV_BASE_URL": upstream.base_url,
            "PROMPT_R1_ENV_API_KEY_ENV": "APP_TEST_KEY",
            "APP_TEST_KEY": "k",
        }
        langgraph = Path(sys.executable).with_name("langgraph")
        server = subprocess.Popen(
            [str(langgraph), "dev", "--no-browser", "--no-reload", "--port", str(port), "--host", "127.0.0.1"],
            cwd=GRAPHS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 90
            while True:
                try:
                    with urllib.request.urlopen(url + "/ok", timeout=2):
                        break
                except OSError:
                    assert server.poll() is None, server.stdout.read().decode()[-3000:]
                    assert time.monotonic() < deadline, "langgraph dev did not start in 90 s"
                    time.sleep(0.3)

            async def use_sdk():
                client = get_client(url=url)
                assistants = await client.assistants.search(graph_id="prompt_r1")
                result = await client.runs.wait(None, "prompt_r1", input={"question": "Capital of France?"})
                streamed = [
                    part
                    async for part in client.runs.stream(
                        None, "prompt_r1", input={"question": "Capital of France?"}, stream_mode="custom"
                    )
                ]
                # A chat UI's thread: a second question on it is a new episode, not the first one continued.
                thread = await client.threads.create()
                on_thread = [
                    await client.runs.wait(thread["thread_id"], "prompt_r1", input={"question": q})
                    for q in ("Capital of France?", "Capital of Italy?")
                ]
                return assistants, result, streamed, on_thread

            env_calls_before = len(upstream.requests_for("env"))
            assistants, result, streamed, on_thread = asyncio.run(use_sdk())
            env_calls = len(upstream.requests_for("env")) - env_calls_before
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
    assert [a["graph_id"] for a in assistants] == ["prompt_r1"]
    assert result["answer"] == "Paris" and result["status"] == "answered"
    assert [t["kind"] for t in result["turns"]] == ["prompt", "prompt", "answer"]
    events = [part.data for part in streamed if part.event == "custom"]
    assert [e["type"] for e in events] == EVENT_TYPES
    assert events[2]["text"] == "Response 1: p1"
    for episode in on_thread:
        assert episode["status"] == "answered" and episode["usage"]["env_calls"] == 2
        assert [t["kind"] for t in episode["turns"]] == ["prompt", "prompt", "answer"]
    assert on_thread[1]["question"] == "Capital of Italy?"
    assert (
        env_calls == 4 * 2
    )  # wait and stream without a thread, then two episodes on one thread: 2 calls each
