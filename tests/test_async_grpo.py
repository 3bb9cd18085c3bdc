"""Asynchronous GRPO: TRL's AsyncGRPOTrainer with the LangGraph loop as its rollout worker, on CPU.

The tests without vLLM (the tree attention, the KL term, the advantages, the configs and the switch) are in
tests/test_async_grpo_setup.py. These run short async trainings of a tiny agent served by `vllm serve` (vLLM's CPU build) against a
scripted environment with latency on 127.0.0.1: staleness bounded and stale samples dropped and counted, the
environment's tokens masked, the policy version advancing with every file sync, two FSDP2 processes under
accelerate (the server's weights, --resume, the max_env_calls stop; slow), and a killed environment or vLLM
server failing the run with one line instead of a hang."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from conftest import NAME_RESPONSE
from helpers import (
    ROOT,
    accelerate_launch,
    async_tiny_config,
    failure_lines,
    name_rows,
    write_name_dataset,
)

from prompt_r1.testing.servers import ScriptedServer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL 1.16's async trainer is experimental: known here


def _served_config(tmp_path: Path, agent_model: Path, root: str, env, **overrides):
    """The async trainer's `_config` for the served agent (the vLLM server at `root`) against the scripted
    environment `env`."""
    return async_tiny_config(
        tmp_path,
        model_name_or_path=str(agent_model),
        env_base_url=env.base_url,
        async_grpo=True,
        vllm_server_base_url=root,
        **overrides,
    )


# ---- on vLLM's CPU build -------------------------------------------------------------------------------------------

vllm_only = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def agent_model(request) -> Path:
    """The name task's protocol model with heads 64 wide (vLLM's CPU attention needs 32, 64 or 128): the session's
    own, which the colocated-engine tests use too (made only where vLLM is installed)."""
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    return request.getfixturevalue("wide_head_model_path")


@pytest.fixture(scope="module")
def agent_server(agent_model, tmp_path_factory):
    """`vllm serve` of the agent as the async trainer's CPU route needs it: dev mode, the project's worker
    extension, float32, processed log-probabilities. Yields (root URL, process); the last test kills it."""
    from prompt_r1.testing.vllm_process import start_vllm_server, stop_vllm_server

    log = tmp_path_factory.mktemp("async-vllm") / "server.log"
    root, process = start_vllm_server(agent_model, log)
    yield root, process
    stop_vllm_server(process)


class RecordingWorker:
    """Wraps the worker's scoring to keep every sample it queued (what the trainer could consume)."""

    def __init__(self, worker):
        self.samples = []
        score = worker.score

        def recording(*args, **kwargs):
            samples, metrics = score(*args, **kwargs)
            self.samples += samples
            return samples, metrics

        worker.score = recording


def _logged(trainer, key: str) -> list[float]:
    return [row[key] for row in trainer.state.log_history if row.get(key) is not None]


