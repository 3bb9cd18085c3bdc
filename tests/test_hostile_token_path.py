"""The token-exact served path (a served agent on vLLM's completions API, played by a scripted server with a real
tokenizer) under the same faults as the chat path: retries, keys that never show, huge replies, serve's trajectory,
and token ids or log-probabilities a served agent could not have given refused."""

from __future__ import annotations

import json

import pytest
from hostile_setup import ANSWER, KEY_ENV, PROMPT, no_key_in, run_args

from prompt_r1.agents.served import ServedAgent
from prompt_r1.cli.main import main
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment


@pytest.fixture(autouse=True)
def _keys(monkeypatch):
    for name, key in KEY_ENV.items():
        monkeypatch.setenv(name, key)


def token_server(tokenizer, *, fault_rule=None, token_ids=None) -> ScriptedServer:
    from prompt_r1.testing.servers import scripted_turns

    return ScriptedServer(
        {"env": echo_environment(), "agent": scripted_turns([PROMPT, ANSWER])},
        tokenizer=tokenizer,
        vllm_version="0.31.0",
        fault_rule=fault_rule,
        token_ids=token_ids,
    )


@pytest.fixture
def tiny_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.mark.parametrize("kind", [None, "html", "error-200", "drop", "500"])
def test_the_token_path_runs_and_retries_what_the_chat_path_retries(
    kind, tiny_tokenizer, tiny_model_path, capsys
):
    injected = []

    def once(model: str, body: dict) -> Fault | None:
        if kind and model == "agent" and not injected:
            injected.append(kind)
            return Fault(kind, retry_after=0.01)
        return None

    with token_server(tiny_tokenizer, fault_rule=once) as server:
        code = main(run_args(server, "--json", "--trajectory", "--agent-tokenizer", str(tiny_model_path)))
        agent_requests = server.requests_for("agent")
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["answer"] == "Paris"
    assert all("prompt" in r.body and isinstance(r.body["prompt"], list) for r in agent_requests)  # token ids
    assert payload["trajectory"] is not None and 0 in payload["trajectory"]["env_mask"]
    assert [r.fault for r in agent_requests] == ([kind] if kind else []) + [None, None]


def test_the_token_path_never_shows_a_key_a_server_echoed(tiny_tokenizer, tiny_model_path, capsys):
    with token_server(
        tiny_tokenizer, fault_rule=lambda model, body: Fault("echo-401") if model == "agent" else None
    ) as server:
        code = main(run_args(server, "--json", "--agent-tokenizer", str(tiny_model_path)))
    captured = capsys.readouterr()
    assert code == 1 and "Authorization: Bearer ***" in captured.err
    assert no_key_in(captured.out, captured.err)


def test_a_huge_reply_on_the_token_path_ends_the_episode_cleanly(tiny_tokenizer, tiny_model_path, capsys):
    with token_server(
        tiny_tokenizer, fault_rule=lambda model, body: Fault("huge") if model == "agent" else None
    ) as server:
        code = main(run_args(server, "--json", "--trajectory", "--agent-tokenizer", str(tiny_model_path)))
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["status"] in ("format_error", "context_overflow")
    assert len(payload["trajectory"]["completion_ids"]) <= 8192  # the token budget held


@pytest.mark.parametrize("stream", [False, True])
def test_serve_returns_the_trajectory_of_a_token_exact_served_agent_on_request(
    stream, tiny_tokenizer, tiny_model_path
):
    import urllib.request

    from prompt_r1.integrations.server import build_app, serving_in_thread

    with token_server(tiny_tokenizer) as upstream:
        environment = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=upstream.base_url), api_key="x"
        )
        config = AgentConfig(model="agent", base_url=upstream.base_url, tokenizer=str(tiny_model_path))
        agent = ServedAgent(config, api_key="x")
        with serving_in_thread(build_app(agent, environment)) as url:
            body = {
                "messages": [{"role": "user", "content": "Where?"}],
                "stream": stream,
                "prompt_r1_trajectory": True,
            }
            request = urllib.request.Request(
                url + "/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
    if stream:
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        extension = next(e["prompt_r1"] for e in events if "prompt_r1" in e)
    else:
        extension = json.loads(text)["prompt_r1"]
    trajectory = extension["trajectory"]
    assert len(trajectory["completion_ids"]) == len(trajectory["env_mask"]) == len(trajectory["logprobs"]) > 0
    assert 0 in trajectory["env_mask"] and trajectory["prompt_ids"]


def test_the_vllm_probe_sends_no_key(tiny_tokenizer, tiny_model_path):
    with token_server(tiny_tokenizer) as server:
        config = AgentConfig(
            model="agent",
            base_url=server.base_url,
            tokenizer=str(tiny_model_path),
            api_key_env="HOSTILE_AGENT_KEY",
        )
        agent = ServedAgent(config)
        assert agent.tokenizer is not None  # recognised as vLLM
        assert server.version_headers and all("Authorization" not in h for h in server.version_headers)


@pytest.mark.parametrize(
    ("rewrite", "said"),
    [
        (lambda ids: [*ids, 10**9], "ids outside the tokenizer's"),  # an id no tokenizer of this model has
        (lambda ids: [-1, *ids], "ids outside the tokenizer's"),
        (lambda ids: ids * 400, "for a budget of"),  # more ids than the turn's max_tokens
        (lambda ids: [*ids[:-1], "7"], "ids outside the tokenizer's"),  # not an int
        (lambda ids: None, "returned no token ids"),  # a proxy that drops return_token_ids' field
    ],
)
def test_token_ids_a_served_agent_could_not_have_sampled_are_refused_not_kept(
    rewrite, said, tiny_tokenizer, tiny_model_path, capsys
):
    with token_server(tiny_tokenizer, token_ids=rewrite) as server:
        code = main(run_args(server, "--json", "--trajectory", "--agent-tokenizer", str(tiny_model_path)))
    captured = capsys.readouterr()
    assert code == 1 and said in captured.err and captured.out == ""


def test_a_served_agent_without_log_probabilities_is_refused_not_given_placeholders(
    tiny_tokenizer, tiny_model_path, capsys
):
    """The token path keeps the sampled tokens' log-probabilities for training (the async trainer divides by
    them): a server that sends none fails the run in one line instead of filling in 0.0 ("certain")."""
    from prompt_r1.testing.servers import scripted_turns

    with ScriptedServer(
        {"env": echo_environment(), "agent": scripted_turns([PROMPT, ANSWER])},
        tokenizer=tiny_tokenizer,
        vllm_version="0.31.0",
        token_logprobs=False,
    ) as server:
        code = main(run_args(server, "--json", "--trajectory", "--agent-tokenizer", str(tiny_model_path)))
    captured = capsys.readouterr()
    assert code == 1 and "but no log-probabilities" in captured.err and captured.out == ""
