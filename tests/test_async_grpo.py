"""Asynchronous GRPO: TRL's AsyncGRPOTrainer with the LangGraph loop as its rollout worker, on CPU.

The fast tests need no vLLM: the CPU tree attention against the plain forward, the advantages, and the config
switch. The rest run short async trainings of a tiny agent served by `vllm serve` (vLLM's CPU build) against a
scripted environment with latency on 127.0.0.1: staleness bounded and stale samples dropped and counted, the
environment's tokens masked, the policy version advancing with every file sync, two FSDP2 processes under
accelerate (the server's weights, --resume, the max_env_calls stop; slow), and a killed environment or vLLM
server failing the run with one line instead of a hang."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import NAME_QUESTION, NAME_RESPONSE, NAME_TURN_1, NAMES
from helpers import (
    ROOT,
    accelerate_launch,
    failure_lines,
    run_cli_process,
    tiny_grpo_config,
    write_name_dataset,
)

from prompt_r1.core.errors import ConfigError
from prompt_r1.testing.servers import ScriptedServer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL 1.16's async trainer is experimental: known here


# ---- without vLLM ------------------------------------------------------------------------------------------------


def test_the_cpu_tree_attention_computes_what_the_plain_forward_computes(tmp_path):
    """Three samples sharing a prompt, packed into one trie row as the async trainer packs them: each trained
    token's log-probability equals the one a plain forward of that sample alone gives."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TREE_ATTENTION, TreeRow, register_tree_attention
    from trl.trainer.utils import add_fused_lm_head

    from prompt_r1.testing.tiny_models import build_tiny_model
    from prompt_r1.training.asynchronous import on_cpu as async_cpu

    build_tiny_model(tmp_path / "m", hidden_size=64, heads=4, kv_heads=2)  # grouped-query attention too
    register_tree_attention()
    assert async_cpu.install("cpu")
    tree = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation=TREE_ATTENTION)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager")
    add_fused_lm_head(tree, outputs=("log_probs", "entropy"))
    rng = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 300, (12,), generator=rng).tolist()
    row, samples = TreeRow(), []
    for n in (7, 9, 4):
        ids = prompt + torch.randint(5, 300, (n,), generator=rng).tolist()
        sample = {
            "input_ids": torch.tensor(ids),
            "completion_mask": torch.tensor([0] * len(prompt) + [1] * n),
            "old_log_probs": torch.zeros(len(ids)),
            "advantage": 1.0,
            "group_id": 0,
        }
        samples.append(sample)
        row.add(sample)
    packed = row.pack()
    assert len(packed["input_ids"]) < sum(len(s["input_ids"]) for s in samples)  # the prompt forwarded once
    out = tree(
        input_ids=packed["input_ids"][None],
        position_ids=packed["position_ids"][None],
        shift_labels=packed["shift_labels"][None],
        fused_lm_head=True,
        tree_kv_index=packed["tree_kv_index"],
        tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
        tree_cu_seqlens_k=packed["tree_cu_seqlens_k"],
        tree_max_seqlen_q=int(packed["tree_max_seqlens"][0]),
        tree_max_seqlen_k=int(packed["tree_max_seqlens"][1]),
    )
    mine = out.log_probs.flatten()[packed["token_index"]]
    theirs = []
    with torch.no_grad():
        for s in samples:
            logprobs = plain(input_ids=s["input_ids"][None]).logits[0].log_softmax(-1)
            theirs += [
                logprobs[t - 1, s["input_ids"][t]].item()
                for t in range(1, len(s["input_ids"]))
                if s["completion_mask"][t]
            ]
    assert len(theirs) == len(mine) == 20
    assert (mine - torch.tensor(theirs)).abs().max().item() < 1e-5


