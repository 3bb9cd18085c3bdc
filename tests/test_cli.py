"""`prompt-r1 run` against the scripted servers: readable and JSON output, flags, config files, clear errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import TINY_QUESTION

from prompt_r1.cli.main import main
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment


def served(server, *extra: str) -> list[str]:
    return [
        "run", "What is the capital of France?",
        "--agent-model", "agent", "--agent-base-url", server.base_url,
        "--env-model", "env", "--env-base-url", server.base_url,
        "--env-backoff-initial", "0.01", *extra,
    ]  # fmt: skip


def test_run_readable(server, capsys):
    assert main(served(server)) == 0
    out = capsys.readouterr().out
    assert "turn 1  prompt:    p1\nturn 1  response:  Response 1: p1\n" in out
    assert "answer: Paris" in out and "[answered · 2 environment calls" in out


def test_run_json(server, capsys):
    assert main(served(server, "--json", "--max-turns", "1")) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"question", "answer", "status", "turns", "usage", "error", "drift"}
    assert payload["drift"] == {"checked": False, "reason": "no tokenizer for the agent (--agent-tokenizer)"}
    assert payload["status"] == "answered" and payload["answer"] == "Paris"
    assert payload["usage"]["env_calls"] == 1  # --max-turns 1, then the final-answer request
    assert payload["turns"][1]["response_source"] == "final_request"


def test_flags_override_the_config_file(server, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("loop:\n  max_turns: 1\n  force_final_answer: false\nenvironment:\n  max_retries: 0\n")
    assert main(served(server, "--json", "--config", str(config))) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "max_turns"
    assert main(served(server, "--json", "--config", str(config), "--max-turns", "5")) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "answered"


def test_environment_error_exits_1_with_one_line(server, capsys):
    server.inject(*[Fault("500")] * 2, model="env")
    assert main(served(server, "--env-max-retries", "1")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prompt-r1: error: EnvironmentServerError")


def test_local_agent_from_a_path(trained_tiny_model_path, capsys):
    with ScriptedServer({"env": echo_environment()}) as server:
        argv = ["run", TINY_QUESTION, "--agent-model", str(trained_tiny_model_path), "--agent-temperature", "0",
                "--env-model", "env", "--env-base-url", server.base_url, "--json"]  # fmt: skip
        assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == "Ada Lovelace"


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["run", "q", "--env-base-url", "http://127.0.0.1:9/v1"],
            3,
            "cannot reach the environment at http://127.0.0.1:9/v1",
        ),
        (
            ["run", "q", "--env-rate-limit", "0", "--env-base-url", "http://127.0.0.1:9/v1"],
            2,
            "argument --env-rate-limit: must be an integer ≥ 1, got 0 (see prompt-r1 run --help)",
        ),
        (["run", "q", "--env-base-url", "localhost:8000"], 2, "--env-base-url must be an http(s) URL"),
        (
            ["run", "q", "--agent-backend", "served", "--env-base-url", "http://127.0.0.1:9/v1"],
            2,
            "needs --agent-base-url",
        ),
        (["run", "q", "--config", "/no/such/file.yaml"], 2, "cannot read config file"),
    ],
)
def test_bad_input_is_one_line(argv, code, message, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unknown_config_keys_are_named(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("environment:\n  rate_limt: 3\n")
    assert main(["run", "q", "--config", str(config)]) == 2
    assert "unknown environment keys ['rate_limt']" in capsys.readouterr().err


def test_missing_key_and_unreachable_agent(server, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # Named, OpenAI's model needs its key (unnamed, the built-in model stands in: tests/test_builtin_model.py).
    assert main(["run", "q", "--env-model", "gpt-4o-mini"]) == 2
    assert "set OPENAI_API_KEY" in capsys.readouterr().err
    argv = [
        "run",
        "q",
        "--env-model",
        "env",
        "--env-base-url",
        server.base_url,
        "--agent-base-url",
        "http://127.0.0.1:9/v1",
    ]
    assert main(argv) == 3
    assert "cannot reach the served agent" in capsys.readouterr().err


def test_console_script_end_to_end(server):
    """The installed `prompt-r1` entry point, as a user runs it: exit code, stdout, and no traceback on errors."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    exe = os.path.join(os.path.dirname(sys.executable), "prompt-r1")
    ok = subprocess.run(
        [exe, *served(server, "--json")], capture_output=True, text=True, env=env, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["answer"] == "Paris"
    bad = subprocess.run([exe, "run", "q", "--env-model", "gpt-4o-mini"], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0
    # README.md's tour ends with `prompt-r1 --help` and the commands it lists (that block names this test).
    helped = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert helped.returncode == 0, helped.stderr
    listed = {line.split()[0] for line in helped.stdout.splitlines() if re.match(r"^ {4}\S", line)}
    commands = {"run", "batch", "batch-merge", "eval", "score", "serve", "serve-model", "train", "merge"}
    assert listed == commands, listed


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (["run", "   "], None, "the question is empty"),
        (
            ["run", "q"],
            "environment:\n  base_url: 123\n",
            "EnvironmentConfig.base_url must be str or None, got 123",
        ),
        (["run", "q"], "loop:\n  max_turns: 'five'\n", "LoopConfig.max_turns must be int, got 'five'"),
        (
            ["run", "q"],
            "loop:\n  force_final_answer: 1\n",
            "LoopConfig.force_final_answer must be bool or None, got 1",
        ),
    ],
)
def test_bad_values_are_one_line(argv, config, message, tmp_path, capsys):
    if config is not None:
        path = tmp_path / "c.yaml"
        path.write_text(config)
        argv = [*argv, "--config", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_unusable_device_is_one_line(tiny_model_path, server, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv = ["run", "q", "--agent-model", str(tiny_model_path), "--agent-device", "cuda",
            "--env-model", "env", "--env-base-url", server.base_url]  # fmt: skip
    assert main(argv) == 3
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "prompt-r1" in line]
    assert err == [err[0]] and "cannot place the agent model on device 'cuda'" in err[0], err


def test_trajectory_needs_json(server, capsys):
    assert main(served(server, "--trajectory")) == 2
    assert (
        capsys.readouterr().err.strip()
        == "prompt-r1: error: --trajectory adds to the JSON output: give --json too"
    )
    assert not server.requests


def test_one_cap_has_one_flag_name_in_every_command_and_serves_old_name_still_works_with_a_notice(capsys):
    from prompt_r1.cli.main import build_parser

    parser = build_parser()
    commands = {"batch": ["in.jsonl", "--out", "o.jsonl"], "eval": [], "serve": []}
    for command, needed in commands.items():
        args = parser.parse_args([command, *needed, "--concurrency", "3"])
        assert args.concurrency == 3, command
    assert capsys.readouterr().err == ""

    args = parser.parse_args(["serve", "--max-concurrency", "5"])
    assert args.concurrency == 5  # the one setting, whichever name set it
    assert (
        capsys.readouterr().err == "prompt-r1: warning: --max-concurrency is deprecated, use --concurrency\n"
    )
    # The old name is checked by the flag's own rule, and named in the error.
    assert main(["serve", "--max-concurrency", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-concurrency" in err and "Traceback" not in err
