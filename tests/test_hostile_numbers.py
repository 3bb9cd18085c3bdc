"""Hostile numbers: nan, inf, negatives, text and booleans wherever a user gives a number (flags, config and
recipe files, environment variables, HTTP bodies), and training configurations that cannot train.

Each is refused before anything runs, with one line naming the setting (exit 2, or 3 for a model that cannot be
found) or a 400 naming the request field; none runs with the limit silently gone.
"""

from __future__ import annotations

import argparse
import json
import math
import urllib.error
import urllib.request
from dataclasses import fields

import pytest

from prompt_r1.cli.main import build_parser, main
from prompt_r1.clients.costs import PriceTable
from prompt_r1.clients.environment_pool import EnvironmentPool
from prompt_r1.core.checks import flag_number, number, parse_number
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig, configs_from_env
from prompt_r1.core.errors import ConfigError
from prompt_r1.testing.servers import ScriptedServer, echo_environment

NAN, INF = float("nan"), float("inf")


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    return lines[0]


# ---- the one helper ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (NAN, {}, "got nan"),
        (INF, {}, "got inf"),
        (-INF, {"infinite_ok": True}, "got -inf"),
        (True, {}, "got True"),
        ("3", {}, "got '3'"),
        (2.5, {"integer": True}, "must be an integer, got 2.5"),
        (0, {"above": 0}, "> 0, got 0"),
        (3, {"maximum": 2}, "≤ 2, got 3"),
        (None, {}, "got nothing"),
    ],
)
def test_number_refuses_what_is_not_a_finite_number_in_range(value, bounds, message):
    with pytest.raises(ConfigError, match=message):
        number(value, "x", **bounds)


def test_number_keeps_good_values_and_reads_integral_floats_as_integers():
    assert number(3.0, "x", integer=True) == 3 and isinstance(number(3.0, "x", integer=True), int)
    assert number(INF, "x", infinite_ok=True) == INF and number(None, "x", none_ok=True) is None
    assert parse_number("1e3", "x", minimum=0) == 1000.0
    with pytest.raises(ConfigError, match="got 'lots'"):
        parse_number("lots", "x")
    with pytest.raises(argparse.ArgumentTypeError, match="^must be a finite number > 0, got nan$"):
        flag_number(above=0)("nan")


def _number_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {flag}", kind) for flag, kind in _number_actions(sub))
        elif action.option_strings:
            yield action.option_strings[0], action.type


def test_every_number_flag_of_every_command_goes_through_the_helper():
    """No flag parses a number with plain int or float, which take nan and inf; each refuses nan at parse."""
    flags = list(_number_actions(build_parser()))
    assert not [flag for flag, kind in flags if kind in (int, float)]
    checked = [(flag, kind) for flag, kind in flags if getattr(kind, "__name__", "") in ("integer", "number")]
    assert (
        len(checked) > 40
    )  # run/batch/eval/serve: the config fields, the stop flags, serve's and eval's own
    for _flag, kind in checked:
        with pytest.raises(argparse.ArgumentTypeError):
            kind("nan")


def test_every_number_field_of_the_configs_has_a_range():
    for cls in (AgentConfig, EnvironmentConfig, LoopConfig):
        for f in fields(cls):
            if any(t in str(f.type) for t in ("int", "float")):
                assert "check" in f.metadata, f"{cls.__name__}.{f.name}"


