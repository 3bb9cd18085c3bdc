"""The vLLM paths on vLLM's CPU build: the in-process agent; TRL's colocated engine as the GRPO rollout policy
(one process, and two DeepSpeed ZeRO-2 processes under accelerate launch) with an exact weight sync; `vllm serve`
as a token-exact served agent and as TRL's server-mode policy, its weights synced through a file.

The tiny model here has attention heads 64 wide, as vLLM's CPU attention requires (32, 64 or 128)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed")
# The module's fixtures build a model and start vLLM's server; pytest's timeout counts them in a test's time.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

from conftest import NAME_QUESTION, NAME_RESPONSE, NAME_TURN_1, NAMES  # noqa: E402

from prompt_r1.clients.environment import EnvironmentClient  # noqa: E402
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig  # noqa: E402
from prompt_r1.loop.graph import build_graph  # noqa: E402
from prompt_r1.testing.servers import ScriptedServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GAP = (
    1e-3  # largest log-probability gap between engine and model that counts as equal (float32 on CPU: ~1e-5)
)


@pytest.fixture(scope="session")
def wide_head_model_path(tmp_path_factory) -> Path:
    """The name task's protocol model (see conftest) with 2 heads of 64 on a hidden size of 128."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    episodes = [
        (NAME_QUESTION, NAME_TURN_1, NAME_RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
    ]
    path = tmp_path_factory.mktemp("wide-head") / "model"
    return build_protocol_model(path, episodes, hidden_size=128, heads=2, kv_heads=1, steps=120)


def _greedy_vllm_flags(model: Path, server: ScriptedServer) -> list[str]:
    """The run/batch flags of a greedy two-turn episode with the in-process vLLM agent."""
    return [
        "--agent-model", str(model), "--agent-backend", "vllm", "--agent-temperature", "0",
        "--agent-max-new-tokens", "40", "--env-model", "env", "--env-base-url", server.base_url, "--max-turns", "2",
    ]  # fmt: skip


def _release_episodes(*agents) -> list[dict]:
    """One episode of the name question under the release protocol per agent, against the same environment."""
    loop = LoopConfig(protocol="release", max_turns=2, max_total_tokens=3000)
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        environment = EnvironmentClient(
            EnvironmentConfig(model="env", base_url=server.base_url), api_key="unused"
        )
        graphs = [build_graph(agent, environment, loop=loop) for agent in agents]
        return [asyncio.run(graph.ainvoke({"question": NAME_QUESTION})) for graph in graphs]


def _episodes(agent, server: ScriptedServer, n: int) -> list[dict]:
    environment = EnvironmentClient(
        EnvironmentConfig(model="env", base_url=server.base_url), api_key="unused"
    )
    graph = build_graph(agent, environment, loop=LoopConfig(max_turns=2, max_total_tokens=200))

    async def run() -> list[dict]:
        return await asyncio.gather(*(graph.ainvoke({"question": NAME_QUESTION}) for _ in range(n)))

    return asyncio.run(run())


def test_greedy_episodes_are_token_for_token_those_of_the_transformers_backend(
    wide_head_model_path, tmp_path
):
    """`prompt-r1 batch --agent-backend vllm` in a process of its own (an in-process async engine would outlive the
    test), against episodes of the `transformers` backend here."""
    from prompt_r1.agents.local import TransformersAgent

    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": NAME_QUESTION}) + "\n" for i in range(3))
    )
    out = tmp_path / "r.jsonl"
    local = TransformersAgent(
        AgentConfig(
            model=str(wide_head_model_path), backend="transformers", temperature=0.0, max_new_tokens=40
        )
    )
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "prompt_r1",
                "batch",
                str(questions),
                "--out",
                str(out),
                "--no-progress",
                *_greedy_vllm_flags(wide_head_model_path, server),
                "--max-total-tokens",
                "200",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
        theirs = _episodes(local, server, 1)[0]
    assert done.returncode == 0, done.stderr[-3000:]
    assert theirs["status"] == "answered" and theirs["usage"]["env_calls"] == 1  # a whole two-turn episode
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        trajectory = row["trajectory"]
        assert trajectory["prompt_ids"] == theirs["prompt_ids"]
        assert trajectory["completion_ids"] == theirs["completion_ids"]
        assert trajectory["env_mask"] == theirs["env_mask"]
        assert [t["text"] for t in row["turns"]] == [t["text"] for t in theirs["turns"]]
        # The same kind of log-probabilities: the sampled tokens' own, 0 for the environment's tokens.
        pairs = zip(trajectory["logprobs"], theirs["logprobs"], trajectory["env_mask"], strict=True)
        for mine, other, mask in pairs:
            assert abs(mine - other) < GAP if mask else mine == other == 0.0


