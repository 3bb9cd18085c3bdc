"""`vllm serve` (vLLM's CPU build) as a token-exact served agent, under both protocols, and as TRL's server-mode
policy with its weights synced through a file. One server for the module; the in-process agent and TRL's
colocated engine: tests/test_vllm.py.

The tiny model has attention heads 64 wide, as vLLM's CPU attention requires (conftest's wide_head_model_path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed")
# The module's fixtures build a model and start vLLM's server; pytest's timeout counts them in a test's time.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

from conftest import NAME_QUESTION  # noqa: E402
from helpers import (  # noqa: E402
    GREEDY,
    LOGPROB_GAP,
    greedy_transformers_agent,
    name_environment,
    name_episodes,
    name_rows,
    release_name_episodes,
    rows_of,
    run_cli,
)

from prompt_r1.core.config import AgentConfig  # noqa: E402
from prompt_r1.testing.servers import ScriptedServer  # noqa: E402


@pytest.fixture(scope="module")
def vllm_server(wide_head_model_path, tmp_path_factory):
    """`vllm serve` of the wide-head model on 127.0.0.1 (vLLM's OpenAI-compatible server, CPU build), in dev mode
    with the project's worker extension, as server-mode training on CPU starts it. Yields its /v1 URL."""
    from prompt_r1.testing.vllm_process import start_vllm_server, stop_vllm_server
    from prompt_r1.training.shared.vllm_reload import SERVER_EXTENSION

    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    # /collective_rpc: the weight sync without CUDA; the KV cache gets an explicit size (start_vllm_server), as
    # the README says to on CPU.
    root, process = start_vllm_server(
        wide_head_model_path,
        log,
        timeout=300,
        flags=f"--dtype float32 --worker-extension-cls {SERVER_EXTENSION}",
    )
    yield f"{root}/v1"
    stop_vllm_server(process)


def test_a_served_agent_on_vllm_is_token_exact(vllm_server, wide_head_model_path):
    from prompt_r1.agents.served import ServedAgent

    served = ServedAgent(
        AgentConfig(model="agent", base_url=vllm_server, tokenizer=str(wide_head_model_path), **GREEDY),
        api_key="unused-key",
    )
    assert served.tokenizer is not None and "completions API" in served.token_exact
    local = greedy_transformers_agent(wide_head_model_path)
    with name_environment() as server:
        ours = name_episodes(served, server, 2)
        theirs = name_episodes(local, server, 1)[0]
    assert theirs["status"] == "answered"
    for episode in ours:
        assert episode["completion_ids"] == theirs["completion_ids"]
        assert episode["env_mask"] == theirs["env_mask"]
        for mine, other in zip(episode["logprobs"], theirs["logprobs"], strict=True):
            assert abs(mine - other) < LOGPROB_GAP


def test_a_served_vllm_agent_under_the_release_protocol_is_token_exact(vllm_server, wide_head_model_path):
    """--protocol release through vLLM's completions API: the release's first prompt, no stop strings, and the
    same ids, turn after turn, as the transformers backend on the same weights."""
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.loop.protocols import release

    served = ServedAgent(
        AgentConfig(model="agent", base_url=vllm_server, tokenizer=str(wide_head_model_path), **GREEDY),
        api_key="unused-key",
    )
    local = greedy_transformers_agent(wide_head_model_path)
    ours, theirs = release_name_episodes(served, local)
    assert ours["prompt_ids"] == release.first_prompt_ids(local.tokenizer, NAME_QUESTION)
    assert ours["completion_ids"] == theirs["completion_ids"] and ours["env_mask"] == theirs["env_mask"]
    for mine, other in zip(ours["logprobs"], theirs["logprobs"], strict=True):
        assert abs(mine - other) < LOGPROB_GAP


def test_a_served_agent_takes_the_tokenizer_from_where_vllm_loaded_the_model(
    vllm_server, wide_head_model_path
):
    from prompt_r1.agents.served import ServedAgent

    config = AgentConfig(model="agent", base_url=vllm_server, token_exact="on")
    served = ServedAgent(config, api_key="unused-key")
    assert served.tokenizer is not None and "completions API" in served.token_exact
    assert served.tokenizer.name_or_path == str(wide_head_model_path)


def test_run_json_prints_the_trajectory_of_a_served_vllm_agent(vllm_server, wide_head_model_path):
    with name_environment() as server:
        argv = [
            "run", NAME_QUESTION, "--json", "--trajectory", "--agent-model", "agent",
            "--agent-base-url", vllm_server, "--agent-tokenizer", str(wide_head_model_path),
            "--agent-temperature", "0", "--agent-max-new-tokens", "40",
            "--env-model", "env", "--env-base-url", server.base_url, "--max-turns", "2",
        ]  # fmt: skip
        code, out, _ = run_cli(argv)
        assert code == 0
        code, off, _ = run_cli([*argv, "--agent-token-exact", "off"])
        assert code == 0
    exact, chat = (json.loads(line) for line in (out + off).splitlines())
    trajectory = exact["trajectory"]
    assert len(trajectory["completion_ids"]) == len(trajectory["env_mask"]) == len(trajectory["logprobs"])
    assert 0 in trajectory["env_mask"] and exact["drift"]["checked"] is True
    assert chat["trajectory"] is None and "turned off" in chat["trajectory_reason"]
    assert [t["text"] for t in chat["turns"]] == [t["text"] for t in exact["turns"]]


def test_trl_server_mode_generation_through_our_policy_on_vllms_own_server(vllm_server, wide_head_model_path):
    """TRL 1.16's server mode generates through vLLM's standard /v1/completions (token-id prompts, return_token_ids),
    which `vllm serve` has without its dev mode; only the weight sync needs the dev-mode endpoints and NCCL (CUDA)."""
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    from prompt_r1.training.sync.policy import VLLMServerPolicy

    tokenizer = AutoTokenizer.from_pretrained(wide_head_model_path)
    client = VLLMClient(base_url=vllm_server.removesuffix("/v1"), connection_timeout=30)
    policy = VLLMServerPolicy(client, tokenizer, {"temperature": 0.0}, max_new_tokens=40)
    local = greedy_transformers_agent(wide_head_model_path)
    with name_environment() as server:
        ours = name_episodes(policy, server, 3)
        theirs = name_episodes(local, server, 1)[0]
    for episode in ours:  # stop strings honoured, ids and log-probabilities aligned, the environment masked
        assert episode["completion_ids"] == theirs["completion_ids"]
        assert episode["env_mask"] == theirs["env_mask"]
        for mine, other in zip(episode["logprobs"], theirs["logprobs"], strict=True):
            assert abs(mine - other) < LOGPROB_GAP

    # The same under the release protocol: no stop strings, the release's first prompt, the same ids.
    ours, theirs = release_name_episodes(policy, local)
    assert ours["prompt_ids"] == theirs["prompt_ids"]
    assert ours["completion_ids"] == theirs["completion_ids"] and ours["env_mask"] == theirs["env_mask"]


def test_server_mode_grpo_steps_on_cpu_sync_the_servers_weights_through_a_file(
    vllm_server, wide_head_model_path, colocate_config
):
    """TRL's server-mode sync needs NCCL; without CUDA the trainer writes the weights to a file and the server
    reloads them through /collective_rpc. After every sync the server computes what the trained model computes.
    Runs last in the module: the server's weights are put back afterwards for anything that follows."""
    import torch

    from prompt_r1.training.shared.vllm_reload import post_json
    from prompt_r1.training.sync.trainer import build_trainer

    root = vllm_server.removesuffix("/v1")
    rows = name_rows(1)
    try:
        with name_environment() as server:
            config = colocate_config(
                wide_head_model_path,
                server,
                vllm_mode="server",
                vllm_server_base_url=root,
                max_steps=2,
                # The first group's rewards can all be equal (a zero advantage: no gradient); weight decay moves
                # the weights at every step all the same, so the second sync always has new weights to carry.
                weight_decay=1.0,
            )
            trainer = build_trainer(config, train_rows=rows * 16)
            assert trainer.vllm_generation.vllm_client.communicator is None  # no NCCL group was joined
            before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            trainer.train()
        assert trainer.state.global_step == 2
        assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
        synced = rows_of(Path(config.output_dir) / "vllm_sync.jsonl")
        assert [r["step"] for r in synced] == [0, 1]
        assert all(r["gap"] < LOGPROB_GAP for r in synced), synced
        assert synced[0]["model_logprob_sum"] != synced[1]["model_logprob_sum"], "the weights never changed"
        assert synced[0]["engine_logprob_sum"] != synced[1]["engine_logprob_sum"], "the server never changed"
    finally:
        original = str(wide_head_model_path / "model.safetensors")
        post_json(f"{root}/collective_rpc", {"method": "prompt_r1_reload_weights", "args": [original]}, 600)
        post_json(f"{root}/reset_prefix_cache", {}, 60)


def test_server_mode_without_the_file_route_names_the_command_that_gives_it():
    from trl.generation.vllm_client import VLLMClient

    from prompt_r1.core.errors import ConfigError
    from prompt_r1.training.sync.weight_sync import file_weight_route

    with ScriptedServer({}) as server, file_weight_route():  # a server with no /collective_rpc
        client = VLLMClient.__new__(VLLMClient)
        client.base_url = server.base_url.removesuffix("/v1")
        with pytest.raises(
            ConfigError, match="VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls"
        ):
            client.init_communicator(device="cpu")