def test_the_kl_term_is_normalised_as_the_async_policy_loss_across_ranks_and_accumulation():
    """`ReferencePolicy.kl_loss` on hand-made log-probabilities: beta times the summed k3 KL of the selected tokens,
    over the micro-batch's trained tokens per rank (all ranks' tokens / processes) and the accumulation steps, as
    TRL's async policy loss is normalised; the gradient reaches the policy's log-probabilities; `ref_kl` is the mean
    over the tokens of every rank (the reduce sums them). The trainer is a stand-in: only its arithmetic is under test
    here (the real trainer's term is checked against a reloaded starting model below)."""
    from collections import defaultdict
    from types import SimpleNamespace

    import torch

    from prompt_r1.training.asynchronous.reference import ReferencePolicy

    policy = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -0.1]], requires_grad=True)
    reference = torch.tensor([[-1.5, -2.0, -0.4, -1.0, -0.1]])
    reduced = []

    def reduce(tensor, reduction):
        assert reduction == "sum"
        reduced.append(tensor.clone())
        return tensor + torch.tensor(
            [0.3, 9.0]
        )  # the other rank's: a KL sum of 0.3 over its 9 trained tokens

    accelerator = SimpleNamespace(
        num_processes=2, reduce=reduce, autocast=contextlib.nullcontext, unwrap_model=lambda m: m
    )
    trainer = SimpleNamespace(
        accelerator=accelerator,
        current_gradient_accumulation_steps=4,
        _metrics={"train": defaultdict(list)},
        args=SimpleNamespace(beta=0.5),
    )
    term = ReferencePolicy.__new__(ReferencePolicy)
    term.trainer, term.beta = trainer, 0.5
    term.model = lambda **kwargs: SimpleNamespace(log_probs=reference)
    # Tokens 0, 2 and 3 are trained (-1: padding); the step trained 12 tokens over the two ranks.
    inputs = {"token_index": torch.tensor([[0, 2, 3, -1, -1]]), "global_n_tokens": torch.tensor([12.0, 12.0])}
    loss = term.kl_loss(None, inputs, {"output": SimpleNamespace(log_probs=policy), "kwargs": {}})

    d = torch.tensor([-0.5, 0.1, 2.0])  # reference - policy on the trained tokens
    k3 = torch.exp(d) - d - 1
    assert loss.item() == pytest.approx(0.5 * k3.sum().item() / (12 / 2) / 4, rel=1e-6)
    loss.backward()
    assert policy.grad[0, [0, 2, 3]].abs().min() > 0 and policy.grad[0, [1, 4]].abs().max() == 0
    assert reduced[0].tolist() == pytest.approx([k3.sum().item(), 3.0])
    assert trainer._metrics["train"]["ref_kl"] == [pytest.approx((k3.sum().item() + 0.3) / 12)]


def test_group_advantages_leave_episodes_without_a_reward_out_of_the_baseline():
    from prompt_r1.training.asynchronous.worker import group_advantages

    assert group_advantages([1.0, 0.0, None, 1.0, 0.0]) == pytest.approx(
        [1.0, -1.0, None, 1.0, -1.0], abs=1e-6
    )
    assert group_advantages([0.5, 0.5]) == [0.0, 0.0]  # equal rewards: nothing to learn, nothing invented
    assert group_advantages([None, None]) == [None, None]


def _config(tmp_path: Path, **overrides):
    """The tiny run's config (helpers.TINY_GRPO) at 8 episodes a step; `async_grpo=True` gives the async
    trainer's (`trainer_config`)."""
    settings = dict(
        per_device_train_batch_size=8, num_generations=8, max_steps=3, learning_rate=1e-4, bf16=False
    )
    return tiny_grpo_config(tmp_path / "out", **{**settings, **overrides})


def _served_config(tmp_path: Path, agent_model: Path, root: str, env, **overrides):
    """The async trainer's `_config` for the served agent (the vLLM server at `root`) against the scripted
    environment `env`."""
    return _config(
        tmp_path,
        model_name_or_path=str(agent_model),
        env_base_url=env.base_url,
        async_grpo=True,
        vllm_server_base_url=root,
        **overrides,
    )


