"""The release's run in our terms: `training/configs/release.yaml`, and GRPO rollouts under `--protocol release`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from helpers import accelerate_launch, failure_lines  # noqa: E402
from test_release import release_first_prompt, release_step  # noqa: E402
from test_training import env_client, stand_in_trainer  # noqa: E402

from prompt_r1.cli.main import main as cli_main  # noqa: E402
from prompt_r1.core.config import LoopConfig  # noqa: E402
from prompt_r1.core.errors import ConfigError  # noqa: E402
from prompt_r1.core.prompts import question_message  # noqa: E402
from prompt_r1.loop.protocols import release  # noqa: E402
from prompt_r1.testing.servers import ScriptedServer  # noqa: E402
from prompt_r1.training.sync.config import PromptR1GRPOConfig  # noqa: E402
from prompt_r1.training.sync.rollout import GraphRollout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "training/configs/release.yaml")


def _recipe(*flags: str) -> PromptR1GRPOConfig:
    from trl import TrlParser

    (config,) = TrlParser([PromptR1GRPOConfig]).parse_args_and_config(
        ["--config", RECIPE, "--use_cpu", "true", "--bf16", "false", *flags]
    )
    return config


def test_the_release_recipe_in_trls_terms():
    config = _recipe()
    assert (config.protocol, config.reward_preset) == ("release", "release")
    # run_prompt-R1.sh: 128 questions x n_repeat 5, mini-batch 64 questions, micro-batch 2, lr 1e-6, KL 0.001.
    assert (config.generation_batch_size, config.num_generations) == (640, 5)
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 20)
    assert (config.learning_rate, config.beta, config.epsilon, config.weight_decay) == (
        1e-6,
        0.001,
        0.2,
        0.01,
    )
    # verl's token-mean per micro-batch over the accumulation steps is TRL's bnpo (the local batch's tokens).
    assert config.loss_type == "bnpo"
    assert config.lr_scheduler_type == "constant"
    loop = config.loop_config()
    assert (loop.protocol, loop.force_final_answer) == ("release", False)
    assert (loop.max_turns, loop.max_turn_tokens, loop.max_total_tokens) == (5, 1024, 8192)
    with pytest.raises(ConfigError, match="reward_preset must be release"):
        _recipe("--reward_preset", "paper")
    assert _recipe("--reward_preset", "reference").reward_preset == "release"  # the former name


def test_bnpo_is_the_releases_token_mean_per_micro_batch():
    """TRL's bnpo loss against verl's `agg_loss(..., "token-mean")` divided by the accumulation steps, on the same
    per-token losses: two micro-batches of unequal lengths."""
    import torch

    per_token = [
        torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]),
        torch.tensor([[5.0, 6.0, 0.0], [7.0, 8.0, 9.0]]),
    ]
    masks = [torch.tensor([[1, 1, 1], [1, 0, 0]]), torch.tensor([[1, 1, 0], [1, 1, 1]])]
    steps = len(per_token)

    def verl_token_mean(loss, mask):  # core_algos.agg_loss → verl_F.masked_mean, then / gradient_accumulation
        return (loss * mask).sum() / mask.sum() / steps

    def trl_bnpo(loss, mask):  # grpo_trainer.py, loss_type == "bnpo"
        return (loss * mask).sum() / mask.sum().clamp(min=1.0) / steps

    verl = sum(verl_token_mean(loss, mask) for loss, mask in zip(per_token, masks, strict=True))
    trl = sum(trl_bnpo(loss, mask) for loss, mask in zip(per_token, masks, strict=True))
    assert torch.allclose(verl, trl)
    # and not TRL's default dapo, which divides by the tokens of the whole accumulated batch
    dapo = sum((loss * mask).sum() for loss, mask in zip(per_token, masks, strict=True)) / sum(
        m.sum() for m in masks
    )
    assert not torch.allclose(verl, dapo)
    from trl.trainer import grpo_trainer  # the formula above is TRL's own

    source = Path(grpo_trainer.__file__).read_text()
    assert (
        'elif self.loss_type == "bnpo":\n            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)'
        in source
    )


QUESTION = "Who wrote the first program?"
TURN_1 = '<think>\na person\n</think>\n<interaction_prompt>\n{"name": "prompt", "arguments": {"prompt": "Who is it?"}}\n</interaction_prompt>'
TURN_2 = "named\n</think>\n<answer>Ada Lovelace</answer>"


@pytest.fixture(scope="module")
def release_model_path(tmp_path_factory) -> Path:
    """A tiny model fine-tuned on the release's stream: it calls the prompt tool, then answers."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    episodes = [(QUESTION, TURN_1, "Ada Lovelace wrote it.", TURN_2)]
    return build_protocol_model(
        tmp_path_factory.mktemp("release") / "model", episodes, steps=300, protocol="release"
    )


