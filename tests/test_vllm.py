"""The vLLM paths on vLLM's CPU build, in-process: the vLLM agent backend under batch, eval and run (slow); TRL's
colocated engine as the GRPO rollout policy (one process, and two DeepSpeed ZeRO-2 processes under accelerate
launch) with an exact weight sync. `vllm serve` as a served agent and TRL's server-mode policy:
tests/test_vllm_serve.py.

The tiny model has attention heads 64 wide, as vLLM's CPU attention requires (conftest's wide_head_model_path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed")
# The module's fixtures build a model and start vLLM's server; pytest's timeout counts them in a test's time.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

from conftest import NAME_QUESTION, NAMES  # noqa: E402
from helpers import (  # noqa: E402
    LOGPROB_GAP,
    ROOT,
    free_port,
    greedy_transformers_agent,
    name_environment,
    name_episodes,
    name_rows,
    rows_of,
    run_cli_process,
    tiny_train_args,
    write_name_dataset,
)

from prompt_r1.testing.servers import ScriptedServer  # noqa: E402


def _greedy_vllm_flags(model: Path, server: ScriptedServer) -> list[str]:
    """The run/batch flags of a greedy two-turn episode with the in-process vLLM agent."""
    return [
        "--agent-model", str(model), "--agent-backend", "vllm", "--agent-temperature", "0",
        "--agent-max-new-tokens", "40", "--env-model", "env", "--env-base-url", server.base_url, "--max-turns", "2",
    ]  # fmt: skip


def test_greedy_episodes_are_token_for_token_those_of_the_transformers_backend(
    wide_head_model_path, tmp_path
):
    """`prompt-r1 batch --agent-backend vllm` in a process of its own (an in-process async engine would outlive the
    test), against episodes of the `transformers` backend here."""

    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": NAME_QUESTION}) + "\n" for i in range(3))
    )
    out = tmp_path / "r.jsonl"
    local = greedy_transformers_agent(wide_head_model_path)
    with name_environment() as server:
        done = run_cli_process(
            [
                "batch",
                str(questions),
                "--out",
                str(out),
                "--no-progress",
                *_greedy_vllm_flags(wide_head_model_path, server),
                "--max-total-tokens",
                "200",
            ],  # fmt: skip
            timeout=400,
            cwd=tmp_path,
        )
        theirs = name_episodes(local, server, 1)[0]
    assert done.returncode == 0, done.stderr[-3000:]
    # batch writes nothing to stdout: vLLM's output (its engine process's too) goes to stderr.
    assert done.stdout == "", done.stdout[-2000:]
    assert "Loading safetensors checkpoint shards" in done.stderr
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
            assert abs(mine - other) < LOGPROB_GAP if mask else mine == other == 0.0


def test_eval_with_the_vllm_backend_scores_the_same_episodes(wide_head_model_path, tmp_path):
    """`prompt-r1 eval --agent-backend vllm` on a dataset file: the loop's method and the agent alone, greedy, give
    the answers the transformers backend gives."""

    dataset = tmp_path / "names.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(2)
        )
    )
    out = tmp_path / "eval"
    local = greedy_transformers_agent(wide_head_model_path)
    with name_environment() as server:
        done = run_cli_process(
            [
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
            timeout=400,
            cwd=tmp_path,
        )
        theirs = name_episodes(local, server, 1)[0]
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


# vLLM's output going to stderr is checked by the batch test above, and `run --json` by the served agent's run test
# (tests/test_vllm_serve.py): this one adds only `run` with the in-process engine, for another engine start.
@pytest.mark.slow
def test_run_json_with_the_vllm_backend_prints_only_json_on_stdout(wide_head_model_path, tmp_path):
    with name_environment() as server:
        done = run_cli_process(
            [
                "run",
                NAME_QUESTION,
                "--json",
                *_greedy_vllm_flags(wide_head_model_path, server),
            ],  # fmt: skip
            timeout=400,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads(done.stdout)  # the whole of stdout is the one JSON object
    assert payload["status"] == "answered" and payload["answer"] in NAMES
    assert "Loading safetensors checkpoint shards" in done.stderr  # vLLM's own output went to stderr


# ---- TRL's colocated engine ------------------------------------------------------------------------------------


@pytest.fixture
def own_process_group(monkeypatch):
    """TRL's colocated engine starts a process group in this process and sets RANK, LOCAL_RANK, WORLD_SIZE and
    MASTER_ADDR/PORT; the group's store keeps its port for the life of the process. It gets a free port of its own
    (not the default 29500 that a later test's `accelerate launch` binds), and the variables are removed afterwards
    so that later subprocesses do not take themselves for ranks of it."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    yield
    for name in names:
        os.environ.pop(name, None)


def test_colocated_vllm_rollouts_train_and_the_engine_follows_every_step(
    wide_head_model_path, colocate_config, own_process_group
):
    import torch

    from prompt_r1.training.sync.trainer import build_trainer

    rows = name_rows(1)
    with name_environment() as server:
        config = colocate_config(wide_head_model_path, server)
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
        assert len(ids) == len(logprobs) == len(mask) and 1 in mask
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        for k, (token_logprob, masked) in enumerate(zip(logprobs, mask, strict=True)):
            if masked:
                assert abs(token_logprob - expected[k].item()) < LOGPROB_GAP
            else:
                assert token_logprob == 0.0
        # A turn cut at a stop string (asking, or answering at once) or at the turn's token limit is closed by
        # the template's end-of-turn token, masked: not sampled. One that sampled the end-of-turn token itself
        # (a malformed turn: the episode ends) has nothing after it to mask.
        first_ids = ids[: mask.index(0)] if 0 in mask else ids
        first_turn = tokenizer.decode(first_ids)
        if 0 in mask:
            assert (
                first_turn.endswith(("</interaction_prompt>", "</answer>"))
                or len(first_ids) == config.max_turn_tokens
            ), first_turn
        else:
            assert first_ids[-1] == tokenizer.eos_token_id, first_turn
    # Whether any episode calls the environment after 3 steps depends on the machine's arithmetic (on some, all
    # four sample malformed first turns): replies' masking is held by the served-agent tests (test_vllm_serve.py).
    called = [mask for mask, calls in zip(episodes["env_mask"], episodes["env_calls"], strict=True) if calls]
    assert all(mask.count(0) > 1 for mask in called)

    # Every sync left the engine computing exactly what the trained model computes, and the weights moved.
    synced = rows_of(Path(config.output_dir) / "vllm_sync.jsonl")
    assert [r["step"] for r in synced] == [0, 1, 2, 3]  # three steps' syncs, and the one above
    assert all(r["gap"] < LOGPROB_GAP for r in synced), synced
    assert len({round(r["model_logprob_sum"], 4) for r in synced}) > 1, "the weights never changed"


@pytest.mark.slow  # the colocated engine is tested above under the paper protocol; this was run for the release's
def test_colocated_vllm_rollouts_under_the_release_protocol(
    wide_head_model_path, colocate_config, own_process_group
):
    from prompt_r1.loop.protocols import release
    from prompt_r1.training.sync.trainer import build_trainer

    rows = name_rows(1)
    with name_environment() as server:
        config = colocate_config(
            wide_head_model_path, server, protocol="release", max_steps=1, max_total_tokens=3000
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
    dataset = write_name_dataset(tmp_path / "names.jsonl", 32)
    out = tmp_path / "run"
    with name_environment() as server:
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
                str(free_port()),
                "-m",
                "prompt_r1",
                *tiny_train_args(wide_head_model_path, server.base_url, dataset, out),
                "--learning_rate",
                "1e-3",
                "--max_steps",
                "2",
                "--save_strategy",
                "no",
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
    synced = rows_of(out / "vllm_sync.jsonl")
    assert sorted((r["rank"], r["step"]) for r in synced) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["gap"] < LOGPROB_GAP for r in synced), synced
    for rank in (0, 1):
        sums = [r["model_logprob_sum"] for r in synced if r["rank"] == rank]
        assert sums[0] != sums[1], "the weights never changed"
