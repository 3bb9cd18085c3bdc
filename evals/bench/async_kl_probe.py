"""A probe, not the product: `learning.py` with a KL term added to the async trainer's loss.

    KL_BETA=0.04 python evals/bench/async_kl_probe.py --async --seed0 S --seeds 1 [learning.py's flags]

Run from the repository root. The term is the synchronous trainer's (TRL's k3 estimator, `beta` times the per-token
KL to the starting policy, normalised as the policy loss is), against a frozen copy of the policy taken at the first
step. One process only: under FSDP2 the copy would be of one rank's shards. It tests whether the missing KL term is
why the async trainer learns less than the synchronous one on some agents (docs/benchmarks.md); the async trainer
itself refuses `beta` until the term is built into it."""

import copy
import os
import runpy
import sys

import torch

import prompt_r1.training.asynchronous.trainer as t

BETA = float(os.environ.get("KL_BETA", "0.04"))
original = t.trainer_class


def trainer_class():
    from trl.trainer.utils import add_fused_lm_head

    base = original()

    class WithKL(base):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            # The first step: the weights are still the starting policy's.
            if getattr(self, "_ref", None) is None:
                ref = copy.deepcopy(self.accelerator.unwrap_model(model))
                # The fused forward closes over the trained model: rebuild it on the copy.
                ref.__dict__.pop("forward", None)
                add_fused_lm_head(ref, temperature=self.temperature, outputs=("log_probs", "entropy"))
                ref.requires_grad_(False)
                ref.eval()
                self._ref = ref
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mask_bool = inputs["attention_mask"].bool()
            selected = inputs["token_index"] >= 0
            token_index = inputs["token_index"][selected]
            tree = {
                k: inputs[k][inputs[k] >= 0]
                for k in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")
            }
            tree["tree_max_seqlen_q"], tree["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][0].tolist()
            kw = dict(
                input_ids=inputs["input_ids"][mask_bool].unsqueeze(0),
                position_ids=inputs["position_ids"][mask_bool].unsqueeze(0),
                shift_labels=inputs["shift_labels"][mask_bool].unsqueeze(0),
                fused_lm_head=True,
                **tree,
            )
            logp = model(**kw).log_probs.flatten()[token_index]
            with torch.no_grad():
                ref = self._ref(**kw).log_probs.flatten()[token_index]
            d = ref - logp
            kl = torch.exp(d) - d - 1
            tokens = (inputs["global_n_tokens"][0] / self.accelerator.num_processes).clamp(min=1.0)
            mean_kl = kl.detach().mean().item()
            self._metrics["train"]["ref_kl"].append(mean_kl)
            if self.state.global_step % 10 == 0:
                print(
                    f"kl_diag: step {self.state.global_step} beta {BETA} ref_kl {mean_kl:.5f} "
                    f"tokens {kl.numel()}",
                    file=sys.stderr,
                    flush=True,
                )
            return (
                loss + BETA * kl.sum() / tokens.to(torch.float32) / self.current_gradient_accumulation_steps
            )

    return WithKL


if "--processes" in sys.argv[1:] and sys.argv[sys.argv.index("--processes") + 1 :][:1] != ["1"]:
    sys.exit("async_kl_probe.py: one process only (the reference copy is taken of the unsharded model)")
t.trainer_class = trainer_class
sys.argv = ["learning.py", *sys.argv[1:]]
sys.path.insert(0, "evals/bench")
runpy.run_path("evals/bench/learning.py", run_name="__main__")
