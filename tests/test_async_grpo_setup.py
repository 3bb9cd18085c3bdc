"""Asynchronous GRPO without vLLM: the CPU tree attention against the plain forward, the KL term's
normalisation, the group advantages, each trainer's config checks, the async switch on the command line and in a
recipe, and a launch the trainer cannot run on refused in one line. The short async trainings on vLLM's CPU build
are in tests/test_async_grpo.py."""

from __future__ import annotations

import contextlib
import os

import pytest
from helpers import async_tiny_config as _config
from helpers import name_rows, run_cli

from prompt_r1.core.errors import ConfigError
from prompt_r1.testing.servers import ScriptedServer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL 1.16's async trainer is experimental: known here


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


def test_the_switch_is_async_on_the_command_line_and_in_a_recipe(tmp_path, monkeypatch):
    """`--async` and `async: true` both pick the async trainer; its refusals come before any model loads (in this
    process: the recipe's model does not exist, so a refusal that came later would fail on it)."""
    monkeypatch.chdir(tmp_path)  # the recipe's output_dir is relative
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model_name_or_path: unused\noutput_dir: out\nenv_base_url: http://127.0.0.1:9/v1\nnum_iterations: 2\n"
        "use_cpu: true\nbf16: false\n"
    )

    def train(*args: str) -> tuple[int, str]:
        code, _, err = run_cli(["train", "--config", recipe, *args])
        return code, err

    code, err = train("--async")
    assert code == 2, err[-2000:]
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("prompt-r1: error: the async trainer does not support num_iterations")
    )
    recipe.write_text(recipe.read_text() + "async: true\n")
    code, err = train()
    assert code == 2 and "the async trainer does not support num_iterations" in err
    recipe.write_text(recipe.read_text().replace("async: true\n", "max_staleness: 1\n"))
    code, err = train()
    assert code == 2, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "prompt-r1: error: the synchronous trainer does not support max_staleness: 1 (a setting of the async "
        "trainer: add async: true (--async), or drop it)"
    )
    recipe.write_text(recipe.read_text().replace("max_staleness: 1\n", ""))
    code, err = train("--max_staleness", "1")  # a flag: the same line, without a value to show
    assert code == 2 and "does not support max_staleness (a setting of the async" in err
    assert not (tmp_path / "out").exists()  # refused before the run made anything


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
            build_async_trainer(config, train_rows=name_rows(8))
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
