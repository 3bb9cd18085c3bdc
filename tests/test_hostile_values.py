"""Hostile values beyond numbers: malformed rate-store URLs on every surface, a shard count of 10^9, a staleness
of 10^12, a boolean that is text, and a property test that throws generated values at every numeric and URL flag
of every command.

Each is refused in one line (exit 2, or 3 for something that does not answer) or a 400 naming the field; never a
traceback, never a hang, never the whole URL echoed back.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_numbers import MESSAGES, one_error_line, post  # noqa: E402

from prompt_r1.cli.main import build_parser, main
from prompt_r1.clients.shared_limit import reset_shared_limiters
from prompt_r1.core.config import EnvironmentConfig, configs_from_env
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.urls import check_store_url


def dead_port() -> int:
    """A port nothing listens on (bound, then closed): a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEAD = f"http://127.0.0.1:{dead_port()}/v1"
PROBE_KEY = "PROMPT_R1_PROBE_KEY"


@pytest.fixture(autouse=True, scope="module")
def _probe_key():
    os.environ[PROBE_KEY] = "sk-probe-not-real"
    yield
    os.environ.pop(PROBE_KEY, None)


def run_flags() -> list[str]:
    return ["--env-base-url", DEAD, "--agent-base-url", DEAD, "--agent-model", "a", "--env-model", "e",
            "--env-api-key-env", PROBE_KEY]  # fmt: skip


# ---- rate-store URLs --------------------------------------------------------------------------------------------

LONG = "redis://" + "h" * 10_000 + ":6379/0"
BAD_STORES = [
    ("redis://host:notaport", "needs a port from 1 to 65535"),
    ("redis://[::1", "needs a well-formed host"),
    ("redis://127.0.0.1:99999/0", "needs a port from 1 to 65535"),
    ("redis://127.0.0.1:0/0", "needs a port from 1 to 65535"),
    ("redis://127.0.0.1:6379/notadb", "the path must be a database number such as /0, got '/notadb'"),
    ("redis://127.0.0.1:6379/0?password=hunter2", "put the Redis password in PROMPT_R1_RATE_STORE_PASSWORD"),
    ("redis://127.0.0.1:6379/0?db=3", "takes no options after the database"),
    ("redis://us:hunter2@127.0.0.1:notaport/0", "needs a port from 1 to 65535"),
    ("redis://ho st:6379/0", "without spaces or control characters"),
    ("redis://h_é!:6379/0", "needs a host name or IP address"),
    (LONG, "is 10015 characters long (at most 1000)"),
]


@pytest.mark.parametrize(("url", "message"), BAD_STORES)
def test_a_malformed_store_url_is_one_line_in_python_and_the_langgraph_app(url, message):
    for make in (lambda: EnvironmentConfig(rate_store=url),
                 lambda: configs_from_env({"PROMPT_R1_ENV_RATE_STORE": url})):  # fmt: skip
        with pytest.raises(ConfigError) as caught:
            make()
        text = str(caught.value)
        assert message in text and "\n" not in text and len(text) < 300, text
        assert "hunter2" not in text


def _surfaces(url: str, tmp: Path) -> dict[str, list[str]]:
    questions = tmp / "q.jsonl"
    questions.write_text('{"id": "a", "question": "q?"}\n')
    pool = tmp / "pool.yaml"
    pool.write_text(f"environments:\n  - {{model: e, base_url: '{DEAD}', rate_store: '{url}'}}\n")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(f"env_rate_store: '{url}'\nuse_cpu: true\nbf16: false\noutput_dir: '{tmp / 'out'}'\n")
    return {
        "run": ["run", "q", *run_flags(), "--env-rate-store", url],
        "batch": [
            "batch",
            str(questions),
            "--out",
            str(tmp / "r.jsonl"),
            *run_flags(),
            "--env-rate-store",
            url,
        ],
        "serve": ["serve", "--port", "0", *run_flags(), "--env-rate-store", url],
        "env-pool member": [
            "batch",
            str(questions),
            "--out",
            str(tmp / "r.jsonl"),
            *run_flags(),
            "--env-pool",
            str(pool),
        ],  # fmt: skip
        "training recipe": ["train", "--config", str(recipe)],
    }


