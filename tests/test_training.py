"""GRPO training: the graph as TRL's rollout_func (token-exact trajectories, seeds, the environment's failures) and
the training config, recipes and flags. Real TRL/DeepSpeed/PEFT runs on CPU: tests/test_training_runs.py."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from conftest import (  # noqa: E402
    TINY_QUESTION,
    TINY_RESPONSE_1,
    TINY_TURN_1,
    TINY_TURN_2,
)
from helpers import ROOT  # noqa: E402

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
            agent_compile_decode="auto",
            max_total_tokens=512,
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


def test_the_policy_decodes_with_the_trainers_compile_setting_and_trajectory_headroom(tiny_model_path):
    """The rollout's agent on the trainer's model: agent_compile_decode reaches it (auto: eager on CPU; on:
    compiled), and a first-turn cache is made for the trajectory's budget (max_total_tokens)."""
    from prompt_r1.training.sync.policy import trainer_policy

    trainer = stand_in_trainer(tiny_model_path)
    with trainer_policy(trainer, max_new_tokens=8) as agent:
        assert agent.compile_config is None and agent.cache_headroom == 512
    trainer.args.agent_compile_decode = "on"
    with trainer_policy(trainer, max_new_tokens=8) as agent:
        assert agent.compile_config is not None and agent.model is trainer.model


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


def test_train_help_lists_the_loop_fields(capsys):
    # In-process: the installed entry point is run by tests/test_cli.py; a process of its own cost 20 s here.
    assert cli_main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--env_model",
        "--max_turns",
        "--reward_preset",
        "--use_peft",
        "--resume",
        "--num_generations",
        "--task",
    ):
        assert flag in out


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


def test_the_step_line_says_where_the_rollouts_seconds_went():
    import io

    from transformers import TrainerControl, TrainerState

    from prompt_r1.training.shared.progress import StepLines

    stream = io.StringIO()
    lines, state = StepLines(stream), TrainerState(max_steps=4)
    lines.on_train_begin(None, state, TrainerControl())
    lines._last -= 2.0  # the step took 2 s
    state.global_step = 1
    times = {"time/rollout_s": 1.5, "time/generate_s": 0.5, "time/environment_s": 0.75, "time/loop_s": 0.25}
    lines.on_log(None, state, TrainerControl(), logs={"reward": 0.5, **times})
    line = stream.getvalue()
    assert "(rollout 1.50 s: generate 0.50, env 0.75, loop 0.25; rest 0.50 s)" in line, line
    lines.on_log(None, state, TrainerControl(), logs={"reward": 0.5})  # no breakdown logged: none shown
    assert "rollout" not in stream.getvalue().splitlines()[-1]
    lines._last -= 2.0
    state.global_step = 2
    # With the step clock's parts (prompt_r1.training.shared.step_clock): TRL's preparation is what its inputs
    # took beyond the rollout and the reward functions.
    clock = {"time/inputs_s": 1.75, "time/training_s": 0.2, "time/other_s": 0.05}
    lines.on_log(
        None, state, TrainerControl(), logs={"reward": 0.5, **times, "time/scoring_s": 0.125, **clock}
    )
    assert (
        "loop 0.25; scoring 0.12 s, prepare 0.12 s, training 0.20 s, other 0.05 s)"
        in stream.getvalue().splitlines()[-1]
    )


def test_the_step_clock_splits_a_synchronous_step_into_its_inputs_training_and_the_rest():
    from collections import defaultdict
    from types import SimpleNamespace

    from prompt_r1.training.shared.step_clock import install

    class Now:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    now, callbacks = Now(), []
    model = SimpleNamespace(training=True)

    def prepare_inputs(batch):  # TRL's: the rollout and the scoring on the first micro-batch of a step
        now.t += 3.0 if batch == 0 else 0.25
        return batch

    trainer = SimpleNamespace(
        _metrics={"train": defaultdict(list)},
        _prepare_inputs=prepare_inputs,
        model=model,
        add_callback=callbacks.append,
    )
    clock = install(trainer, now)
    assert callbacks == [clock] and trainer.step_clock is clock
    metrics = trainer._metrics["train"]
    clock.on_train_begin(None, None, None)
    for evaluated, other in ((False, 0.625), (True, 3.625)):
        now.t += 0.5  # the batch of prompts
        clock.on_step_begin(None, None, None)
        for micro in range(2):  # two micro-batches: inputs, then forward and backward
            trainer._prepare_inputs(micro)
            now.t += 1.0
        clock.on_optimizer_step(None, None, None)
        now.t += 0.125  # the step's end: callbacks
        clock.on_step_end(None, None, None)
        logged = {key: values[-1] for key, values in metrics.items()}
        assert logged == {
            "time/inputs_s": 3.25,
            "time/training_s": 2.0,
            "time/other_s": pytest.approx(other),  # the second: 0.5 + 0.125 and the evaluation's 3 s
            "time/step_s": pytest.approx(5.25 + other),
        }
        metrics.clear()
        if not evaluated:  # an evaluation after the step: its inputs are not timed as a step's
            model.training = False
            trainer._prepare_inputs(0)
            model.training = True


def test_the_reward_functions_time_themselves_once_per_step_under_their_names():
    from collections import defaultdict

    from prompt_r1.training.shared.progress import time_scoring

    def prompt_r1_total(completions, **kw):
        return [1.0] * len(completions)

    def prompt_r1_format(completions, **kw):
        return [0.5] * len(completions)

    trainer = SimpleNamespace(
        reward_funcs=[prompt_r1_total, prompt_r1_format],
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    time_scoring(trainer)
    assert [f.__name__ for f in trainer.reward_funcs] == ["prompt_r1_total", "prompt_r1_format"]
    for _ in range(2):  # two steps
        assert [f(["a", "b"]) for f in trainer.reward_funcs] == [[1.0, 1.0], [0.5, 0.5]]
    assert len(trainer._metrics["train"]["time/scoring_s"]) == 2  # one total per step, not one per function
    assert all(0 <= s < 1 for s in trainer._metrics["train"]["time/scoring_s"])


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
