"""GRPO training: the graph as TRL's rollout_func, token-exact trajectories, real TRL/DeepSpeed/PEFT runs on CPU."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from conftest import (  # noqa: E402
    NAME_QUESTION,
    NAME_RESPONSE,
    NAME_TURN_1,
    NAMES,
    TINY_QUESTION,
    TINY_RESPONSE_1,
    TINY_TURN_1,
    TINY_TURN_2,
)

from prompt_r1.cli.main import main as cli_main  # noqa: E402
from prompt_r1.clients.environment import EnvironmentClient  # noqa: E402
from prompt_r1.core.config import EnvironmentConfig, LoopConfig  # noqa: E402
from prompt_r1.core.prompts import interaction_response, question_message  # noqa: E402
from prompt_r1.core.tokens import user_turn_ids  # noqa: E402
from prompt_r1.runs.episode import Episode  # noqa: E402
from prompt_r1.scoring.rewards import trl_reward  # noqa: E402
from prompt_r1.testing.servers import Fault, ScriptedServer, echo_environment  # noqa: E402
from prompt_r1.training.shared.rows import load_training_rows  # noqa: E402
from prompt_r1.training.shared.trajectories import question_of  # noqa: E402
from prompt_r1.training.sync.config import PromptR1GRPOConfig  # noqa: E402
from prompt_r1.training.sync.rollout import GraphRollout  # noqa: E402
from prompt_r1.training.sync.trainer import build_trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def stand_in_trainer(model_path: Path, *, temperature: float = 1.0):
    """The parts of a GRPOTrainer a rollout_func touches, around a real model and a real Accelerator."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path).train()  # as during a training step
    return SimpleNamespace(
        model=model,
        model_wrapped=model,
        accelerator=Accelerator(cpu=True),
        processing_class=AutoTokenizer.from_pretrained(model_path),
        args=SimpleNamespace(
            temperature=temperature,
            top_p=1.0,
            ds3_gather_for_generation=True,
            gradient_checkpointing_kwargs=None,
            seed=0,
        ),
        state=SimpleNamespace(global_step=0),
        use_vllm=False,
        tools=None,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def rollout_loop(**settings) -> LoopConfig:
    """A training rollout's loop: the paper's per-turn budget (1,024), and no final-answer request."""
    return LoopConfig(**{"max_turn_tokens": 1024, "force_final_answer": False, **settings})


def env_client(server: ScriptedServer, **overrides) -> EnvironmentClient:
    settings = dict(
        model="env", base_url=server.base_url, api_key_env="PROMPT_R1_TEST_NO_KEY", backoff_initial=0.01
    )
    return EnvironmentClient(EnvironmentConfig(**{**settings, **overrides}))


def name_rows(n: int) -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ] * n


def name_config(tmp_path: Path, model: Path, server: ScriptedServer, **overrides) -> PromptR1GRPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "run"),
        model_name_or_path=str(model),
        env_model="env",
        env_base_url=server.base_url,
        env_api_key_env="PROMPT_R1_TEST_NO_KEY",
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=2,
        max_turns=2,
        max_turn_tokens=24,
        max_total_tokens=96,
        learning_rate=1e-3,
        temperature=1.0,
        reward_preset="reference",
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    return PromptR1GRPOConfig(**{**settings, **overrides})


def test_question_of_reads_release_messages_and_plain_text():
    assert question_of([{"role": "user", "content": question_message("Who?")}]) == "Who?"
    assert question_of("Who wrote it?") == "Who wrote it?"
    with pytest.raises(Exception, match="question or chat messages"):
        question_of("")