@pytest.mark.parametrize("surface", ["run", "batch", "serve", "env-pool member", "training recipe"])
@pytest.mark.parametrize(("url", "message"), [BAD_STORES[0], BAD_STORES[1], BAD_STORES[2], BAD_STORES[4],
                                              BAD_STORES[5], BAD_STORES[-1]])  # fmt: skip
def test_a_malformed_store_url_is_one_line_with_exit_2_on_every_command(
    surface, url, message, tmp_path, capsys
):
    argv = _surfaces(url, tmp_path)[surface]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert message in line and len(line) < 300, line
    assert "hunter2" not in line
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "out").exists()


def test_a_long_url_is_shown_by_a_short_prefix_and_never_with_its_user_part():
    with pytest.raises(ConfigError) as caught:
        check_store_url(LONG)
    assert "'redis://hhhhhhhh" in str(caught.value) and "h" * 80 not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        check_store_url("redis://alice:hunter2@127.0.0.1:6379/0#frag")
    assert "hunter2" not in str(caught.value) and "alice" not in str(caught.value)


def test_good_store_urls_pass_as_written():
    for url in ("memory", "redis://127.0.0.1:6379/0", "rediss://cache.example.com:6380/15", "redis://[::1]:6379",
                "redis://10.0.0.5/", "redis://alice@10.0.0.5:6379/2"):  # fmt: skip
        assert check_store_url(url) == url