def test_a_release_rollout_with_the_trainers_generate_is_the_releases_stream(release_model_path):
    """The rollout with the trainer's own `generate`: each episode's stream equals the one the release builds
    from the same sampled ids (the env_mask-1 runs), observation by observation."""
    trainer = stand_in_trainer(release_model_path, temperature=0.0)  # greedy: the model plays its script
    tok = trainer.processing_class
    tok.chat_template = release.chat_template()  # as the release's tokenizer had it installed
    question = QUESTION
    prompts = [[{"role": "user", "content": question_message(question)}]] * 4
    replies = {}

    def environment(body: dict) -> str:
        return replies.setdefault(body["messages"][-1]["content"], f"  reply {len(replies)} é ")

    loop = LoopConfig(protocol="release", max_turns=3, max_turn_tokens=160, max_total_tokens=4096)
    with ScriptedServer({"env": environment}) as server:
        rollout = GraphRollout(env_client(server), loop=loop)
        out = rollout(prompts, trainer)

    expected_prompt = release_first_prompt(tok, question_message(question))
    for i in range(4):
        ids, mask = out["completion_ids"][i], out["env_mask"][i]
        assert out["prompt_ids"][i] == expected_prompt
        # Rebuild the stream the release's way from this episode's sampled runs.
        runs, start = [], 0
        for k in range(1, len(mask) + 1):
            if k == len(mask) or mask[k] != mask[start]:
                runs.append((mask[start], ids[start:k]))
                start = k
        sampled = [run for flag, run in runs if flag == 1]
        stream = []
        for run in sampled:
            stream += run
            observation = release_step(
                tok.decode(run, skip_special_tokens=True),
                lambda p: release.reply_content(replies[p]),
            )
            if observation is None:
                break
            stream += tok(observation, add_special_tokens=False)["input_ids"]
        assert stream == ids, f"episode {i}"
        assert out["ends_on_agent_token"][i] == (mask[-1] == 1)
        assert out["transcript"][i] == release.transcript(tok, expected_prompt + ids)
    assert out["env_calls"] == [1] * 4, out[
        "turn_texts"
    ]  # every episode called, then went on to a second turn
    assert all(len(turns) >= 2 for turns in out["turn_texts"])


def _dataset(folder: Path) -> Path:
    path = folder / "questions.jsonl"
    row = {"question": QUESTION, "golden_answers": ["Ada Lovelace"]}
    path.write_text("".join(json.dumps({"id": f"q{i}", **row}) + "\n" for i in range(16)))
    return path


def _tiny_overrides(model: Path, server: ScriptedServer, tmp_path: Path, processes: int = 1) -> list[str]:
    """training/README.md's override command for a tiny model (4 episodes per process and step)."""
    return [
        "--model_name_or_path", str(model), "--use_cpu", "true", "--bf16", "false", "--agent_dtype", "float32",
        "--gradient_checkpointing", "false", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "1", "--generation_batch_size", str(4 * processes), "--num_generations", "4",
        "--max_steps", "2", "--max_turns", "2", "--max_turn_tokens", "160", "--max_total_tokens", "4096",
        "--temperature", "0.5",
        "--env-model", "env", "--env-base-url", server.base_url, "--env_api_key_env", "PROMPT_R1_TEST_NO_KEY",
        "--train_data", str(_dataset(tmp_path)), "--learning_rate", "1e-3",
        "--save_strategy", "no", "--report_to", "none", "--output_dir", str(tmp_path / "run"),
    ]  # fmt: skip


def test_the_release_recipe_trains_a_tiny_model_in_one_process(release_model_path, tmp_path, capsys):
    with ScriptedServer({"env": lambda body: "Ada Lovelace wrote it."}) as server:
        code = cli_main(["train", "--config", RECIPE, *_tiny_overrides(release_model_path, server, tmp_path)])
        calls = server.requests_for("env")
    assert code == 0, capsys.readouterr().err[-3000:]
    assert "trained 2 steps" in capsys.readouterr().err
    assert calls, "no episode called the environment"
    for request in calls:  # the environment as the release calls it
        assert request.body["messages"][0]["content"] == release.ENVIRONMENT_SYSTEM_PROMPT_RELEASE
        assert "temperature" not in request.body


@pytest.mark.slow  # the 2-process path is tested with the tiny recipe; this one was run for the release recipe
def test_the_release_recipe_under_two_zero2_processes(release_model_path, tmp_path):
    with ScriptedServer({"env": lambda body: "Ada Lovelace wrote it."}) as server:
        done = accelerate_launch(
            [
                "--config_file", str(ROOT / "training/accelerate/deepspeed_zero2.yaml"), "--num_processes", "2",
                "-m", "prompt_r1", "train", "--config", RECIPE,
                *_tiny_overrides(release_model_path, server, tmp_path, processes=2),
            ],
            tmp_path,
        )  # fmt: skip
        calls = len(server.requests_for("env"))
    assert done.returncode == 0, f"exit {done.returncode}: {failure_lines(done.stderr)}"
    assert calls, f"no episode called the environment: {failure_lines(done.stderr)}"
    assert "trained 2 steps" in done.stderr