def test_every_environment_setting_reaches_training_with_its_type_and_default():
    """The training config's env_* fields are EnvironmentConfig's: a setting added there exists here, with the
    same default, and environment_config() hands every one over (the run's limits shared out per process)."""
    config = PromptR1GRPOConfig(output_dir="unused", use_cpu=True, report_to=[])
    env_fields = {f.name: f for f in dataclasses.fields(config) if f.name.startswith("env_")}
    assert set(env_fields) == {f"env_{f.name}" for f in dataclasses.fields(EnvironmentConfig)}
    for f in dataclasses.fields(EnvironmentConfig):
        assert env_fields[f"env_{f.name}"].default == f.default, f.name
    changed = dict(model="m", base_url="http://127.0.0.1:9/v1", api_key_env="K", rate_limit=90, rate_period=2.0,
                   max_in_flight=3, tokens_per_minute=600, timeout=7.0, max_retries=1, backoff_initial=0.5,
                   backoff_max=4.0, max_retry_after=9.0, temperature=0.3, max_tokens=77,
                   token_limit=None,  # the per-period alternative to tokens_per_minute (test_shared_limit.py)
                   rate_store="redis://127.0.0.1:9/0")  # fmt: skip
    assert set(changed) == {f.name for f in dataclasses.fields(EnvironmentConfig)}  # a new field: add it here
    config = PromptR1GRPOConfig(
        output_dir="unused", use_cpu=True, report_to=[], **{f"env_{k}": v for k, v in changed.items()}
    )
    assert config.environment_config() == EnvironmentConfig(**changed)
    # Through a shared store every rank takes from the one limit (and the store holds the ranks' in-flight sum);
    # in memory each gets its share.
    assert config.environment_config(num_processes=3) == EnvironmentConfig(**{**changed, "max_in_flight": 9})
    config.env_rate_store = "memory"
    assert config.environment_config(num_processes=3) == EnvironmentConfig(
        **{**changed, "rate_store": "memory", "rate_limit": 30, "tokens_per_minute": 200}
    )


def test_the_rollouts_loop_keywords_still_work_for_one_release_with_a_warning():
    with pytest.warns(
        DeprecationWarning, match=re.escape("GraphRollout(max_turns=...) is deprecated; pass loop=")
    ):
        rollout = GraphRollout(None, max_turns=2)
    assert rollout.loop == rollout_loop(max_turns=2)
    with pytest.raises(ValueError, match="not both"):
        GraphRollout(None, loop=rollout_loop(), max_turns=2)


def test_every_loop_setting_reaches_the_rollouts_or_is_fixed_by_training():
    """Each LoopConfig field is a training field of the same name or one training fixes (ROLLOUT_LOOP): a loop
    setting added there fails here until training takes it; loop_config() hands every one over."""
    from prompt_r1.core.config import LoopConfig
    from prompt_r1.training.shared.config import ROLLOUT_LOOP

    names = {f.name for f in dataclasses.fields(LoopConfig)}
    training = {f.name for f in dataclasses.fields(PromptR1GRPOConfig)}
    assert names - set(ROLLOUT_LOOP) <= training, names - set(ROLLOUT_LOOP) - training
    config = PromptR1GRPOConfig(
        output_dir="unused", use_cpu=True, report_to=[], max_turns=3, max_turn_tokens=40, max_total_tokens=400
    )
    assert config.loop_config() == LoopConfig(
        max_turns=3, max_turn_tokens=40, max_total_tokens=400, force_final_answer=False
    )


