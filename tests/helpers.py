"""What many test files do the same way: run the CLI (in this process or as a real process), wait for something a
process or server does, write a questions file, and build the tiny GRPO run's config.

Imported as `from helpers import …` (pytest puts tests/ on sys.path, as for `from conftest import …`). Fixtures
live in conftest.py; plain functions live here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# An address where nothing listens: a config that must name an environment, for tests that never call it.
UNREACHABLE_URL = "http://127.0.0.1:9/v1"

# The tiny GRPO run every training test starts from (prompt_r1.testing.tiny_grpo); `tiny_grpo_config` (conftest)
# binds the test's own output folder.
from prompt_r1.testing.tiny_grpo import TINY_GRPO  # noqa: E402


def load_script(path: Path, name: str) -> Any:
    """A script (a benchmark, the LangGraph app) as a new module, run from the top: its per-process state starts
    empty."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_grpo_config(
    output_dir: Path, model: Path | str = "unused", env_base_url: str = UNREACHABLE_URL, **overrides: Any
) -> Any:
    """The tiny run's config (`TINY_GRPO` plus `overrides`), built and so checked by the trainer's own config class:
    `PromptR1GRPOConfig`, or `PromptR1AsyncGRPOConfig` with `async_grpo=True` (`training.run.trainer_config`)."""
    from prompt_r1.training.run import trainer_config

    values = {
        **TINY_GRPO,
        "output_dir": str(output_dir),
        "model_name_or_path": str(model),
        "env_base_url": env_base_url,
        **overrides,
    }
    return trainer_config(**values)