# ---- flags ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["batch", "hotpot", "--out", "{tmp}/r.jsonl", "--budget", "nan"], "--budget: must be a finite number > 0"),
        (["batch", "hotpot", "--out", "{tmp}/r.jsonl", "--budget", "inf"], "got inf"),
        (["batch", "hotpot", "--out", "{tmp}/r.jsonl", "--concurrency", "0"], "--concurrency: must be an integer ≥ 1"),
        (["batch", "hotpot", "--out", "{tmp}/r.jsonl", "--max-failures", "1.5"], "--max-failures: must be an integer"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--budget", "nan"], "--budget: must be a finite"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--method", "opro", "--opro-temperature", "nan"],
         "--opro-temperature: must be a finite number ≥ 0 and ≤ 2, got nan"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--opro-temperature", "-1"], "got -1"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--opro-temperature", "inf"], "got inf"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--opro-steps", "0"], "--opro-steps: must be an integer ≥ 1"),
        (["eval", "--dataset", "hotpot", "--out", "{tmp}/e", "--limit", "-3"], "--limit: must be an integer ≥ 1"),
        (["run", "q", "--env-timeout", "nan"], "--env-timeout: must be a finite number > 0, got nan"),
        (["run", "q", "--env-temperature", "inf"], "--env-temperature: must be a finite number ≥ 0 and ≤ 2"),
        (["run", "q", "--agent-top-p", "2"], "--agent-top-p: must be a finite number > 0 and ≤ 1, got 2"),
        (["run", "q", "--max-turns", "-1"], "--max-turns: must be an integer ≥ 0, got -1"),
        (["run", "q", "--env-backoff-max=-inf"], "--env-backoff-max: must be a finite number ≥ 0"),
        (["serve", "--keepalive", "nan"], "--keepalive: must be a finite number ≥ 0, got nan"),
        (["serve", "--port", "70000"], "--port: must be an integer ≥ 0 and ≤ 65535"),
    ],
)  # fmt: skip
def test_a_bad_number_flag_is_one_line_and_nothing_runs(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert message in line and line.startswith("prompt-r1 "), line
    assert list(tmp_path.iterdir()) == []  # nothing written


# ---- files and environment variables -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("environment:\n  timeout: .nan\n", "env timeout must be a finite number > 0, got nan"),
        ("environment:\n  rate_period: .inf\n", "env rate_period must be a finite number > 0, got inf"),
        ("agent:\n  temperature: -0.5\n", "agent temperature must be a finite number ≥ 0, got -0.5"),
        ("agent:\n  seed: -1\n", "agent seed must be an integer ≥ 0, got -1"),
        ("loop:\n  max_total_tokens: 0\n", "max_total_tokens must be an integer ≥ 1, got 0"),
    ],
)
def test_a_bad_number_in_a_config_file_is_one_line(config, message, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(config)
    assert main(["run", "q", "--config", str(path)]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_environment_variables_price_tables_and_pools_are_held_to_the_same_rule(tmp_path):
    with pytest.raises(ConfigError, match="env timeout must be a finite number > 0, got nan"):
        configs_from_env({"PROMPT_R1_ENV_TIMEOUT": "nan"})
    with pytest.raises(ConfigError, match="agent top_p .* got inf"):
        configs_from_env({"PROMPT_R1_AGENT_TOP_P": "inf"})
    prices = tmp_path / "p.yaml"
    prices.write_text("env: {input: .nan, output: 1}\n")
    with pytest.raises(ConfigError, match="input price .* got nan"):
        PriceTable.load(prices)
    pool = tmp_path / "pool.yaml"
    for body, message in [
        ("environments:\n  - {model: a, weight: .nan}\n", "weight must be a finite number ≥ 0, got nan"),
        (
            "environments:\n  - {model: a, timeout: .inf}\n",
            "env timeout must be a finite number > 0, got inf",
        ),
        ("environments:\n  - {model: a}\ncooldown: -1\n", "cooldown .* got -1"),
        ("environments:\n  - {model: a}\ntrip_after: 0.5\n", "trip_after must be an integer"),
    ]:
        pool.write_text(body)
        with pytest.raises(ConfigError, match=message):
            EnvironmentPool.from_file(pool, EnvironmentConfig(base_url="http://127.0.0.1:9/v1"))


def test_a_nan_search_temperature_cannot_reach_a_folder_record(tmp_path):
    """nan != nan: a folder's recorded settings holding it never matched themselves, so the run refused its own
    new folder. The settings refuse it now, for the API as for the flag."""
    from prompt_r1.evaluation.optimizers.opro import OproSettings
    from prompt_r1.evaluation.optimizers.search import SearchSettings

    with pytest.raises(ConfigError, match="OPRO temperature"):
        OproSettings(temperature=NAN)
    with pytest.raises(ConfigError, match="search budget"):
        SearchSettings(budget=0)


# ---- serve's request body ---------------------------------------------------------------------------------------


def post(url: str, raw: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/chat/completions", data=raw, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


MESSAGES = '"messages": [{"role": "user", "content": "Capital of France?"}]'


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ('"max_tokens": -5', "max_tokens", "must be an integer ≥ 1"),
        ('"max_tokens": "lots"', "max_tokens", "got 'lots'"),
        ('"max_tokens": 1e15', "max_tokens", "must be an integer"),
        ('"max_tokens": 1000000000000000', "max_tokens", "≤ 2147483647"),
        ('"temperature": NaN', "temperature", "got nan"),
        ('"temperature": Infinity', "temperature", "got inf"),
        ('"top_p": -1', "top_p", "≥ 0"),
        ('"max_turns": true', "max_turns", "got True"),
        ('"seed": 1.5', "seed", "must be an integer"),
    ],
)
def test_a_bad_number_in_a_request_is_a_400_naming_it_and_runs_nothing(served, extra, param, message):
    url, upstream = served
    before = len(upstream.requests_for("agent"))
    status, body = post(url, f"{{{MESSAGES}, {extra}}}".encode())
    assert status == 400 and body["error"]["param"] == param, body
    assert message in body["error"]["message"], body
    assert len(upstream.requests_for("agent")) == before


# ---- training ---------------------------------------------------------------------------------------------------


@pytest.fixture
def grpo_config(tiny_grpo_config):
    """The tiny run's config (conftest), output in tmp_path/out, with one value changed by each test."""

    def make(tmp_path, **overrides):
        return tiny_grpo_config(tmp_path, **{"output_dir": str(tmp_path / "out"), "bf16": False, **overrides})

    return make


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"learning_rate": NAN}, "learning_rate must be a finite number > 0, got nan"),
        ({"learning_rate": -1.0}, "learning_rate must be a finite number > 0, got -1.0"),
        ({"learning_rate": "1e-4"}, "YAML reads an exponent without a dot as text: write 1.0e-4"),
        ({"max_steps": -5}, "max_steps (-1: num_train_epochs decides) must be an integer ≥ 1, got -5"),
        ({"max_grad_norm": INF}, "max_grad_norm must be a finite number ≥ 0, got inf"),
        ({"reward_alpha": NAN}, "reward_alpha must be a finite number, got nan"),
        ({"lora_dropout": 1.0}, "lora_dropout must be a finite number ≥ 0 and < 1"),
        ({"env_rate_limit": 0}, "env rate_limit must be an integer ≥ 1, got 0"),
        ({"train_data": "no-such.parquet"}, "train_data no-such.parquet: no such file"),
    ],
)
def test_a_training_config_that_cannot_train_is_named_before_anything_loads(grpo_config, tmp_path, overrides,
                                                                            message):  # fmt: skip
    """Checked when built (the config's own __post_init__); the training file by `check_train_data`."""
    from prompt_r1.training.shared.checks import check_train_data

    with pytest.raises(ConfigError) as caught:
        check_train_data(grpo_config(tmp_path, **overrides))
    assert message in str(caught.value)


