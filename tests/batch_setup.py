"""What the `prompt-r1 batch` tests share (tests/test_batch.py, tests/test_batch_inputs.py): the API key they run
with, the command line and the environment settings against one scripted server, and what the scripted agent answers.
Generic helpers (questions files, rows, processes, waiting) are in helpers.py."""

from __future__ import annotations

from pathlib import Path

from prompt_r1.agents.served import ServedAgent
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.testing.servers import ScriptedServer

SECRET = "sk-batch-test-5f2c9e71d0"
KEY_ENV = {"BATCH_TEST_KEY": SECRET}  # the environment variable the runs read their key from
FAULTS = {"429": 0.10, "500": 0.05, "timeout": 0.02, "drop": 0.01, "malformed": 0.01}


def expected_answer(i: int) -> str:
    """What relay_agent() answers after echo_environment() replied to its second prompt."""
    return f"Response 2: What is item {i}? / part 2"


def env_config(server: ScriptedServer, **overrides) -> EnvironmentConfig:
    """The environment on `server`, quick to retry (a test's faults pass in a fraction of a second)."""
    settings = dict(
        model="env",
        base_url=server.base_url,
        api_key_env="BATCH_TEST_KEY",
        rate_limit=1000,
        rate_period=1.0,
        max_in_flight=64,
        timeout=5.0,
        max_retries=10,
        backoff_initial=0.02,
        backoff_max=0.2,
    )
    settings.update(overrides)
    return EnvironmentConfig(**settings)


def served_agent(server: ScriptedServer) -> ServedAgent:
    """The served agent on `server`."""
    return ServedAgent(AgentConfig(model="agent", base_url=server.base_url, api_key_env="BATCH_TEST_KEY"))


def cli_args(server_url: str, inp: Path, out: Path, *extra: str) -> list[str]:
    """`prompt-r1 batch INP --out OUT` with the agent and the environment on one server, quick retries."""
    return [
        "batch",
        str(inp),
        "--out",
        str(out),
        "--agent-model",
        "agent",
        "--agent-base-url",
        server_url,
        "--agent-api-key-env",
        "BATCH_TEST_KEY",
        "--env-model",
        "env",
        "--env-base-url",
        server_url,
        "--env-api-key-env",
        "BATCH_TEST_KEY",
        "--env-backoff-initial",
        "0.02",
        "--env-backoff-max",
        "0.2",
        "--no-progress",
        *extra,
    ]


def line_count(path: Path) -> int:
    """The rows written so far (0 before the file exists)."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def search_environment(body: dict) -> str:
    """Proposes one instruction to the optimiser, answers every task request."""
    text = body["messages"][-1]["content"]
    return (
        "<INS>Think, then answer.</INS>"
        if text.startswith("Your task is to generate")
        else "<answer>x</answer>"
    )