def tiny_train_args(
    model: Path | str, env_base_url: str, train_data: Path, output_dir: Path, *extra: object
) -> list[str]:
    """`prompt-r1 train`'s arguments for the tiny run from the command line: training/configs/tiny-cpu.yaml with this
    model, data, environment and output folder, on TINY_GRPO's budgets (24 tokens a turn, 96 an episode)."""
    return [
        "train", "--config", str(ROOT / "training/configs/tiny-cpu.yaml"), "--model_name_or_path", str(model),
        "--train_data", str(train_data), "--env-base-url", env_base_url,
        "--max_turn_tokens", str(TINY_GRPO["max_turn_tokens"]), "--max_total_tokens", str(TINY_GRPO["max_total_tokens"]),
        "--output_dir", str(output_dir), *map(str, extra),
    ]  # fmt: skip


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a process that must be told its port, not pick one)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], object], what: str = "condition", timeout: float = 90.0) -> None:
    """Poll `predicate` until it is true; fail naming `what` after `timeout` seconds (generous: the machine that runs
    the tests may be loaded, and a process's start-up imports alone can take seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---- the CLI ------------------------------------------------------------------------------------------------


def run_cli(args: Sequence[object]) -> tuple[int, str, str]:
    """`prompt-r1 ARGS` in this process: (exit code, stdout, stderr). The CLI writes through `sys.stdout` and
    `sys.stderr` as they are when it runs, so both are captured here whatever pytest captures around it."""
    from prompt_r1.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def cli_command(args: Sequence[object]) -> list[str]:
    """The command line of `prompt-r1 ARGS` in a process of its own, with this interpreter."""
    return [sys.executable, "-m", "prompt_r1", *map(str, args)]


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    # Unbuffered: a test that waits for a line in the log sees it when it is printed, not at exit.
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def run_cli_process(
    args: Sequence[object], *, timeout: float, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`prompt-r1 ARGS` as a real process, run to its end: its exit code, stdout and stderr (text)."""
    return subprocess.run(
        cli_command(args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=_environ(env)
    )


def accelerate_launch(args: Sequence[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """`accelerate launch ARGS` run to its end, on a free port (not accelerate's fixed 29500, which another launch
    on the machine may hold), one thread per process."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    accelerate = Path(sys.executable).parent / "accelerate"
    return subprocess.run(
        [str(accelerate), "launch", "--main_process_port", str(free_port()), *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def failure_lines(stderr: str) -> str:
    """The lines of a failed launch that say why, without the progress bars and deprecation warnings."""
    noise = ("it/s]", "s/it]", "Warning", "warnings.warn", "return func(")
    lines = [line for line in stderr.splitlines() if line.strip() and not any(n in line for n in noise)]
    return "\n".join(lines[-60:])


def spawn(
    command: Sequence[str], log: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `command` (any program) as a real process with stdout and stderr going to `log`; the caller waits for it
    (`finish`) or signals it."""
    with log.open("w") as handle:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            list(command), cwd=cwd, env=_environ(env), stdout=handle, stderr=subprocess.STDOUT
        )


def spawn_cli(
    args: Sequence[object], log: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `prompt-r1 ARGS` as a real process, its output going to `log`."""
    return spawn(cli_command(args), log, cwd=cwd, env=env)


# ---- data files ---------------------------------------------------------------------------------------------


def write_questions(path: Path, n: int, *, start: int = 0) -> Path:
    """A JSONL questions file: ids q{start}…, "What is item i?", answer "item i"."""
    rows = (
        {"id": f"q{i}", "question": f"What is item {i}?", "answer": f"item {i}"}
        for i in range(start, start + n)
    )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_name_dataset(path: Path, n: int) -> Path:
    """A JSONL training set of `n` rows of the name task (conftest's NAME_QUESTION, golden answer Ada)."""
    from conftest import NAME_QUESTION

    rows = ({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]} for i in range(n))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def name_rows(n: int) -> list[dict]:
    """`n` training rows of the name task as the trainer takes them: the question's chat messages, golden Ada."""
    from conftest import NAME_QUESTION

    from prompt_r1.core.prompts import question_message

    return [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ] * n


def name_environment(**options: Any) -> Any:
    """A scripted server whose environment ("env") always answers the name task's NAME_RESPONSE."""
    from conftest import NAME_RESPONSE

    from prompt_r1.testing.servers import ScriptedServer

    return ScriptedServer({"env": lambda body: NAME_RESPONSE}, **options)


# The largest log-probability gap between an engine (vLLM) and the model that counts as equal (float32 on CPU:
# ~1e-5).
LOGPROB_GAP = 1e-3

# A greedy agent's settings: the same ids every run, whichever backend samples them.
GREEDY = dict(temperature=0.0, max_new_tokens=40)


def greedy_transformers_agent(model: Path) -> Any:
    """The `transformers` backend on `model`, greedy: the reference other backends' episodes are compared with."""
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.core.config import AgentConfig

    return TransformersAgent(AgentConfig(model=str(model), backend="transformers", **GREEDY))


def name_episodes(agent: Any, server: Any, n: int) -> list[dict]:
    """`n` concurrent episodes of the name question by `agent` (the paper's protocol, two turns) against `server`'s
    environment: the final graph states."""
    import asyncio

    from conftest import NAME_QUESTION

    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import EnvironmentConfig, LoopConfig
    from prompt_r1.loop.graph import build_graph

    environment = EnvironmentClient(
        EnvironmentConfig(model="env", base_url=server.base_url), api_key="unused"
    )
    graph = build_graph(agent, environment, loop=LoopConfig(max_turns=2, max_total_tokens=200))

    async def run() -> list[dict]:
        return await asyncio.gather(*(graph.ainvoke({"question": NAME_QUESTION}) for _ in range(n)))

    return asyncio.run(run())


def release_name_episodes(*agents: Any) -> list[dict]:
    """One episode of the name question under the release protocol per agent, against the same environment."""
    import asyncio

    from conftest import NAME_QUESTION

    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import EnvironmentConfig, LoopConfig
    from prompt_r1.loop.graph import build_graph

    loop = LoopConfig(protocol="release", max_turns=2, max_total_tokens=3000)
    with name_environment() as server:
        environment = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=server.base_url), api_key="unused"
        )
        graphs = [build_graph(agent, environment, loop=loop) for agent in agents]
        return [asyncio.run(graph.ainvoke({"question": NAME_QUESTION})) for graph in graphs]


def check_builtin_adapter(adapter: Path) -> None:
    """`adapter` is a LoRA adapter folder of the built-in model: the agent loader takes it as a model (with the
    built-in's chat tokens), and it loads onto the built-in model's weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.agents.local import load_transformers_model

    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    model, tokenizer = load_transformers_model(str(adapter), device="cpu")
    assert any("lora_A" in name for name, _ in model.named_parameters())
    assert tokenizer.eos_token == "<|im_end|>"
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m")), adapter
    )
    assert {n for n, _ in tuned.named_parameters() if "lora_" in n}


def pool_words(pool: str) -> set[str]:
    """Every word of the notes task's name pool `pool` (prompt_r1.tasks.notes.POOLS: train or eval)."""
    from prompt_r1.tasks.notes import POOLS

    return {w for words in POOLS[pool].values() for w in words}


def rows_of(path: Path) -> list[dict]:
    """The JSON rows of a JSONL file, blank lines skipped."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def async_tiny_config(tmp_path: Path, **overrides):
    """The tiny run's config (`tiny_grpo_config`) at 8 episodes a step, as the async GRPO tests use it;
    `async_grpo=True` gives the async trainer's (`trainer_config`)."""
    settings = dict(
        per_device_train_batch_size=8, num_generations=8, max_steps=3, learning_rate=1e-4, bf16=False
    )
    return tiny_grpo_config(tmp_path / "out", **{**settings, **overrides})
