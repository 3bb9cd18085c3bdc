"""`python -m prompt_r1.testing.servers` (prompt_r1.testing.server_command): the scripted server as a process of
its own, called by the `openai` client as a user would, and stopped by a signal."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ctrl_c_as_in_a_terminal() -> None:
    # A suite started in the background (`cmd &` in a script) passes SIGINT on ignored, and a Python started so
    # never turns Ctrl-C into KeyboardInterrupt: the server these tests stop must get it as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*flags: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "prompt_r1.testing.servers", *flags],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_it_serves_the_openai_client_on_the_port_asked_until_a_signal(stop):
    port = free_port()
    process = start("--port", str(port), "--env", "big-llm", "--agent-prompts", "1", "--echo-prefix", "Echo")
    try:
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1", (url, process.stderr.read() if process.poll() else "")
        assert "'big-llm', an environment" in process.stdout.readline()
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10)
        assert sorted(m.id for m in client.models.list()) == ["agent", "big-llm"]
        ask = [{"role": "user", "content": "Who wrote Hamlet?"}]
        echoed = client.chat.completions.create(model="big-llm", messages=ask)
        assert echoed.choices[0].message.content == "Echo 1: Who wrote Hamlet?"
        first = client.chat.completions.create(model="agent", messages=ask).choices[0].message.content
        assert (
            first
            == "<think>step 1</think><interaction_prompt>Who wrote Hamlet? / part 1</interaction_prompt>"
        )
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="env", messages=ask)  # renamed by --env

        process.send_signal(stop)
        assert process.wait(15) == 0
        stderr = process.stderr.read()
        assert "Traceback" not in stderr and f"{stop.name}: stopped" in stderr, stderr
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # the port is free again
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


def test_a_port_in_use_or_a_bad_flag_is_one_line_and_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start("--port", str(port))
        out, err = process.communicate(timeout=30)
    assert process.returncode == 2 and out == ""
    assert err == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"

    process = start("--fault", "teapot=0.5")
    out, err = process.communicate(timeout=30)
    assert (
        process.returncode == 2 and "argument --fault: expected KIND=RATE" in err and "Traceback" not in err
    )


def test_prompt_r1_run_answers_against_it_on_a_free_port():
    """The docs' two-terminal example: the server on any free port (the first line names it), `prompt-r1 run` at it."""
    process = start()
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), url
        done = subprocess.run(
            [sys.executable, "-m", "prompt_r1", "run", "--agent-base-url", url, "--agent-model", "agent",
             "--env-base-url", url, "--env-model", "env", "Who wrote Hamlet?"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "answer: Response 2: Who wrote Hamlet? / part 2\n" in done.stdout
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
