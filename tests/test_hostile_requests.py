"""serve's request fields, none dropped without a word: each is honoured (stop), refused with a 400 naming it
(response_format, logprobs, an unknown field), or ignored and named in the response's `prompt_r1.ignored`
(max_tokens, temperature, ...); and a request aiohttp cannot parse is a 400 and one line on the server's stderr.
Real HTTP on 127.0.0.1: a scripted upstream, the `prompt-r1 serve` app in a thread or as a process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

ROOT = Path(__file__).resolve().parents[1]
ANSWER = "Response 2: Capital of France? / part 2"
MESSAGES = [{"role": "user", "content": "Capital of France?"}]


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format", "answers in free text"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format", "free text"),
        ({"logprobs": True}, "logprobs", "no log-probabilities"),
        ({"top_logprobs": 3}, "top_logprobs", "no log-probabilities"),
        ({"functions": [{"name": "f"}]}, "functions", "function calls"),
        ({"modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "non-empty string"),
        ({"max_turn": 1}, "max_turn", "unrecognized request argument(s): max_turn"),
        ({"user": 7}, "user", "must be a str"),
    ],
)
def test_a_field_the_server_cannot_honour_is_refused_naming_it(served, extra, param, says):
    url, upstream = served
    before = len(upstream.requests_for("agent"))
    status, body = post(url, {"messages": MESSAGES, **extra})
    assert status == 400 and body["error"]["param"] == param and says in body["error"]["message"], body
    assert len(upstream.requests_for("agent")) == before  # refused before the episode


def test_ignored_fields_are_named_in_the_response_and_defaults_are_accepted(served):
    url, _ = served
    status, body = post(url, {"messages": MESSAGES, "max_tokens": 5, "temperature": 0.2, "seed": 3, "user": "u",
                              "response_format": {"type": "text"}, "logprobs": False, "stop": None})  # fmt: skip
    assert status == 200 and body["choices"][0]["message"]["content"] == ANSWER
    assert body["prompt_r1"]["ignored"] == ["temperature", "seed", "max_tokens", "user"]
    status, body = post(url, {"messages": MESSAGES})
    assert status == 200 and body["prompt_r1"]["ignored"] == []


def test_stop_is_honoured_streamed_or_not(served):
    url, _ = served
    status, body = post(url, {"messages": MESSAGES, "stop": "/"})
    assert status == 200 and body["choices"][0]["message"]["content"] == "Response 2: Capital of France? "
    client = openai.OpenAI(base_url=url, api_key="unused")
    chunks = list(client.chat.completions.create(model="prompt-r1", messages=MESSAGES, stream=True,
                                                 stop=["France", "/"], max_tokens=9))  # fmt: skip
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Response 2: Capital of "
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.model_extra["prompt_r1"]["ignored"] == ["max_tokens"]


def test_a_bad_content_length_is_a_400_and_one_line_on_the_servers_stderr(tmp_path):
    log = tmp_path / "serve.log"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as upstream:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prompt_r1", "serve", "--port", "0", "--agent-model", "agent",
             "--agent-base-url", upstream.base_url, "--env-model", "env", "--env-base-url", upstream.base_url,
             "--env-api-key-env", "NONE"],
            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while "serving" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            host, port = log.read_text().split("http://")[1].split("/")[0].rsplit(":", 1)
            answers = []
            for length in (b"abc", b"-5", b"99999999999999999999", b"5\r\nContent-Length: 9"):
                with socket.create_connection((host, int(port)), timeout=10) as conn:
                    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length
                                 + b"\r\n\r\n{}")  # fmt: skip
                    answers.append(conn.recv(64))
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    printed = log.read_text()
    assert all(a.startswith(b"HTTP/1.") and b" 400 " in a for a in answers), answers
    assert "Traceback" not in printed, printed
    lines = [x for x in printed.splitlines() if "malformed request" in x]
    assert len(lines) == 4 and "answered 400 to a malformed request from 127.0.0.1" in lines[0], printed