@pytest.mark.parametrize("max_staleness", [0, 2])
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_short_async_run_bounds_staleness_masks_the_environment_and_advances_the_policy(
    agent_server, agent_model, tmp_path, max_staleness
):
    import torch

    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    root, _ = agent_server
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "env: {input: 1.0, output: 2.0}\n"
    )  # dollars per 1M tokens: the environment is paid for
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.2) as env:
        config = _served_config(
            tmp_path,
            agent_model,
            root,
            env,
            prices=str(prices),
            max_staleness=max_staleness,
            max_steps=4,
            weight_decay=1.0,  # the weights move at every step, whatever the advantages
        )
        trainer = build_async_trainer(config, train_rows=name_rows(8))
        # max_inflight_tasks left to TRL: the worker keeps one step's samples of it free.
        assert (
            trainer.rollout_worker.headroom
            == config.per_device_train_batch_size * config.gradient_accumulation_steps
        )
        recorder = RecordingWorker(trainer.rollout_worker)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
    assert trainer.state.global_step == 4
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    # One sync before the worker starts, then one per step: the policy version advanced with each.
    assert trainer.model_version == 5 and trainer.weight_transfer.syncs == 5
    versions = [s.model_version for s in recorder.samples]
    assert versions[0] == 1 and max(versions) >= 2  # episodes sampled by later policies as training went on
    # Samples consumed were never older than max_staleness; with 0, the group sampled while a step trained is
    # always a version behind when its turn comes: dropped, and counted.
    assert max(_logged(trainer, "sample/staleness_max")) <= max_staleness
    dropped = sum(_logged(trainer, "sample/dropped_stale_total"))
    if max_staleness == 0:
        assert dropped >= 1
    else:
        assert max(_logged(trainer, "sample/staleness_max")) >= 1  # training went on while episodes ran
    # The importance ratio: the server sampled what the trained model computes (the file sync is exact).
    assert all(abs(r - 1.0) < 0.05 for r in _logged(trainer, "ratio"))
    # The environment's tokens are never trained on; the agent's are, with their sampling log-probabilities.
    tokenizer = trainer.processing_class
    asked = [s for s in recorder.samples if "The name is Ada" in tokenizer.decode(s.input_ids)]
    assert asked
    for s in asked:
        trained = tokenizer.decode(s.input_ids[s.completion_mask == 1])
        context = tokenizer.decode(s.input_ids[s.completion_mask == 0])
        assert "The name is Ada" in context and "The name is Ada" not in trained
        assert "<interaction_prompt>" in trained
        assert (s.old_log_probs[s.completion_mask == 1] < 0).all() and (
            s.old_log_probs[s.completion_mask == 0] == 0
        ).all()
    assert all(abs(s.advantage) < 3 for s in recorder.samples)
    assert sum(_logged(trainer, "rollout/env_calls_total")) > 0
    assert sum(_logged(trainer, "rollout/cost_usd_total")) > 0  # priced by the table the sync trainer uses