def test_each_trainer_has_its_own_config_checked_when_built_with_one_line_per_refused_key(tmp_path):
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from prompt_r1.training import PromptR1AsyncGRPOConfig, PromptR1GRPOConfig

    args = _config(tmp_path, async_grpo=True, max_staleness=2, epsilon=0.3, learning_rate=3e-4)
    assert isinstance(args, PromptR1AsyncGRPOConfig) and isinstance(args, AsyncGRPOConfig)
    assert not isinstance(args, GRPOConfig)  # TRL's way: the async trainer's own config, not the sync one's
    assert (args.max_staleness, args.epsilon, args.learning_rate, args.num_generations) == (2, 0.3, 3e-4, 8)
    assert args.max_completion_length == 96 and args.token_budget == 0  # a fixed number of episodes per step
    assert _config(tmp_path, async_grpo=True).max_staleness == 4  # TRL's default when unset
    assert isinstance(_config(tmp_path), PromptR1GRPOConfig)

    # A key the chosen trainer does not have: one line naming it, its value and what to do instead.
    with pytest.raises(
        ConfigError,
        match=r"^the async trainer does not support num_iterations: 2 \(it takes one gradient step per batch: "
        r"drop num_iterations\)$",
    ):
        _config(tmp_path, async_grpo=True, num_iterations=2)
    # Both trainers have the KL term, with the same default (none) and the same range.
    assert _config(tmp_path, async_grpo=True, beta=0.001).beta == 0.001
    assert _config(tmp_path, async_grpo=True).beta == _config(tmp_path).beta == 0.0
    with pytest.raises(ConfigError, match=r"^beta must be a finite number ≥ 0, got -0.1$"):
        _config(tmp_path, async_grpo=True, beta=-0.1)
    with pytest.raises(
        ConfigError, match=r"vllm_sync_check: True \(its sync is checked by its importance ratio"
    ):
        _config(tmp_path, async_grpo=True, vllm_sync_check=True)
    # TRL's async config has top_k; the loop's served agent does not send it.
    with pytest.raises(
        ConfigError, match=r"top_k: 5 \(the served agent samples with temperature and top_p\)"
    ):
        _config(tmp_path, async_grpo=True, top_k=5)
    with pytest.raises(
        ConfigError,
        match=r"the synchronous trainer does not support max_staleness: 2 \(a setting of the async",
    ):
        _config(tmp_path, max_staleness=2)
    # Checked when built, whichever trainer: the async builder no longer skips the range checks.
    with pytest.raises(ConfigError, match="max_staleness must be"):
        _config(tmp_path, async_grpo=True, max_staleness=-1)
    with pytest.raises(ConfigError, match="learning_rate must be a finite number > 0, got nan"):
        _config(tmp_path, async_grpo=True, learning_rate=float("nan"))

    # The call ledger and the spend caps: both trainers'; reproducible rollouts: the sync trainer's only.
    sync = _config(tmp_path)
    assert (sync.call_ledger, sync.reproducible_rollouts) == (True, True)
    capped = _config(tmp_path, async_grpo=True, max_env_calls=40, max_env_cost=0.5)
    assert (capped.call_ledger, capped.max_env_calls, capped.max_env_cost) == (True, 40, 0.5)
    with pytest.raises(ConfigError, match=r"reproducible_rollouts: True \(the worker's episodes finish"):
        _config(tmp_path, async_grpo=True, reproducible_rollouts=True)
    with pytest.raises(ConfigError, match=r"^max_env_calls must be a positive number .*got 0$"):
        _config(tmp_path, async_grpo=True, max_env_calls=0)