def test_the_default_training_config_passes_and_an_output_dir_that_is_a_file_is_named(grpo_config, tmp_path):
    from prompt_r1.training.shared.checks import check_train_data

    check_train_data(grpo_config(tmp_path))
    (tmp_path / "afile").write_text("x")
    for out in ("afile", "afile/sub"):
        with pytest.raises(ConfigError, match="output_dir must be a folder"):
            grpo_config(tmp_path, output_dir=str(tmp_path / out))


def test_a_training_config_built_in_python_is_checked_when_built(grpo_config, tmp_path):
    """Whichever trainer it is for: the async trainer's config is range-checked as the sync one's."""
    from prompt_r1.training.asynchronous.config import PromptR1AsyncGRPOConfig

    with pytest.raises(ConfigError, match="learning_rate must be a finite number > 0, got nan"):
        grpo_config(tmp_path, learning_rate=NAN)
    with pytest.raises(ConfigError, match="max_grad_norm must be a finite number ≥ 0, got inf"):
        PromptR1AsyncGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, max_grad_norm=INF)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_model_folder_that_does_not_exist_is_one_line_before_anything_loads(command, tmp_path, capsys,
                                                                               monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with ScriptedServer({"env": echo_environment()}) as server:
        if command == "train":
            (tmp_path / "train.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n')
            argv = ["train", "--output_dir", "out", "--use_cpu", "true", "--bf16", "false", "--train_data",
                    "train.jsonl", "--model_name_or_path", "./my-trained-agent",
                    "--env_base_url", server.base_url]  # fmt: skip
        else:
            argv = ["run", "q", "--agent-model", "./my-trained-agent", "--env-model", "env",
                    "--env-base-url", server.base_url, "--env-api-key-env", "NONE"]  # fmt: skip
        assert main(argv) == 3
        assert server.counts == {}
    line = one_error_line(capsys.readouterr().err)
    assert "./my-trained-agent: no such model folder" in line, line
    assert not (tmp_path / "out").exists()


def test_number_is_what_config_fields_use_for_finiteness():
    """A field set to nan from Python is refused as from a file: the dataclasses run the same check."""
    for make in (lambda: EnvironmentConfig(backoff_initial=NAN), lambda: AgentConfig(temperature=INF),
                 lambda: LoopConfig(max_turns=math.inf)):  # fmt: skip
        with pytest.raises(ConfigError):
            make()