def _packed_forward(model, inputs, grad: bool = False):
    """`model`'s log-probability of each trained token of a packed micro-batch, computed as TRL's async loss reads
    it: the fused head over the tree-packed row, picked by `token_index`."""
    import torch

    mask = inputs["attention_mask"].bool()
    tree = {k: inputs[k][inputs[k] >= 0] for k in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")}
    tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
    with torch.set_grad_enabled(grad):
        out = model(
            input_ids=inputs["input_ids"][mask].unsqueeze(0),
            position_ids=inputs["position_ids"][mask].unsqueeze(0),
            shift_labels=inputs["shift_labels"][mask].unsqueeze(0),
            fused_lm_head=True,
            **tree,
        )
    return out.log_probs.flatten()[inputs["token_index"][inputs["token_index"] >= 0]]


@pytest.mark.parametrize("lora", [False, True], ids=["full-bf16", "lora"])
@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_beta_adds_the_kl_to_the_starting_policy_to_the_async_loss(
    agent_server, agent_model, tmp_path, monkeypatch, lora
):
    """`beta` > 0: the loss gains beta times TRL's k3 KL from the trained policy to the starting one (a frozen copy;
    under LoRA the policy with its adapter off), normalised as the policy loss, and its gradient reaches the policy.
    Checked against the starting model loaded again from its folder, on a batch the run trained on, after the policy
    moved. The full fine-tuning run is in bf16 mixed precision: the copy must be run in the policy's autocast."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TREE_ATTENTION
    from trl.trainer.utils import add_fused_lm_head

    import prompt_r1.training.shared.lora as lora_module
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    if lora:
        plain = lora_module.peft_config

        def away_from_zero(config):
            # The adapter starts away from zero: the policy differs from the starting one from the first step.
            adapter = plain(config)
            adapter.init_lora_weights = False
            return adapter

        monkeypatch.setattr(lora_module, "peft_config", away_from_zero)
    root, _ = agent_server
    beta = 0.5
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.05) as env:
        config = _served_config(
            tmp_path,
            agent_model,
            root,
            env,
            max_steps=3,
            weight_decay=1.0,  # the weights move at every step, whatever the advantages
            beta=beta,
            use_peft=lora,
            lora_dropout=0.0,
            bf16=not lora,
        )
        trainer = build_async_trainer(config, train_rows=name_rows(8))
        batches = []
        loss = trainer.compute_loss
        trainer.compute_loss = lambda model, inputs, *a, **k: (
            batches.append(inputs) or loss(model, inputs, *a, **k)
        )
        trainer.train()
    assert trainer.state.global_step == 3
    assert (trainer.reference.model is None) == lora  # LoRA: no second copy of the model
    if not lora:
        frozen = list(trainer.reference.model.parameters())
        assert frozen and not any(p.requires_grad for p in frozen)
    kl = _logged(trainer, "ref_kl")
    assert len(kl) == 3
    if lora:
        assert all(k > 0 for k in kl)
    else:  # the first step trains the starting policy itself; the next ones a policy that has moved
        assert kl[0] == pytest.approx(0.0, abs=1e-6) and all(k > 0 for k in kl[1:])

    # The last batch again, with and without the term, against the starting model loaded again from its folder.
    inputs = batches[-1]
    trainer.model.eval()
    reference = trainer.reference
    with_term = trainer.compute_loss(trainer.model, inputs)
    trainer.reference = None
    without = trainer.compute_loss(trainer.model, inputs)
    trainer.reference = reference
    start = AutoModelForCausalLM.from_pretrained(
        agent_model, attn_implementation=TREE_ATTENTION, dtype=torch.float32
    )
    add_fused_lm_head(start, temperature=trainer.temperature)
    # The policy's forward is in bf16 autocast when the run was (accelerate wraps it); the reloaded model's too.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        delta = _packed_forward(start, inputs) - _packed_forward(trainer.model, inputs, grad=True)
    k3 = torch.exp(delta) - delta - 1
    tokens = inputs["global_n_tokens"][0].clamp(min=1.0).item()
    expected = beta * k3.sum() / tokens / trainer.current_gradient_accumulation_steps
    assert expected.item() > 0
    assert (with_term - without).item() == pytest.approx(expected.item(), rel=1e-3, abs=1e-7)
    # The gradient: the policy loss is the same in both runs, so the difference's gradient is the term's, and it
    # is the gradient of the term computed here.
    trained = [p for p in trainer.model.parameters() if p.requires_grad]

    def gradient(value):
        grads = torch.autograd.grad(value, trained, allow_unused=True)
        return torch.cat(
            [(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(trained, grads, strict=True)]
        )

    got, want = gradient(with_term - without), gradient(expected)
    # In bf16 the difference carries the rounding of the policy loss's gradient (about 17% of the term's here), so
    # the two are compared by direction and size: a term without gradient leaves only that rounding.
    assert want.norm() > 0
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.95
    assert 0.8 < (got.norm() / want.norm()).item() < 1.25


def test_a_checkpoint_resumes_past_the_groups_that_will_never_be_trained():
    """A group dropped as stale, or with no scored episode, is never trained: the saved place must go past it, or
    every later resume would replay all the groups trained after it."""
    from types import SimpleNamespace

    from prompt_r1.training.asynchronous.trainer import trainer_class

    trainer = SimpleNamespace(_trained_groups={0, 2}, model_version=5, args=SimpleNamespace(max_staleness=1))
    # Group 1 was sampled at version 3 (5 - 3 > 1: dropped whenever its turn comes), group 3 had no scored
    # episode, group 4 (version 4) may still be trained, group 5 is in flight.
    worker = SimpleNamespace(start_group=0, finished={0: 4, 1: 3, 2: 4, 3: None, 4: 4})
    spent = [trainer_class()._spent(trainer, worker, g) for g in range(6)]
    assert spent == [True, True, True, True, False, False]


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_resumed_async_run_goes_on_from_the_first_untrained_group_and_its_policy_version(
    agent_server, agent_model, tmp_path
):
    from prompt_r1.training.asynchronous.trainer import ROLLOUT_STATE, build_async_trainer

    root, _ = agent_server
    rows = [{**row, "id": f"r{i}"} for i, row in enumerate(name_rows(8))]
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as env:

        def trainer_for(steps: int):
            config = _served_config(
                tmp_path,
                agent_model,
                root,
                env,
                max_staleness=2,
                max_steps=steps,
                save_strategy="steps",
                save_steps=2,
            )
            trainer = build_async_trainer(config, train_rows=rows)
            return trainer, RecordingWorker(trainer.rollout_worker)

        first, _ = trainer_for(2)
        first.train()
        checkpoint = tmp_path / "out" / "checkpoint-2"
        saved = json.loads((checkpoint / ROLLOUT_STATE).read_text())
        assert saved["model_version"] == first.model_version == 3  # the first sync, then one per step
        assert saved["prompt_index"] >= 2  # one group of 8 per step, none dropped before it
        second, recorder = trainer_for(4)
        second.train(resume_from_checkpoint=str(checkpoint))
    assert second.state.global_step == 4
    groups = [s.group_id for s in recorder.samples]
    assert min(groups) == saved["prompt_index"]  # not the first row again
    assert min(s.model_version for s in recorder.samples) == saved["model_version"] + 1  # synced, then on
    assert second.model_version == saved["model_version"] + 3  # the resume's sync and two steps


ASYNC_RECIPE = """async: true
use_cpu: true
bf16: false
per_device_train_batch_size: 4
num_generations: 4
learning_rate: 1.0e-4
weight_decay: 1.0
max_staleness: 2
beta: 0.5
max_turns: 2
max_turn_tokens: 24
max_total_tokens: 96
env_model: env
reward_preset: reference
logging_steps: 1
save_strategy: steps
save_steps: 1
report_to: none
seed: 0
"""


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_two_fsdp2_processes_train_async_sync_the_server_resume_and_stop_at_the_spend_cap(
    agent_server, agent_model, tmp_path
):
    """The docs' command: accelerate launch with training/accelerate/fsdp2.yaml, 2 CPU processes (gloo), the loop
    as the rollout worker on rank 0, the weights going to the vLLM server after every step, and the KL term. Then
    --resume across the two processes with a max_env_calls cap: it stops with a checkpoint (exit 4) before passing
    it, having counted every call the environment was paid for, and the totals go on from the first run's."""
    import torch
    from safetensors.torch import load_file

    root, _ = agent_server
    (tmp_path / "recipe.yaml").write_text(ASYNC_RECIPE)
    (tmp_path / "prices.yaml").write_text("env: {input: 1.0, output: 2.0}\n")  # dollars per 1M tokens
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.05) as env:

        def launch(*extra: str):
            return accelerate_launch(
                ["--config_file", str(ROOT / "training/accelerate/fsdp2.yaml"), "--num_processes", "2",
                 "-m", "prompt_r1", "train", "--config", str(tmp_path / "recipe.yaml"),
                 "--model_name_or_path", str(agent_model), "--vllm_server_base_url", root,
                 "--train_data", str(write_name_dataset(tmp_path / "names.jsonl", 16)),
                 "--env-base-url", env.base_url, "--prices", str(tmp_path / "prices.yaml"),
                 "--output_dir", str(out), *extra],
                tmp_path,
            )  # fmt: skip

        first = launch("--max_steps", "2")
        assert first.returncode == 0, f"exit {first.returncode}: {failure_lines(first.stderr)}"
        paid_first = len(env.requests_for("env"))
        state = json.loads((out / "checkpoint-2/trainer_state.json").read_text())
        total_first = [row for row in state["log_history"] if "env/total_calls" in row][-1]["env/total_calls"]
        # Room for a step's two groups and little more (a group may make 4 x 2 calls).
        cap = int(total_first) + 20
        second = launch("--max_steps", "50", "--resume", "--max_env_calls", str(cap))
        paid = len(env.requests_for("env"))
    assert "trained 2 steps" in first.stderr
    # Sharded: the checkpoint is FSDP's, and the model was saved whole once.
    assert (out / "checkpoint-2/pytorch_model_fsdp.bin").is_file()
    # The weights the server last took are the trained ones: the file it reloaded equals the saved model (tied
    # weights are sent once), the model moved, and the server sampled what the trainer computes (ratio ~ 1).
    served = load_file(out / "vllm_weights/weights.safetensors")
    saved = load_file(out / "model.safetensors")
    start = load_file(agent_model / "model.safetensors")
    assert served and all(torch.equal(served[k], saved[k]) for k in served)
    assert any(not torch.equal(saved[k], start[k]) for k in served)
    ratios = [row["ratio"] for row in state["log_history"] if "ratio" in row]
    assert ratios and all(abs(r - 1.0) < 0.05 for r in ratios)
    # The KL term across the ranks: a sharded starting policy, 0 away at the first step, then further.
    kl = [row["ref_kl"] for row in state["log_history"] if "ref_kl" in row]
    assert len(kl) == 2 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0
    assert re.search(r"\$0\.\d{4} this step, \$0\.\d{4} total", first.stderr)
    # Every call the worker paid for is in the total the checkpoint logged, trained or not.
    assert total_first == paid_first

    # Each rank exits 4; the launcher, as for any rank's non-zero exit, exits 1 and names it as the root cause.
    assert second.returncode == 1, failure_lines(second.stderr)
    assert re.search(r"exitcode\s*: 4 ", second.stderr), failure_lines(second.stderr)
    assert re.search(r"prompt-r1: resuming at group \d+: .* environment calls", second.stderr)
    assert "prompt-r1: stopped by the spend cap: max_env_calls" in second.stderr
    last = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    assert int(last.name.split("-")[1]) > 2  # it trained on, then stopped with a checkpoint
    logged = [row for row in json.loads((last / "trainer_state.json").read_text())["log_history"]
              if "env/total_calls" in row]  # fmt: skip
    assert paid <= cap and logged[-1]["env/total_calls"] == paid  # never past the cap, every call counted
    back = next(row for row in logged if row["step"] == 2)
    assert back["env/total_calls"] == total_first  # the first run's steps came back with their totals
    # The resumed run's reference is the starting model again, not the checkpoint's policy: its first step is away.
    resumed = next(row for row in json.loads((last / "trainer_state.json").read_text())["log_history"]
                   if row.get("step") == 3 and "ref_kl" in row)  # fmt: skip
    assert resumed["ref_kl"] > kl[1] / 10  # a checkpoint's policy as the reference: 0 but for noise (< 1e-6)


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_an_environment_killed_mid_run_fails_the_run_with_one_line(agent_server, agent_model, tmp_path):
    from transformers import TrainerCallback

    from prompt_r1.training.asynchronous.trainer import build_async_trainer
    from prompt_r1.training.asynchronous.worker import RolloutFailed

    root, _ = agent_server
    env = ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.1).start()

    class KillEnvironment(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            env.stop()

    config = _served_config(
        tmp_path, agent_model, root, env, env_max_retries=1, env_backoff_initial=0.05, max_steps=50
    )
    trainer = build_async_trainer(config, train_rows=name_rows(8), callbacks=[KillEnvironment()])
    started = time.monotonic()
    with pytest.raises(
        RolloutFailed, match="the environment answered none of the calls of 3 groups in a row"
    ):
        trainer.train()
    assert time.monotonic() - started < 300
    assert 1 <= trainer.state.global_step < 50


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_a_vllm_server_killed_mid_run_fails_the_run_with_one_line(agent_server, agent_model, tmp_path):
    """Runs last: it kills the module's server."""
    from transformers import TrainerCallback

    from prompt_r1.core.errors import PromptR1Error
    from prompt_r1.testing.vllm_process import stop_vllm_server
    from prompt_r1.training.asynchronous.trainer import build_async_trainer

    root, process = agent_server

    class KillServer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if process.poll() is None:
                stop_vllm_server(process, kill=True)  # the server, its engine and its worker, as a crash

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.1) as env:
        config = _served_config(tmp_path, agent_model, root, env, max_steps=50)
        trainer = build_async_trainer(config, train_rows=name_rows(8), callbacks=[KillServer()])
        started = time.monotonic()
        with pytest.raises(PromptR1Error, match=f"the vLLM server at {root}|{root}") as raised:
            trainer.train()
    assert time.monotonic() - started < 300
    assert "\n" not in str(raised.value)
    assert trainer.state.global_step >= 1
