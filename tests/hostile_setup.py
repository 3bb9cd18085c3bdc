"""What the misbehaving-server tests share (tests/test_hostile_servers.py, test_hostile_outputs.py,
test_hostile_token_path.py): the two keys that must never show, the `prompt-r1 run` command line that reads them,
and the check that no output holds either."""

from __future__ import annotations

from prompt_r1.testing.servers import ScriptedServer

AGENT_KEY = "sk-agent-hostile-7c1d94e2"
ENV_KEY = "sk-env-hostile-0b8a33f5"
KEY_ENV = {"HOSTILE_AGENT_KEY": AGENT_KEY, "HOSTILE_ENV_KEY": ENV_KEY}  # where the runs read them from
PROMPT = "<think>t</think><interaction_prompt>p</interaction_prompt>"
ANSWER = "<think>f</think><answer>Paris</answer>"


def run_args(server: ScriptedServer, *extra: str, question: str = "Where?") -> list[str]:
    """`prompt-r1 run QUESTION` with the agent and the environment on `server`, each with its key, quick retries."""
    return [
        "run", question, "--agent-model", "agent", "--agent-base-url", server.base_url,
        "--agent-api-key-env", "HOSTILE_AGENT_KEY", "--env-model", "env", "--env-base-url", server.base_url,
        "--env-api-key-env", "HOSTILE_ENV_KEY", "--env-backoff-initial", "0.01", "--env-backoff-max", "0.02",
        *extra,
    ]  # fmt: skip


def no_key_in(*texts: str | bytes) -> bool:
    """Neither key is in any of `texts`."""
    return all(
        key not in (t.decode("utf-8", "replace") if isinstance(t, bytes) else t)
        for t in texts
        for key in (AGENT_KEY, ENV_KEY)
    )