def test_rollout_returns_the_sampled_ids_and_rendered_environment_tokens(trained_tiny_model_path):
    trainer = stand_in_trainer(trained_tiny_model_path, temperature=0.0)  # greedy: the model plays its script
    tok = trainer.processing_class
    prompts = [
        [{"role": "user", "content": question_message(TINY_QUESTION)}]
    ] * 6  # one group, already repeated
    with ScriptedServer({"env": echo_environment()}) as server:
        rollout = GraphRollout(
            env_client(server), loop=rollout_loop(max_turns=3, max_turn_tokens=64, max_total_tokens=512)
        )
        out = rollout(prompts, trainer)
        env_requests = len(server.requests_for("env"))

    assert all(
        len(out[k]) == 6 for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "turn_texts")
    )
    assert env_requests == 6
    turn1 = tok.encode(TINY_TURN_1, add_special_tokens=False)
    env = user_turn_ids(tok, interaction_response(TINY_RESPONSE_1), turn1)
    turn2 = tok.encode(TINY_TURN_2, add_special_tokens=False)
    close = [
        tok.eos_token_id
    ]  # turn 2 stopped on </answer>: the template's end-of-turn closes it, not trained on
    for i in range(6):
        assert out["status"][i] == "answered" and out["answer"][i] == "Ada Lovelace"
        assert out["completion_ids"][i] == turn1 + env + turn2 + close
        assert out["env_mask"][i] == [1] * len(turn1) + [0] * len(env) + [1] * len(turn2) + [0]
        assert len(out["logprobs"][i]) == len(out["completion_ids"][i])
        assert out["turn_texts"][i] == [TINY_TURN_1, TINY_TURN_2]
        # Decoding the trajectory gives the episode's text, turn markers included.
        text = tok.decode(out["completion_ids"][i])
        assert text == TINY_TURN_1 + tok.decode(env) + TINY_TURN_2 + tok.eos_token

    # The ablation that trains on the environment's tokens marks every token of the same episodes as the agent's.
    rollout.train_on_environment_tokens = True
    ablated = rollout.to_trajectories(rollout.last_results, tok)
    assert ablated["completion_ids"] == out["completion_ids"]
    assert all(
        mask == [1] * len(ids) for mask, ids in zip(ablated["env_mask"], out["completion_ids"], strict=True)
    )

    # All six first turns went to the model in one generate call, and the step took no more generate calls than
    # the episodes' two turns (registered episodes wait for each other: a GPU step went from 7.08 s to 4.29 s).
    assert rollout.last_batch_sizes[0] == 6
    assert trainer._metrics["train"]["rollout/generate_calls"] == [2.0]
    assert trainer._metrics["train"]["episode/status_answered"] == [1.0]
    assert trainer._metrics["train"]["episode/env_calls"] == [1.0]


def test_rollout_logprobs_are_those_of_the_sampled_tokens(trained_tiny_model_path):
    """At temperature 1 a fresh forward pass over prompt + trajectory gives the returned logprobs at the agent's
    positions; environment positions hold 0."""
    trainer = stand_in_trainer(trained_tiny_model_path, temperature=1.0)
    prompts = [[{"role": "user", "content": question_message(TINY_QUESTION)}]] * 4
    with ScriptedServer({"env": echo_environment()}) as server:
        out = GraphRollout(
            env_client(server), loop=rollout_loop(max_turns=3, max_turn_tokens=64, max_total_tokens=512)
        )(prompts, trainer)
    for i in range(4):
        ids = torch.tensor([out["prompt_ids"][i] + out["completion_ids"][i]])
        with torch.no_grad():
            logits = trainer.model(ids).logits[0, len(out["prompt_ids"][i]) - 1 : -1]
        targets = torch.tensor(out["completion_ids"][i])[:, None]
        expected = torch.log_softmax(logits.float(), -1).gather(1, targets)[:, 0]
        mask = torch.tensor(out["env_mask"][i], dtype=torch.bool)
        got = torch.tensor(out["logprobs"][i])
        assert len(got) == len(expected) and mask.any()
        assert torch.allclose(got[mask], expected[mask], atol=1e-4)
        assert torch.all(got[~mask] == 0)


def test_rollout_closes_a_turn_that_stopped_on_a_stop_string(trained_tiny_model_path):
    """The second turn stops at </answer> when the model would go on: the template's end-of-turn marker is appended
    (env_mask 0) so TRL does not read the trajectory as truncated."""
    trainer = stand_in_trainer(trained_tiny_model_path)
    tok = trainer.processing_class
    rollout = GraphRollout(None, loop=rollout_loop(max_turns=1))
    result = Episode(
        id=None,
        question="Q?",
        status="answered",
        turns=[{"text": "<think>t</think><answer>a</answer>", "finish_reason": "stop"}],
        trajectory={"prompt_ids": [1, 2], "completion_ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3],
                    "env_mask": [1, 1, 1]},
    )  # fmt: skip
    cut = dataclasses.replace(copy.deepcopy(result), status="context_overflow")
    out = rollout.to_trajectories([result, cut], tok)
    assert out["completion_ids"][0] == [5, 6, 7, tok.eos_token_id]
    assert out["env_mask"][0] == [1, 1, 1, 0] and out["logprobs"][0][-1] == 0.0
    assert out["completion_ids"][1] == [5, 6, 7]  # cut off by a budget: left truncated


