"""The async trainer's KL term: `beta` times the per-token KL from the trained policy to the starting one.

    config = PromptR1AsyncGRPOConfig(..., beta=0.04)    # 0 (the default, as the synchronous trainer's): no term

TRL's async trainer has no reference model. Its samples are up to `max_staleness` policies old and its loss is
clipped only against the policy that sampled them, so nothing holds the policy near where it started; on some agents
that costs what it learns (docs/benchmarks.md, "The KL term is the lead"). The term here is the synchronous
trainer's: TRL's k3 estimator, exp(r - p) - (r - p) - 1 with p the policy's and r the reference's log-probability of
each trained token, summed and normalised as the async policy loss is (over the micro-batch's trained tokens
across the ranks, then over the accumulation steps).

The reference is the starting policy, whatever the run resumes from:
- full fine-tuning: a second copy of the model loaded from `model_name_or_path` as TRL loads the policy (its tree
  attention, its dtype), frozen, and run in the policy's autocast under mixed precision; under FSDP2 it is sharded
  across the ranks (TRL's `prepare_fsdp`), so each rank holds its share and every rank takes part in each forward;
- LoRA: the policy itself with its adapter switched off, no second copy.

The reference's forward reads the same packed rows as the policy's: `ReferencePolicy.capture` keeps the keywords and
outputs of the policy's forward inside TRL's `compute_loss`, so the policy runs once, as without the term.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["ReferencePolicy"]


class ReferencePolicy:
    """The frozen starting policy of one trainer, and the KL term against it (`kl_loss`)."""

    def __init__(self, trainer: Any) -> None:
        from accelerate.utils import is_peft_model

        self.trainer = trainer
        self.beta = float(trainer.args.beta)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        self.model = None if is_peft_model(policy) else self._load(trainer)

    @staticmethod
    def _load(trainer: Any) -> Any:
        """A frozen copy of the starting policy, loaded as `AsyncGRPOTrainer.__init__` loads the trained one."""
        from trl.experimental.async_grpo.packing import TREE_ATTENTION
        from trl.models.utils import prepare_fsdp
        from trl.trainer.utils import add_fused_lm_head, create_model_from_path, disable_dropout_in_model

        args = trainer.args
        # The trainer was built from model_name_or_path (`build_async_trainer`): the same folder or hub id.
        init = dict(args.model_init_kwargs or {})
        init.setdefault("trust_remote_code", args.trust_remote_code)
        init.setdefault("dtype", args.dtype)
        model = create_model_from_path(
            args.model_name_or_path, device_map=None, attn_implementation=TREE_ATTENTION, **init
        )
        add_fused_lm_head(model, temperature=trainer.temperature)
        disable_dropout_in_model(model)
        model.requires_grad_(False)
        if trainer.accelerator.is_fsdp2:
            return prepare_fsdp(model, trainer.accelerator)
        model.to(trainer.accelerator.device)
        return model.eval()

    @staticmethod
    @contextlib.contextmanager
    def capture(model: Any) -> Iterator[dict[str, Any]]:
        """While open: the keywords and outputs of `model`'s last forward, in the dict yielded."""
        seen: dict[str, Any] = {}

        def keep(module: Any, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
            seen["kwargs"], seen["output"] = kwargs, output

        handle = model.register_forward_hook(keep, with_kwargs=True)
        try:
            yield seen
        finally:
            handle.remove()

    def log_probs(self, model: Any, kwargs: dict[str, Any]) -> Any:
        """The reference's log-probability of every token the policy's forward scored (shaped as its output)."""
        import torch

        kwargs = {k: v for k, v in kwargs.items() if k != "output_router_logits"}  # its aux loss is not used
        accelerator = self.trainer.accelerator
        # Under mixed precision accelerate runs the policy's forward in autocast: the copy's forward too, or the
        # two differ by precision alone (a KL above 0 at the first step, and a bias in every one after).
        with torch.no_grad(), accelerator.autocast():
            if self.model is not None:
                return self.model(**kwargs).log_probs
            with accelerator.unwrap_model(model).disable_adapter():
                return model(**kwargs).log_probs

    def kl_loss(self, model: Any, inputs: dict[str, Any], seen: dict[str, Any]) -> Any:
        """`beta` times the summed k3 KL of this micro-batch's trained tokens, normalised as TRL's async policy loss;
        logs the mean KL per trained token of the micro-batch, every rank's, as `ref_kl`."""
        import torch

        trainer = self.trainer
        selected = inputs["token_index"][inputs["token_index"] >= 0]
        policy = seen["output"].log_probs.flatten()[selected]
        reference = self.log_probs(model, seen["kwargs"]).flatten()[selected]
        delta = reference - policy
        kl = torch.exp(delta) - delta - 1
        tokens_per_rank = (inputs["global_n_tokens"][0] / trainer.accelerator.num_processes).clamp(min=1.0)
        steps = trainer.current_gradient_accumulation_steps
        loss = self.beta * kl.sum() / tokens_per_rank.to(torch.float32) / steps
        with torch.no_grad():
            local = torch.stack([kl.detach().sum(), torch.tensor(float(kl.numel()), device=kl.device)])
            total, count = trainer.accelerator.reduce(local.to(torch.float32), reduction="sum").tolist()
            trainer._metrics["train"]["ref_kl"].append(total / max(count, 1.0))
        return loss