def test_the_switch_is_async_on_the_command_line_and_in_a_recipe(tmp_path):
    """`--async` and `async: true` both pick the async trainer; its refusals come before any model loads."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: unused\noutput_dir: out\nenv_base_url: http://127.0.0.1:9/v1\nnum_iterations: 2\n"
        "use_cpu: true\nbf16: false\n"
    )

    def train(*args: str) -> subprocess.CompletedProcess:
        return run_cli_process(
            ["train", "--config", recipe, *args], timeout=300, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"}
        )

    done = train("--async")
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("prompt-r1: error: the async trainer does not support num_iterations")
    )
    recipe.write_text(recipe.read_text() + "async: true\n")
    assert "the async trainer does not support num_iterations" in train().stderr
    recipe.write_text(recipe.read_text().replace("async: true\n", "max_staleness: 1\n"))
    done = train()
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "prompt-r1: error: the synchronous trainer does not support max_staleness: 1 (a setting of the async "
        "trainer: add async: true (--async), or drop it)"
    )
    recipe.write_text(recipe.read_text().replace("max_staleness: 1\n", ""))
    done = train("--max_staleness", "1")  # a flag: the same line, without a value to show
    assert done.returncode == 2 and "does not support max_staleness (a setting of the async" in done.stderr


def test_a_launch_the_trainer_cannot_run_on_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    """FSDP with the synchronous trainer, DeepSpeed with the async one (as `accelerate launch` with such a config
    sets them), and a vLLM server that serves another model than the trainer's."""
    from prompt_r1.testing.tiny_models import build_tiny_model
    from prompt_r1.training.asynchronous.trainer import build_async_trainer, same_model

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(
        ConfigError,
        match=r"^the synchronous trainer does not run on FSDP: .*\(training/accelerate/fsdp2.yaml\)$",
    ):
        _config(tmp_path)
    assert _config(tmp_path, async_grpo=True).async_grpo  # the async trainer's way across processes
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match=r"^the async trainer does not support deepspeed \(.*fsdp2.yaml\)$"):
        _config(tmp_path, async_grpo=True)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")

    model = build_tiny_model(tmp_path / "mine")
    with ScriptedServer(
        {"agent": lambda body: "hi"}, model_roots={"agent": str(tmp_path / "theirs")}
    ) as served:
        config = _config(
            tmp_path, model_name_or_path=str(model), async_grpo=True, vllm_server_base_url=served.base_url
        )
        with pytest.raises(ConfigError) as refused:
            build_async_trainer(config, train_rows=_rows())
    assert str(refused.value) == (
        f"the vLLM server at {served.base_url.removesuffix('/v1')} serves {tmp_path / 'theirs'}, but the trainer "
        f"trains {model}: start the server on the trainer's model ("
        + str(refused.value).split("model (", 1)[1]
    )
    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()  # refused before anything ran
    # The same folder, or a copy of it, is the trainer's model; another model is not.
    import shutil

    shutil.copytree(model, tmp_path / "copy")
    assert same_model(str(tmp_path / "copy"), str(model)) and same_model(str(model), str(model))
    assert not same_model(str(build_tiny_model(tmp_path / "other", hidden_size=64)), str(model))


# ---- on vLLM's CPU build -------------------------------------------------------------------------------------------

vllm_only = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def agent_model(tmp_path_factory) -> Path:
    """The name task's protocol model with heads 64 wide (vLLM's CPU attention needs 32, 64 or 128)."""
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    from prompt_r1.testing.tiny_models import build_protocol_model

    episodes = [
        (NAME_QUESTION, NAME_TURN_1, NAME_RESPONSE, f"<think>ok</think><answer>{n}</answer>") for n in NAMES
    ]
    path = tmp_path_factory.mktemp("async-agent") / "model"
    return build_protocol_model(path, episodes, hidden_size=128, heads=2, kv_heads=1, steps=120)


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


def _rows():
    from prompt_r1.core.prompts import question_message

    return [
        {"prompt": [{"role": "user", "content": question_message(NAME_QUESTION)}], "golden_answers": ["Ada"]}
    ] * 8


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
        trainer = build_async_trainer(config, train_rows=_rows())
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
        trainer = build_async_trainer(config, train_rows=_rows())
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
    rows = [{**row, "id": f"r{i}"} for i, row in enumerate(_rows())]
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
    trainer = build_async_trainer(config, train_rows=_rows(), callbacks=[KillEnvironment()])
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
        trainer = build_async_trainer(config, train_rows=_rows(), callbacks=[KillServer()])
        started = time.monotonic()
        with pytest.raises(PromptR1Error, match=f"the vLLM server at {root}|{root}") as raised:
            trainer.train()
    assert time.monotonic() - started < 300
    assert "\n" not in str(raised.value)
    assert trainer.state.global_step >= 1