def test_eval_with_the_vllm_backend_scores_the_same_episodes(wide_head_model_path, tmp_path):
    """`prompt-r1 eval --agent-backend vllm` on a dataset file: the loop's method and the agent alone, greedy, give
    the answers the transformers backend gives."""
    from prompt_r1.agents.local import TransformersAgent

    dataset = tmp_path / "names.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(2)
        )
    )
    out = tmp_path / "eval"
    local = TransformersAgent(
        AgentConfig(
            model=str(wide_head_model_path), backend="transformers", temperature=0.0, max_new_tokens=40
        )
    )
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "prompt_r1",
                "eval",
                "--dataset",
                str(dataset),
                "--method",
                "prompt-r1",
                "--method",
                "agent-only",
                "--out",
                str(out),
                "--no-progress",
                "--no-chart",
                *_greedy_vllm_flags(wide_head_model_path, server),
                "--max-total-tokens",
                "200",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
        theirs = _episodes(local, server, 1)[0]
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted((r["method"], r["id"]) for r in rows) == [
        ("agent-only", "n0"), ("agent-only", "n1"), ("prompt-r1", "n0"), ("prompt-r1", "n1")
    ]  # fmt: skip
    for row in rows:
        assert row["status"] not in ("internal_error", "agent_error", "environment_error"), row
    loop = [r for r in rows if r["method"] == "prompt-r1"]
    assert all(r["prediction"] == theirs["answer"] for r in loop), (loop, theirs["answer"])
    assert (out / "summary.csv").exists()


def test_run_json_with_the_vllm_backend_prints_only_json_on_stdout(wide_head_model_path, tmp_path):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "prompt_r1",
                "run",
                NAME_QUESTION,
                "--json",
                *_greedy_vllm_flags(wide_head_model_path, server),
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=400,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(done.stdout)  # the whole of stdout is the one JSON object
    assert payload["status"] == "answered" and payload["answer"] in NAMES
    assert "Loading safetensors checkpoint shards" in done.stderr  # vLLM's own output went to stderr


# ---- TRL's colocated engine ------------------------------------------------------------------------------------


def _colocate_config(tmp_path: Path, model: Path, server: ScriptedServer, **overrides):
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    settings = dict(
        output_dir=str(tmp_path / "run"),
        model_name_or_path=str(model),
        env_model="env",
        env_base_url=server.base_url,
        env_api_key_env="PROMPT_R1_TEST_NO_KEY",
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=3,
        max_turns=2,
        max_turn_tokens=24,
        max_total_tokens=96,
        learning_rate=1e-3,
        temperature=1.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_sync_check=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        bf16=False,
    )
    settings.update(overrides)
    return PromptR1GRPOConfig(**settings)


def _sync_rows(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "vllm_sync.jsonl").read_text().splitlines()]


@pytest.fixture
def own_process_group(monkeypatch):
    """TRL's colocated engine starts a process group in this process and sets RANK, LOCAL_RANK, WORLD_SIZE and
    MASTER_ADDR/PORT; the group's store keeps its port for the life of the process. It gets a free port of its own
    (not the default 29500 that a later test's `accelerate launch` binds), and the variables are removed afterwards
    so that later subprocesses do not take themselves for ranks of it."""
    import socket

    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    yield
    for name in names:
        os.environ.pop(name, None)


