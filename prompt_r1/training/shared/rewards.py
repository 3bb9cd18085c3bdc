"""The reward functions both trainers score episodes with: the double-constrained reward of the config's preset
(`prompt_r1.scoring.rewards`), then its format and answer parts, logged with weight 0.

Add a reward: write it in `prompt_r1/scoring/rewards.py` (TRL's signature), then list it here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["reward_functions"]


def reward_functions(config: Any) -> list:
    """The total reward, then its format and answer parts (weight 0: logged, not trained on)."""
    from prompt_r1.scoring.rewards import trl_reward

    coefficients = config.reward_coefficients()
    return [trl_reward(config.reward_preset, part, **coefficients) for part in ("total", "format", "answer")]
