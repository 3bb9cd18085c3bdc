"""SIGTERM, as a service manager or `kill` sends it, stops every long-running command as Ctrl-C does: real
`prompt-r1` processes, real signals, a scripted OpenAI-compatible server on 127.0.0.1 whose environment answers
slowly, so that the signal lands while work is in flight.

serve drains its requests and exits 0; run, batch and eval (a prompt optimiser's search included) stop cleanly,
name the signal and exit 143 (130 for SIGINT); none prints a traceback.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import spawn_cli, wait_for, write_questions

from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    return spawn_cli(args, log, env={"SIGNAL_TEST_KEY": "k"})


def endpoints(server: ScriptedServer) -> list[str]:
    return ["--agent-model", "agent", "--agent-base-url", server.base_url, "--agent-api-key-env", "SIGNAL_TEST_KEY",
            "--env-model", "env", "--env-base-url", server.base_url, "--env-api-key-env", "SIGNAL_TEST_KEY",
            "--env-backoff-initial", "0.01"]  # fmt: skip


def finish(proc: subprocess.Popen, log: Path) -> tuple[int, str]:
    try:
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = log.read_text()
    assert "Traceback" not in printed, printed[-3000:]
    return code, printed


def test_serve_finishes_the_requests_in_flight_on_sigterm_then_exits_0(tmp_path):
    log = tmp_path / "serve.log"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 1.5}) as server:
        proc = spawn(["serve", "--port", "0", *endpoints(server)], log)
        wait_for(lambda: "serving prompt-r1 on" in log.read_text(), "the server to listen")
        url = log.read_text().split(" on ")[1].split()[0]
        replies: list = []

        def ask() -> None:
            body = json.dumps({"messages": [{"role": "user", "content": "What is A?"}]}).encode()
            request = urllib.request.Request(url + "/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    replies.append((response.status, json.loads(response.read())))
            except Exception as exc:  # a dropped connection: what SIGTERM did before
                replies.append((None, repr(exc)))

        client = threading.Thread(target=ask)
        client.start()
        wait_for(lambda: len(server.requests_for("env")) >= 1, "the episode's first environment call")
        proc.send_signal(signal.SIGTERM)
        client.join(60)
        code, printed = finish(proc, log)
    assert replies and replies[0][0] == 200, replies
    assert replies[0][1]["choices"][0]["message"]["content"] == "Response 2: What is A? / part 2"
    assert "SIGTERM: no new requests; finishing the 1 in flight" in printed and "SIGTERM: stopped" in printed
    assert code == 0


def test_a_second_sigterm_to_serve_ends_the_requests_in_flight_with_an_error_each_and_exits_143(tmp_path):
    log = tmp_path / "serve.log"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 30}) as server:
        proc = spawn(["serve", "--port", "0", *endpoints(server)], log)
        wait_for(lambda: "serving prompt-r1 on" in log.read_text(), "the server to listen")
        url = log.read_text().split(" on ")[1].split()[0]
        replies: dict = {}

        def ask(stream: bool) -> None:
            body = json.dumps(
                {"messages": [{"role": "user", "content": "What is A?"}], "stream": stream}
            ).encode()
            request = urllib.request.Request(url + "/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    replies[stream] = (response.status, response.read().decode())
            except urllib.error.HTTPError as exc:
                replies[stream] = (exc.code, exc.read().decode())
            except Exception as exc:  # a dropped connection: what a second signal did before
                replies[stream] = (None, repr(exc))

        clients = [threading.Thread(target=ask, args=(stream,)) for stream in (False, True)]
        for client in clients:
            client.start()
        wait_for(lambda: len(server.requests_for("env")) >= 2, "both episodes' first environment calls")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "finishing the 2 in flight" in log.read_text(), "the first signal's line")
        proc.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(60)
        code, printed = finish(proc, log)
    status, text = replies[False]
    assert status == 503 and json.loads(text)["error"]["code"] == "server_stopped", replies
    status, text = replies[True]
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]", replies  # the stream had begun: the error travels in it
    assert json.loads(events[-2])["error"]["code"] == "server_stopped"
    assert "SIGTERM again: stopping at once; the 2 request(s) in flight get an error response" in printed
    assert "CancelledError" not in printed
    assert code == 143


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_batch_stops_cleanly_on_sigterm_as_on_ctrl_c_and_names_the_signal(tmp_path, signum, code):
    inp, out, log = write_questions(tmp_path / "q.jsonl", 60), tmp_path / "r.jsonl", tmp_path / "batch.log"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.05}) as server:
        proc = spawn(["batch", str(inp), "--out", str(out), "--concurrency", "4", "--no-progress",
                      *endpoints(server)], log)  # fmt: skip
        wait_for(lambda: out.exists() and out.read_text().count("\n") >= 4, "4 rows")
        proc.send_signal(signum)
        got, printed = finish(proc, log)
    name = signal.Signals(signum).name
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert got == code and summary["stopped"] == f"interrupted ({name})", printed[-2000:]
    assert f"prompt-r1: {name}: stopping" in printed
    again = "Ctrl-C again" if signum == signal.SIGINT else "SIGTERM again"
    assert again in printed and ("Ctrl-C" in printed) == (signum == signal.SIGINT)
    assert out.read_text().count("\n") == summary["written"]  # whole rows only


def test_eval_stops_cleanly_on_sigterm_during_a_prompt_optimisers_search(tmp_path):
    data = write_questions(tmp_path / "items.jsonl", 12)
    log, out = tmp_path / "eval.log", tmp_path / "run"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 0.5}) as server:
        proc = spawn(["eval", "--dataset", str(data), "--limit", "4", "--method", "opro", "--out", str(out),
                      "--optimizer-train-rows", "4", "--optimizer-budget", "40", "--no-progress", "--no-chart",
                      *endpoints(server)], log)  # fmt: skip
        wait_for(lambda: len(server.requests_for("env")) >= 2, "the search's first calls")
        proc.send_signal(signal.SIGTERM)
        code, printed = finish(proc, log)
    assert code == 143, printed[-2000:]
    assert "prompt-r1: interrupted (SIGTERM)" in printed, printed[-2000:]
    assert not (out / "predictions.jsonl").exists() or (out / "predictions.jsonl").read_text() == ""


def test_run_stops_cleanly_on_sigterm(tmp_path):
    log = tmp_path / "run.log"
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}, latency={"env": 30}) as server:
        proc = spawn(["run", "What is A?", *endpoints(server)], log)
        wait_for(lambda: len(server.requests_for("env")) >= 1, "the first environment call")
        proc.send_signal(signal.SIGTERM)
        code, printed = finish(proc, log)
    assert code == 143 and "prompt-r1: interrupted (SIGTERM)" in printed, printed[-2000:]