def test_colocated_vllm_rollouts_train_and_the_engine_follows_every_step(
    wide_head_model_path, tmp_path, own_process_group
):
    import torch

    from prompt_r1.core.prompts import question_message
    from prompt_r1.training.sync.trainer import build_trainer

    rows = [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ]
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = _colocate_config(tmp_path, wide_head_model_path, server)
        trainer = build_trainer(config, train_rows=rows * 16)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        assert trainer.state.global_step == 3
        assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())

        # The rollouts: per-request stop strings end the agent's turns, the engine's log-probabilities line up
        # with the sampled ids and are the trained model's, the environment's tokens are masked. (The last step
        # updated the model after its rollouts: the engine gets those weights as the next step would give them.)
        trainer.vllm_generation.sync_weights()
        episodes = trainer.rollout_func([r["prompt"] for r in rows * 4], trainer)
    tokenizer = trainer.processing_class
    model = trainer.model.eval()
    for prompt, ids, logprobs, mask in zip(
        episodes["prompt_ids"],
        episodes["completion_ids"],
        episodes["logprobs"],
        episodes["env_mask"],
        strict=True,
    ):
        assert len(ids) == len(logprobs) == len(mask) and 0 in mask and 1 in mask
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        for k, (token_logprob, masked) in enumerate(zip(logprobs, mask, strict=True)):
            if masked:
                assert abs(token_logprob - expected[k].item()) < GAP
            else:
                assert token_logprob == 0.0
        # A turn ends at one of its stop strings (asking, or answering at once), or at the turn's token limit.
        first_turn = tokenizer.decode(ids[: mask.index(0)])
        assert (
            first_turn.endswith(("</interaction_prompt>", "</answer>"))
            or len(ids[: mask.index(0)]) == config.max_turn_tokens
        ), first_turn

    # Every sync left the engine computing exactly what the trained model computes, and the weights moved.
    synced = _sync_rows(Path(config.output_dir))
    assert [r["step"] for r in synced] == [0, 1, 2, 3]  # three steps' syncs, and the one above
    assert all(r["gap"] < GAP for r in synced), synced
    assert len({round(r["model_logprob_sum"], 4) for r in synced}) > 1, "the weights never changed"


@pytest.mark.slow  # the colocated engine is tested above under the paper protocol; this was run for the release's
def test_colocated_vllm_rollouts_under_the_release_protocol(
    wide_head_model_path, tmp_path, own_process_group
):
    from prompt_r1.core.prompts import question_message
    from prompt_r1.loop.protocols import release
    from prompt_r1.training.sync.trainer import build_trainer

    rows = [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ]
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = _colocate_config(
            tmp_path, wide_head_model_path, server, protocol="release", max_steps=1, max_total_tokens=3000
        )
        trainer = build_trainer(config, train_rows=rows * 16)
        trainer.train()
        episodes = trainer.rollout_func([r["prompt"] for r in rows * 4], trainer)
    tokenizer = trainer.processing_class
    eos = tokenizer.eos_token_id
    for prompt, ids, mask in zip(
        episodes["prompt_ids"], episodes["completion_ids"], episodes["env_mask"], strict=True
    ):
        assert prompt == release.first_prompt_ids(tokenizer, NAME_QUESTION)
        first = ids[: mask.index(0)] if 0 in mask else ids
        # No stop strings: a turn ends on the end-of-turn token, kept, or at its token budget (less any padding
        # ids it sampled, which the release drops), never at a closing tag.
        assert first[-1] == eos or not tokenizer.decode(first).endswith("</interaction_prompt>")
        assert len(first) <= config.max_turn_tokens
        if 0 in mask:  # a call: the observation opens with the end-of-turn token again
            assert ids[len(first)] == eos
    assert all(t.startswith("<|im_start|>system\n") for t in episodes["transcript"])