def test_episode_whose_environment_failed_gets_no_reward(trained_tiny_model_path):
    # Greedy: the model plays its script, which prompts first (sampled, it can answer at once and never reach the
    # failing environment).
    trainer = stand_in_trainer(trained_tiny_model_path, temperature=0.0)
    prompts = [[{"role": "user", "content": question_message(TINY_QUESTION)}]] * 2
    with ScriptedServer({"env": echo_environment()}) as server:
        server.inject(*[Fault("500")] * 10, model="env")
        rollout = GraphRollout(
            env_client(server, max_retries=1), loop=rollout_loop(max_turns=3, max_turn_tokens=64)
        )
        out = rollout(prompts, trainer)
    assert out["status"] == ["environment_error", "environment_error"]
    columns = {
        k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
    }
    rewards = trl_reward("paper")(prompts, ["", ""], None, golden_answers=[["Ada"], ["Ada"]], **columns)
    assert rewards == [None, None]
    assert trainer._metrics["train"]["episode/status_environment_error"] == [1.0]
    assert trainer._metrics["train"]["episode/env_failed_calls"] == [1.0]


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grpo_trains_in_one_process_and_environment_tokens_stay_out_of_the_loss(
    protocol_model_path, tmp_path, capsys
):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = name_config(tmp_path, protocol_model_path, server, max_steps=2)
        trainer = build_trainer(config, train_rows=name_rows(16))
        before = _params(trainer.model)
        trainer.train()
        assert trainer.state.global_step == 2
        # Training you can watch: a line per step instead of transformers' dict of every metric, and the curves.
        captured = capsys.readouterr()
        lines = re.findall(
            r"step (\d+/\d+)  reward [-+][\d.]+ \(format [\d.]+, answer [\d.]+\)  turns [\d.]+  "
            r"env calls [\d.]+  tokens \d+  [\d.]+ s  \$- this step, \$- total\n",  # "env" has no price
            captured.err,
        )
        assert lines == ["1/2", "2/2"], captured.err[-2000:]
        assert "'loss'" not in captured.out + captured.err
        assert (Path(config.output_dir) / "curves.png").stat().st_size > 1000
        after = _params(trainer.model)
        assert any(not torch.equal(before[n], after[n]) for n in before), "no parameter changed"
        logged = [h for h in trainer.state.log_history if "reward" in h]
        assert len(logged) == 2 and all("episode/turns" in h for h in logged)
        assert any(h["reward_std"] > 0 for h in logged)

        # Environment tokens contribute nothing to the loss: with the same episodes, two different runs of
        # environment tokens after the agent's last token give the same gradient; counted in the loss, they don't.
        rows = name_rows(4)
        episodes = trainer.rollout_func([r["prompt"] for r in rows], trainer)
        assert any(0 in m for m in episodes["env_mask"])

        def gradient(suffix: list[int], *, count_env_tokens: bool = False) -> torch.Tensor:
            out = copy.deepcopy(episodes)
            for i in range(len(rows)):
                out["completion_ids"][i] += suffix
                out["logprobs"][i] += [0.0] * len(suffix)
                out["env_mask"][i] += [0] * len(suffix)
            trainer.rollout_func = lambda prompts, _trainer: copy.deepcopy(out)
            inputs = trainer._generate_and_score_completions(copy.deepcopy(rows))
            inputs["advantages"] = torch.linspace(-1.0, 1.0, len(rows))
            if count_env_tokens:
                inputs["tool_mask"] = torch.ones_like(inputs["tool_mask"])
            trainer.model.zero_grad()
            trainer.compute_loss(trainer.model, inputs).backward()
            return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

        a, b = gradient([11, 12, 13]), gradient([40, 41, 42])
        assert torch.equal(a, b)
        assert not torch.allclose(
            gradient([11, 12, 13], count_env_tokens=True), gradient([40, 41, 42], count_env_tokens=True)
        )