def test_a_user_without_a_password_is_named_as_such(monkeypatch, capsys):
    monkeypatch.delenv("PROMPT_R1_RATE_STORE_PASSWORD", raising=False)
    url = f"redis://alice@127.0.0.1:{dead_port()}/0"
    assert main(["run", "q", *run_flags(), "--env-rate-store", url]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "names a user but PROMPT_R1_RATE_STORE_PASSWORD is not set" in line, line
    # With the password set, the same URL is only a store that does not answer (exit 3), the password unshown.
    monkeypatch.setenv("PROMPT_R1_RATE_STORE_PASSWORD", "pw-not-printed")
    assert main(["run", "q", *run_flags(), "--env-rate-store", url]) == 3
    err = capsys.readouterr().err
    assert "pw-not-printed" not in err and "alice" not in err
    reset_shared_limiters()


# ---- shards, staleness, a boolean, train's usage -------------------------------------------------------------


def test_a_billion_shards_are_refused_at_once(tmp_path, capsys):
    from prompt_r1.runs.shards import MAX_SHARDS

    started = time.monotonic()
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "a", "question": "A?"}\n')
    merge = ["batch-merge", str(questions), "--out", str(tmp_path / "m.jsonl"), "--shards"]
    assert main([*merge, "1000000000"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"--shards: must be an integer ≥ 1 and ≤ {MAX_SHARDS}, got 1000000000" in line, line
    assert (
        main(
            [
                "batch",
                str(tmp_path / "q.jsonl"),
                "--out",
                str(tmp_path / "r.jsonl"),
                "--shard",
                "1/1000000000",
            ]
        )
        == 2
    )
    assert f"N between 1 and {MAX_SHARDS}" in one_error_line(capsys.readouterr().err)
    # The most shards allowed, none written yet: one short line, not a thousand paths.
    assert main([*merge, str(MAX_SHARDS)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"missing shard files ({MAX_SHARDS} of {MAX_SHARDS})" in line
        and "and 997 more" in line
        and len(line) < 400
    )
    assert time.monotonic() - started < 5


def test_a_staleness_of_ten_to_the_twelve_is_refused_with_its_range(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"async: true\nmax_staleness: 1000000000000\nuse_cpu: true\nbf16: false\noutput_dir: '{tmp_path / 'o'}'\n"
    )
    assert main(["train", "--config", str(recipe)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "max_staleness must be an integer ≥ 0 and ≤ 1000, got 1000000000000" in line, line
    assert main(["train", "--config", str(recipe), "--max_staleness", "1e12"]) == 2  # not an integer's text
    assert "--max_staleness/--max-staleness: must be an integer ≥ 0 and ≤ 1000, got '1e12'" in one_error_line(
        capsys.readouterr().err
    )


def test_a_bad_number_to_train_is_one_line_and_where_to_get_help(tmp_path, capsys):
    assert main(["train", "--output_dir", str(tmp_path / "o"), "--max_env_cost", "x"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == ("prompt-r1 train: error: argument --max_env_cost/--max-env-cost: invalid float value: 'x' "
                    "(see prompt-r1 train --help)")  # fmt: skip
    assert main(["train", "--help"]) == 0
    assert "--max_env_cost" in capsys.readouterr().out


@pytest.mark.parametrize("value", ['"yes"', '"false"', "1", "{}", "[true]"])
def test_include_usage_must_be_a_boolean(served, value):
    url, upstream = served
    before = len(upstream.requests_for("agent"))
    raw = f'{{{MESSAGES}, "stream": true, "stream_options": {{"include_usage": {value}}}}}'
    status, body = post(url, raw.encode())
    assert status == 400, body
    assert body["error"]["param"] == "stream_options.include_usage", body
    assert body["error"]["message"].startswith("`stream_options.include_usage` must be true or false, got ")
    assert len(upstream.requests_for("agent")) == before


# ---- every numeric and URL flag of every command -----------------------------------------------------------


def _flags(parser) -> list[tuple[str, str]]:
    """(flag, "number" or "url") for every option of `parser` that takes a number or a URL."""
    found = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:
            continue
        flag, dest = action.option_strings[0], action.dest
        kind = getattr(action.type, "__name__", "")
        if action.type in (int, float) or kind in ("integer", "number"):
            found.append((flag, "number"))
        elif dest.endswith(("base_url", "rate_store")):
            found.append((flag, "url"))
    return found


def _commands() -> dict[str, list[tuple[str, str]]]:
    from prompt_r1.cli.train import train_parser

    subs = next(a for a in build_parser()._actions if a.choices and "run" in a.choices).choices
    commands = {name: _flags(sub) for name, sub in subs.items()}
    commands["train"] = _flags(train_parser())
    return {name: flags for name, flags in commands.items() if flags}


COMMANDS = _commands()
CASES = [(command, flag, kind) for command, flags in COMMANDS.items() for flag, kind in flags]


def test_the_property_covers_every_command_with_such_flags():
    assert {"run", "batch", "batch-merge", "serve", "eval", "train"} <= set(COMMANDS)
    urls = {(c, f) for c, f, k in CASES if k == "url"}
    assert {("run", "--env-rate-store"), ("serve", "--agent-base-url"), ("train", "--env_rate_store")} <= urls
    assert len(CASES) > 150


numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        [
            "",
            " ",
            "1e12",
            "1e400",
            "-1e-400",
            "0x10",
            "1_000",
            "١٢",
            "+5",
            "-0",
            "3.0",
            "True",
            "nan",
            "-inf",
            "9" * 400,
            "1/0",
            "5\n6",
            "\x00",
        ]
    ),  # fmt: skip
    st.text(max_size=12),
)
urls = st.one_of(
    st.builds(
        "{}{}{}{}{}{}".format,
        st.sampled_from(["redis://", "rediss://", "http://", "https://", "unix://", "", "memory", "ftp://"]),
        st.sampled_from(["", "user@", "user:hunter2@", ":hunter2@", "@"]),
        st.sampled_from(
            ["127.0.0.1", "[::1]", "[::1", "localhost", "", "ho st", "h\u00e9", "h" * 300, "%00"]
        ),
        st.sampled_from(["", ":", f":{dead_port()}", ":notaport", ":99999", ":0", ":-1", ":1e3"]),
        st.sampled_from(["", "/", "/0", "/notadb", "/v1", "/" + "9" * 30, "/0/1"]),
        st.sampled_from(["", "?password=hunter2", "?db=1", "#f", "?", "\n"]),
    ),
    st.text(max_size=30),
)


class Hung(BaseException):
    """Raised in the command by the alarm: a BaseException, so that no `except Exception` of the CLI takes it."""


def _base_argv(command: str, tmp: Path) -> list[str]:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    questions = tmp / "q.jsonl"
    questions.write_text('{"id": "a", "question": "q?"}\n')
    return {
        "run": ["run", "q", *run_flags()],
        "batch": ["batch", str(questions), "--out", str(tmp / "r.jsonl"), *run_flags()],
        "batch-merge": ["batch-merge", "--out", str(tmp / "m.jsonl"), "--shards", "2"],
        "serve": ["serve", "--port", "0", *run_flags()],
        # An empty folder is no model: a good number gets as far as the model check, one line and exit 2, not a
        # server.
        "serve-model": ["serve-model", str(model), "--port", "0"],
        "eval": ["eval", "--dataset", "hotpot", "--out", str(tmp / "e"), "--limit", "1", *run_flags()],
        "train": [
            "train",
            "--output_dir",
            str(tmp / "out"),
            "--use_cpu",
            "true",
            "--bf16",
            "false",
            "--model_name_or_path",
            str(model),
            "--env_base_url",
            DEAD,
        ],  # fmt: skip
    }[command]


def _probe(command: str, flag: str, value: str, seconds: float = 10.0) -> None:
    """Run the command in this process with `flag=value`: it must end, within `seconds`, in exit 0, or one line
    and exit 2 or 3."""

    def hung(signum, frame):
        raise Hung(f"{command} {flag}={value!r} still running after {seconds} s")

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        argv = [*_base_argv(command, Path(tmp)), f"{flag}={value}"]
        err, out = io.StringIO(), io.StringIO()
        previous = signal.signal(signal.SIGALRM, hung)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                code = main(argv)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            reset_shared_limiters()
    text = err.getvalue()
    assert "Traceback" not in text, f"{argv}: {text}"
    assert code in (0, 2, 3), f"{argv}: exit {code}: {text}"
    if code:
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1, f"{argv}: {text}"
        assert "hunter2" not in lines[0], lines[0]


PROPERTY = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@settings(PROPERTY, max_examples=120)
@given(data=st.data())
def test_every_numeric_and_url_flag_ends_in_one_line_or_success(data):
    command, flag, kind = data.draw(st.sampled_from(CASES), label="flag")
    _probe(command, flag, data.draw(numbers if kind == "number" else urls, label="value"))


@pytest.mark.slow
@settings(PROPERTY, max_examples=3000, derandomize=False)
@given(data=st.data())
def test_every_numeric_and_url_flag_ends_in_one_line_or_success_many_examples(data):
    command, flag, kind = data.draw(st.sampled_from(CASES), label="flag")
    _probe(command, flag, data.draw(numbers if kind == "number" else urls, label="value"))


def test_train_async_with_no_vllm_server_answering_is_unreachable_exit_3(tmp_path, capsys):
    """Like every other endpoint that does not answer: one line, exit 3 (it was 2), before any model loads."""
    from prompt_r1.testing.servers import ScriptedServer, echo_environment

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        "{}"
    )  # a model folder as far as the checks go (an empty one is exit 2)
    with ScriptedServer({"env": echo_environment()}) as env:
        argv = ["train", "--async", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false",
                "--model_name_or_path", str(model), "--env_base_url", env.base_url, "--env_api_key_env", PROBE_KEY,
                "--vllm_server_base_url", DEAD.removesuffix("/v1")]  # fmt: skip
        assert main(argv) == 3
        assert env.counts == {}
    line = one_error_line(capsys.readouterr().err)
    assert "cannot reach the vLLM server at http://127.0.0.1:" in line, line