def test_colocated_vllm_under_accelerate_with_two_zero2_processes(wide_head_model_path, tmp_path):
    import socket

    dataset = tmp_path / "names.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(32)
        )
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(ROOT / "training/accelerate/deepspeed_zero2.yaml"),
                "--num_processes",
                "2",
                "--main_process_port",
                str(port),
                "-m",
                "prompt_r1",
                "train",
                "--config",
                str(ROOT / "training/configs/tiny-cpu.yaml"),
                "--model_name_or_path",
                str(wide_head_model_path),
                "--train_data",
                str(dataset),
                "--env-base-url",
                server.base_url,
                "--max_turn_tokens",
                "24",
                "--max_total_tokens",
                "96",
                "--learning_rate",
                "1e-3",
                "--max_steps",
                "2",
                "--save_strategy",
                "no",
                "--output_dir",
                str(out),
                "--use_vllm",
                "true",
                "--vllm_mode",
                "colocate",
                "--vllm_sync_check",
                "true",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, "PROMPT_R1_ENV_API_KEY": "unused-key", "OMP_NUM_THREADS": "1"},
        )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "trained 2 steps" in done.stderr
    synced = _sync_rows(out)
    assert sorted((r["rank"], r["step"]) for r in synced) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["gap"] < GAP for r in synced), synced
    for rank in (0, 1):
        sums = [r["model_logprob_sum"] for r in synced if r["rank"] == rank]
        assert sums[0] != sums[1], "the weights never changed"