def test_lora_run_then_merge_then_load(protocol_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from prompt_r1.training.run import train

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = name_config(
            tmp_path, protocol_model_path, server, use_peft=True, lora_r=4, lora_alpha=8, learning_rate=5e-2
        )
        trainer = train(config, train_rows=name_rows(16))
    assert trainer.state.global_step == 2
    adapter = Path(config.output_dir)
    assert (adapter / "adapter_config.json").is_file()
    merged = tmp_path / "merged"
    assert cli_main(["merge", str(adapter), "--out", str(merged)]) == 0
    base = AutoModelForCausalLM.from_pretrained(protocol_model_path)
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert set(dict(model.named_parameters())) == set(dict(base.named_parameters()))
    changed = [
        n for n, p in model.named_parameters() if not torch.allclose(p, dict(base.named_parameters())[n])
    ]
    assert changed, "the merged model equals its base"
    # The merged folder is an ordinary agent model.
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        code = cli_main(
            [
                "run",
                NAME_QUESTION,
                "--json",
                "--agent-model",
                str(merged),
                "--agent-max-new-tokens",
                "24",
                "--env-model",
                "env",
                "--env-base-url",
                server.base_url,
            ]
        )
    assert code in (0, 1)  # the episode ran; a merged random-ish tiny model may or may not answer


def test_merge_refuses_a_folder_that_is_not_an_adapter(tmp_path, capsys):
    assert cli_main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "not a LoRA adapter folder" in capsys.readouterr().err


def test_training_rows_come_from_the_shipped_sample():
    rows = load_training_rows(PromptR1GRPOConfig(output_dir="x", use_cpu=True).resolved_train_data(), limit=3)
    assert len(rows) == 3
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["prompt"][0]["content"].startswith("Question: ")
    assert rows[0]["golden_answers"]
    assert sum(1 for _ in load_training_rows(str(ROOT / "training/data/mixed_2048.parquet"))) == 2048


def test_train_flags_errors_are_one_line(tmp_path, capsys):
    assert (
        cli_main(["train", "--output_dir", str(tmp_path), "--use_cpu", "true", "--reward_preset", "bogus"])
        == 2
    )
    assert "reward_preset must be one of" in capsys.readouterr().err
    code = cli_main(
        ["train", "--config", str(ROOT / "training/configs/tiny-cpu.yaml"), "--num_generations", "3"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("prompt-r1: error:") and "Traceback" not in err


def test_every_recipe_parses(tmp_path):
    from trl import TrlParser

    for recipe in ("paper", "release", "zero-cost", "tiny-cpu"):
        (config,) = TrlParser([PromptR1GRPOConfig]).parse_args_and_config(
            [
                "--config",
                str(ROOT / f"training/configs/{recipe}.yaml"),
                "--use_cpu",
                "true",
                "--bf16",
                "false",
            ]
        )
        assert config.max_turns >= 1 and config.num_generations >= 2
    (paper,) = TrlParser([PromptR1GRPOConfig]).parse_args_and_config(
        ["--config", str(ROOT / "training/configs/paper.yaml"), "--use_cpu", "true", "--bf16", "false"]
    )
    # Table 6: 128 questions x 5 per generation step, lr 1e-6, KL 0.001, micro-batch 2.
    assert (paper.generation_batch_size, paper.num_generations) == (640, 5)
    assert (paper.learning_rate, paper.beta, paper.per_device_train_batch_size) == (1e-6, 0.001, 2)
    assert (paper.max_turns, paper.max_turn_tokens, paper.max_total_tokens) == (5, 1024, 8192)


def _failure_lines(stderr: str) -> str:
    """The lines of a failed launch that say why, without the progress bars and deprecation warnings."""
    noise = ("it/s]", "s/it]", "Warning", "warnings.warn", "return func(")
    lines = [line for line in stderr.splitlines() if line.strip() and not any(n in line for n in noise)]
    return "\n".join(lines[-60:])


def _launch(args: list[str], tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    accelerate = Path(sys.executable).parent / "accelerate"
    # A free port rather than accelerate's fixed 29500, so that no other launch on the machine can collide.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return subprocess.run(
        [str(accelerate), "launch", "--main_process_port", str(port), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("stage", [2, 3])
def test_cli_trains_under_accelerate_with_two_deepspeed_processes(protocol_model_path, tmp_path, stage):
    """The README's command: accelerate launch with the repo's DeepSpeed config, 2 CPU processes (gloo)."""
    from safetensors.torch import load_file

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        out = tmp_path / "run"
        done = _launch(
            [
                "--config_file",
                str(ROOT / f"training/accelerate/deepspeed_zero{stage}.yaml"),
                "--num_processes",
                "2",
                "-m",
                "prompt_r1",
                "train",
                "--config",
                str(ROOT / "training/configs/tiny-cpu.yaml"),
                "--model_name_or_path",
                str(protocol_model_path),
                "--train_data",
                str(_name_dataset(tmp_path)),
                "--env-base-url",
                server.base_url,
                "--max_turn_tokens",
                "24",
                "--max_total_tokens",
                "96",
                "--learning_rate",
                "1e-3",
                "--reward_preset",
                "reference",
                "--max_steps",
                "2",
                "--save_strategy",
                "no",
                "--output_dir",
                str(out),
            ],
            tmp_path,
        )
        requests = len(server.requests_for("env"))
    assert done.returncode == 0, f"exit {done.returncode}: {_failure_lines(done.stderr)}"
    assert "trained 2 steps" in done.stderr
    assert 0 < requests <= 2 * 2 * 4  # 2 steps x 2 processes x 4 episodes, at most one environment call each
    before = load_file(protocol_model_path / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"


def _name_dataset(folder: Path) -> Path:
    path = folder / "names.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(32)
        )
    )
    return path


def test_cli_resumes_from_its_last_checkpoint(protocol_model_path, tmp_path, capsys):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        common = [
            "train",
            "--config",
            str(ROOT / "training/configs/tiny-cpu.yaml"),
            "--model_name_or_path",
            str(protocol_model_path),
            "--train_data",
            str(_name_dataset(tmp_path)),
            "--env-base-url",
            server.base_url,
            "--max_turn_tokens",
            "24",
            "--output_dir",
            str(tmp_path / "run"),
            "--save_steps",
            "1",
        ]
        assert cli_main([*common, "--resume"]) == 2
        assert "no checkpoint" in capsys.readouterr().err
        assert cli_main([*common, "--max_steps", "1"]) == 0
        assert (tmp_path / "run/checkpoint-1").is_dir()
        first_run = len(server.requests_for("env"))
        assert cli_main([*common, "--max_steps", "2", "--resume"]) == 0
        resumed_run = len(server.requests_for("env")) - first_run
    state = json.loads((tmp_path / "run/checkpoint-2/trainer_state.json").read_text())
    assert state["global_step"] == 2
    steps = {h["step"]: h for h in state["log_history"] if "reward" in h}
    assert set(steps) == {1, 2}  # step 1's log came back with the checkpoint
    # The resumed run played step 2's episodes only (4 per step, each logged with its environment calls).
    assert resumed_run == round(steps[2]["episode/env_calls"] * 4)


@pytest.mark.slow
def test_mean_reward_rises_on_the_name_task(tmp_path):
    """Learning check: the environment always says Ada; the model starts out answering any of four names, with a
    format it sometimes breaks. GRPO with the double-constrained reward must raise the mean reward."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    questions = [NAME_QUESTION, "Which name is on the list?"]
    episodes = [
        (q, NAME_TURN_1, NAME_RESPONSE, f"<think>ok</think><answer>{n}</answer>")
        for q in questions
        for n in NAMES
    ]
    model = build_protocol_model(tmp_path / "model", episodes, steps=300)
    rows = [
        {"prompt": [{"role": "user", "content": question_message(q)}], "golden_answers": ["Ada"]}
        for q in questions
    ]
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = name_config(
            tmp_path,
            model,
            server,
            per_device_train_batch_size=8,
            num_generations=8,
            max_steps=30,
            beta=0.0,
            learning_rate=3e-4,
        )
        trainer = build_trainer(config, train_rows=rows * 120)
        trainer.train()
    curve = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    print("mean reward per step:", " ".join(f"{r:.2f}" for r in curve))
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    # At this scale the curve is noisy (runs seen: +0.41, +0.23, +0.07 from the first ten steps to the last ten):
    # the check is that it rises, not by how much.
    assert not math.isnan(first) and last > first, (first, last)


def test_train_help_lists_the_loop_fields():
    done = subprocess.run(
        [sys.executable, "-m", "prompt_r1", "train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    for flag in (
        "--env_model",
        "--max_turns",
        "--reward_preset",
        "--use_peft",
        "--resume",
        "--num_generations",
        "--task",
    ):
        assert flag in done.stdout


def test_the_format_gate_ablation_reaches_the_trainers_reward(tmp_path):
    from prompt_r1.training.shared.rewards import reward_functions

    one_turn = {"turn_texts": [["<think>sure</think><answer>Paris</answer>"]], "golden_answers": [["Paris"]]}
    totals = []
    for gate in (True, False):
        config = PromptR1GRPOConfig(
            output_dir=str(tmp_path),
            reward_preset="reference",
            reward_format_gate=gate,
            use_cpu=True,
            report_to=[],
        )
        total = reward_functions(config)[0]
        totals.append(total(prompts=[None], completions=[""], **one_turn)[0])
    assert totals[0] == pytest.approx(-0.4) and totals[1] == pytest.approx(0.6)


def test_the_step_lines_say_when_the_policy_is_stuck():
    import io

    from transformers import TrainerControl, TrainerState

    from prompt_r1.training.shared.progress import STUCK_STEPS, StepLines

    stream = io.StringIO()
    lines, state = StepLines(stream), TrainerState(max_steps=40)
    lines.on_train_begin(None, state, TrainerControl())

    def step(**logs):
        state.global_step += 1
        lines.on_log(None, state, TrainerControl(), logs={"reward": 0.0, "episode/env_calls": 1.0, **logs})

    for _ in range(STUCK_STEPS - 1):
        step(frac_reward_zero_std=1.0)
    step(frac_reward_zero_std=0.75)  # one group still differed: not stuck, the count starts again
    assert lines.warnings == []
    for _ in range(STUCK_STEPS + 3):
        step(frac_reward_zero_std=1.0)
    assert len(lines.warnings) == 1  # once per spell, at its STUCK_STEPS-th step
    assert f"stuck at step {2 * STUCK_STEPS}: every group had equal rewards" in lines.warnings[0]
    for _ in range(STUCK_STEPS):
        step(**{"episode/env_calls": 0.0, "frac_reward_zero_std": 0.5})
    assert "no episode called the environment" in lines.warnings[-1]
    assert stream.getvalue().count("warning: the policy looks stuck") == 2
    for _ in range(STUCK_STEPS):  # calls without end: most episodes ran out of turns
        step(**{"episode/status_max_turns": 0.6, "frac_reward_zero_std": 0.5})
    assert "called the environment until max_turns without answering" in lines.warnings[-1]
    assert len(lines.warnings) == 3


def test_each_rollout_call_gets_its_own_seed_and_evaluation_does_not_shift_trainings():
    rollout = GraphRollout(object(), loop=rollout_loop(max_turn_tokens=8))

    def trainer(step, training=True, seed=0, reproducible=True):
        return SimpleNamespace(
            args=SimpleNamespace(seed=seed, reproducible_rollouts=reproducible),
            state=SimpleNamespace(global_step=step),
            model=SimpleNamespace(training=training),
            accelerator=SimpleNamespace(process_index=0),
        )

    first = rollout.step_seed(trainer(3))
    assert rollout.step_seed(trainer(3)) != first  # a second call in the same step samples afresh
    fresh = GraphRollout(object(), loop=rollout_loop(max_turn_tokens=8))
    fresh.step_seed(trainer(3, training=False))  # an evaluation at that step first
    assert fresh.step_seed(trainer(3)) == first  # leaves training's seed as it was
    assert len({rollout.step_seed(trainer(s)) for s in range(50)}) == 50
    assert GraphRollout(object(), loop=rollout_loop(max_turn_tokens=8)).step_seed(trainer(3, seed=1)) != first
    assert rollout.step_seed(trainer(3, reproducible=False)) is None
