"""GRPO training runs on CPU: real TRL runs of the tiny model in one process (the loss leaves the environment's
tokens out), LoRA then merge, DeepSpeed under accelerate, resume from a checkpoint, the learning check and the
tiny demo. The rollout and the training config: tests/test_training.py."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from conftest import (  # noqa: E402
    NAME_QUESTION,
    NAME_RESPONSE,
    NAME_TURN_1,
    NAMES,
)
from helpers import ROOT, accelerate_launch, failure_lines, name_rows, tiny_train_args, write_name_dataset  # noqa: E402

from prompt_r1.cli.main import main as cli_main  # noqa: E402
from prompt_r1.core.prompts import question_message  # noqa: E402
from prompt_r1.testing.servers import ScriptedServer  # noqa: E402
from prompt_r1.training.sync.trainer import build_trainer  # noqa: E402


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grpo_trains_in_one_process_and_environment_tokens_stay_out_of_the_loss(
    protocol_model_path, tiny_grpo_config, capsys
):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = tiny_grpo_config(protocol_model_path, server, max_steps=2)
        trainer = build_trainer(config, train_rows=name_rows(16))
        before = _params(trainer.model)
        trainer.train()
        assert trainer.state.global_step == 2
        # Each unwrapping for generation (two a step) adds an input-embedding hook, turning gradient checkpointing
        # off and on again; the rollout sweeps the orphans before it generates, so after any number of steps the
        # embedding holds the hook kept at the last generation and the two added since (without it: 1 + 2 a step).
        assert trainer.args.gradient_checkpointing
        assert len(trainer.model.get_input_embeddings()._forward_hooks) == 3
        # Training you can watch: a line per step instead of transformers' dict of every metric, and the curves.
        captured = capsys.readouterr()
        lines = re.findall(
            r"step (\d+/\d+)  reward [-+][\d.]+ \(format [\d.]+, answer [\d.]+\)  turns [\d.]+  "
            r"env calls [\d.]+  tokens \d+  [\d.]+ s  \$- this step, \$- total"  # "env" has no price
            # Where the step's seconds went: the rollout's parts, the reward functions, TRL's preparation of the
            # samples, training and the rest.
            r"  \(rollout [\d.]+ s: generate [\d.]+ \(by turn [\d.]+, [\d.]+(?:, [\d.]+)*\), env [\d.]+, loop [\d.]+; "
            r"scoring [\d.]+ s, prepare [\d.]+ s, training [\d.]+ s, other [\d.]+ s\)\n",
            captured.err,
        )
        assert lines == ["1/2", "2/2"], captured.err[-2000:]
        assert "'loss'" not in captured.out + captured.err
        assert (Path(config.output_dir) / "curves.png").stat().st_size > 1000
        after = _params(trainer.model)
        assert any(not torch.equal(before[n], after[n]) for n in before), "no parameter changed"
        logged = [h for h in trainer.state.log_history if "reward" in h]
        assert len(logged) == 2 and all("episode/turns" in h for h in logged)
        for h in logged:  # the rollout's parts add up to its wall time, and each took some
            parts = h["time/generate_s"] + h["time/environment_s"] + h["time/loop_s"]
            assert parts == pytest.approx(h["time/rollout_s"], rel=0.01)
            assert min(h["time/generate_s"], h["time/loop_s"], h["time/scoring_s"]) > 0
            # The step's parts, each measured on its own clock: the rollout and the scoring lie within TRL's
            # inputs, and the inputs and training within the step (nothing counted twice).
            assert (
                h["time/inputs_s"] >= h["time/rollout_s"] + h["time/scoring_s"] and h["time/training_s"] > 0
            )
            measured = h["time/inputs_s"] + h["time/training_s"]
            assert h["time/other_s"] >= 0 and measured + h["time/other_s"] == pytest.approx(h["time/step_s"])
            # Generation by turn: both turns of the two-turn episodes generated, and the turns add up to it.
            turns = [value for key, value in h.items() if key.startswith("time/generate_turn")]
            assert sum(turns) == pytest.approx(h["time/generate_s"]) and min(turns[:2]) > 0
            assert (
                len(turns) == trainer.rollout_func.most_agent_turns
            )  # every turn the loop allows, each step
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


def test_lora_run_then_merge_then_load(protocol_model_path, tiny_grpo_config, tmp_path):
    from transformers import AutoModelForCausalLM

    from prompt_r1.training.run import train

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        config = tiny_grpo_config(
            protocol_model_path, server, use_peft=True, lora_r=4, lora_alpha=8, learning_rate=5e-2
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


# ZeRO-2 under 2 processes is also the uninterrupted run of tests/test_training_ledger.py's kill-and-resume test.
@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_cli_trains_under_accelerate_with_two_deepspeed_processes(protocol_model_path, tmp_path, stage):
    """The README's command: accelerate launch with the repo's DeepSpeed config, 2 CPU processes (gloo)."""
    from safetensors.torch import load_file

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        out = tmp_path / "run"
        done = accelerate_launch(
            [
                "--config_file",
                str(ROOT / f"training/accelerate/deepspeed_zero{stage}.yaml"),
                "--num_processes",
                "2",
                "-m",
                "prompt_r1",
                *tiny_train_args(
                    protocol_model_path,
                    server.base_url,
                    write_name_dataset(tmp_path / "names.jsonl", 32),
                    out,
                    "--learning_rate",
                    "1e-3",
                    "--reward_preset",
                    "reference",
                    "--max_steps",
                    "2",
                    "--save_strategy",
                    "no",
                ),  # fmt: skip
            ],
            tmp_path,
        )
        requests = len(server.requests_for("env"))
    assert done.returncode == 0, f"exit {done.returncode}: {failure_lines(done.stderr)}"
    assert "trained 2 steps" in done.stderr
    assert 0 < requests <= 2 * 2 * 4  # 2 steps x 2 processes x 4 episodes, at most one environment call each
    before = load_file(protocol_model_path / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"


def test_cli_resumes_from_its_last_checkpoint(protocol_model_path, tmp_path, capsys):
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        common = [
            "train",
            "--config",
            str(ROOT / "training/configs/tiny-cpu.yaml"),
            "--model_name_or_path",
            str(protocol_model_path),
            "--train_data",
            str(write_name_dataset(tmp_path / "names.jsonl", 32)),
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
def test_mean_reward_rises_on_the_name_task(tiny_grpo_config, tmp_path):
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
        config = tiny_grpo_config(
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