# ---- a served agent on vLLM's own server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_server(wide_head_model_path, tmp_path_factory):
    """`vllm serve` of the wide-head model on 127.0.0.1 (vLLM's OpenAI-compatible server, CPU build), in dev mode
    with the project's worker extension, as server-mode training on CPU starts it."""
    import socket
    import time
    import urllib.request

    from prompt_r1.testing.vllm_process import stop_vllm_server
    from prompt_r1.training.shared.vllm_reload import SERVER_EXTENSION

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = (tmp_path_factory.mktemp("vllm-serve") / "server.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(wide_head_model_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--served-model-name",
            "agent",
            "--worker-extension-cls",
            SERVER_EXTENSION,
        ],  # fmt: skip
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # stop_vllm_server stops its engine and worker with it
        # /collective_rpc: the weight sync without CUDA. The KV cache gets an explicit size, as the README says to
        # on CPU: sized as a share of the NUMA node's memory minus the process's own, it can come out below zero.
        env={
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        },
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vllm serve exited: {Path(log.name).read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        stop_vllm_server(process, kill=True)
        raise RuntimeError("vllm serve did not start in 300 s")
    yield base_url
    stop_vllm_server(process)


def test_a_served_agent_on_vllm_is_token_exact(vllm_server, wide_head_model_path):
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.served import ServedAgent

    settings = dict(temperature=0.0, max_new_tokens=40)
    served = ServedAgent(
        AgentConfig(model="agent", base_url=vllm_server, tokenizer=str(wide_head_model_path), **settings),
        api_key="unused-key",
    )
    assert served.tokenizer is not None and "completions API" in served.token_exact
    local = TransformersAgent(
        AgentConfig(model=str(wide_head_model_path), backend="transformers", **settings)
    )
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        ours = _episodes(served, server, 2)
        theirs = _episodes(local, server, 1)[0]
    assert theirs["status"] == "answered"
    for episode in ours:
        assert episode["completion_ids"] == theirs["completion_ids"]
        assert episode["env_mask"] == theirs["env_mask"]
        for mine, other in zip(episode["logprobs"], theirs["logprobs"], strict=True):
            assert abs(mine - other) < GAP


def test_a_served_vllm_agent_under_the_release_protocol_is_token_exact(vllm_server, wide_head_model_path):
    """--protocol release through vLLM's completions API: the release's first prompt, no stop strings, and the
    same ids, turn after turn, as the transformers backend on the same weights."""
    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.loop.protocols import release

    settings = dict(temperature=0.0, max_new_tokens=40)
    served = ServedAgent(
        AgentConfig(model="agent", base_url=vllm_server, tokenizer=str(wide_head_model_path), **settings),
        api_key="unused-key",
    )
    local = TransformersAgent(
        AgentConfig(model=str(wide_head_model_path), backend="transformers", **settings)
    )
    ours, theirs = _release_episodes(served, local)
    assert ours["prompt_ids"] == release.first_prompt_ids(local.tokenizer, NAME_QUESTION)
    assert ours["completion_ids"] == theirs["completion_ids"] and ours["env_mask"] == theirs["env_mask"]
    for mine, other in zip(ours["logprobs"], theirs["logprobs"], strict=True):
        assert abs(mine - other) < GAP


def test_a_served_agent_takes_the_tokenizer_from_where_vllm_loaded_the_model(
    vllm_server, wide_head_model_path
):
    from prompt_r1.agents.served import ServedAgent

    config = AgentConfig(model="agent", base_url=vllm_server, token_exact="on")
    served = ServedAgent(config, api_key="unused-key")
    assert served.tokenizer is not None and "completions API" in served.token_exact
    assert served.tokenizer.name_or_path == str(wide_head_model_path)


def test_run_json_prints_the_trajectory_of_a_served_vllm_agent(vllm_server, wide_head_model_path, capsys):
    from prompt_r1.cli.main import main

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        argv = [
            "run", NAME_QUESTION, "--json", "--trajectory", "--agent-model", "agent",
            "--agent-base-url", vllm_server, "--agent-tokenizer", str(wide_head_model_path),
            "--agent-temperature", "0", "--agent-max-new-tokens", "40",
            "--env-model", "env", "--env-base-url", server.base_url, "--max-turns", "2",
        ]  # fmt: skip
        assert main(argv) == 0
        assert main([*argv, "--agent-token-exact", "off"]) == 0
    exact, chat = (json.loads(line) for line in capsys.readouterr().out.splitlines())
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

    from prompt_r1.agents.local import TransformersAgent
    from prompt_r1.training.sync.policy import VLLMServerPolicy

    tokenizer = AutoTokenizer.from_pretrained(wide_head_model_path)
    client = VLLMClient(base_url=vllm_server.removesuffix("/v1"), connection_timeout=30)
    policy = VLLMServerPolicy(client, tokenizer, {"temperature": 0.0}, max_new_tokens=40)
    local = TransformersAgent(
        AgentConfig(
            model=str(wide_head_model_path), backend="transformers", temperature=0.0, max_new_tokens=40
        )
    )
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        ours = _episodes(policy, server, 3)
        theirs = _episodes(local, server, 1)[0]
    for episode in ours:  # stop strings honoured, ids and log-probabilities aligned, the environment masked
        assert episode["completion_ids"] == theirs["completion_ids"]
        assert episode["env_mask"] == theirs["env_mask"]
        for mine, other in zip(episode["logprobs"], theirs["logprobs"], strict=True):
            assert abs(mine - other) < GAP

    # The same under the release protocol: no stop strings, the release's first prompt, the same ids.
    ours, theirs = _release_episodes(policy, local)
    assert ours["prompt_ids"] == theirs["prompt_ids"]
    assert ours["completion_ids"] == theirs["completion_ids"] and ours["env_mask"] == theirs["env_mask"]


def test_server_mode_grpo_steps_on_cpu_sync_the_servers_weights_through_a_file(
    vllm_server, wide_head_model_path, tmp_path
):
    """TRL's server-mode sync needs NCCL; without CUDA the trainer writes the weights to a file and the server
    reloads them through /collective_rpc. After every sync the server computes what the trained model computes.
    Runs last in the module: the server's weights are put back afterwards for anything that follows."""
    import torch

    from prompt_r1.core.prompts import question_message
    from prompt_r1.training.shared.vllm_reload import post_json
    from prompt_r1.training.sync.trainer import build_trainer

    root = vllm_server.removesuffix("/v1")
    rows = [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ]
    try:
        with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
            config = _colocate_config(
                tmp_path,
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
        synced = _sync_rows(Path(config.output_dir))
        assert [r["step"] for r in synced] == [0, 1]
        assert all(r["gap"] < GAP for r in synced), synced
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
