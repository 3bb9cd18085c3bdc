"""Door codes: an offline task whose reward needs the environment, to watch GRPO teach a tiny agent to collaborate.

A question asks for the code of one door ("Which code opens the jade door?"). Only the environment knows the
codes: it gives a door's code when the agent's prompt names that one door ("The jade door code is kappa."), asks
which door when the prompt names none, and refuses a prompt that names several. So, under the double-constrained
reward (the `reference` preset's format gate):
- answering at once is never gated in (one turn cannot reach the format cap ε): reward −0.4 whatever the answer;
- asking well-formed but naming another door, or not copying the code back, earns 0 (a guessed code rarely hits);
- asking about the question's own door and copying the reply's code earns 1.

The facts are 24 doors' codes (8 possible codes), fixed for a run: few enough to ask about, too many to learn by
heart in a short run (with 4 doors, GRPO learned the table and stopped reading the reply).

The agent starts from `build_door_model`, a tiny model fine-tuned in two stages in which every reply's code is
drawn afresh: fine-tuning holds no facts, so it can teach copying a reply but never a code to recall (fine-tuned
on the run's own table, the agent learned the table and answered from memory). First on episodes that ask about
the question's door and copy the reply's code: the skills of reading the question and the reply, which a
pretrained model has and a tiny one does not learn from a mixture of behaviours alone (fine-tuned on the mixture
only, it named a door with no regard to the question, and GRPO did not change that in 150 steps). Then on the
mixture, which undoes that stage's preference (in GRPO's first ten steps 21-32% of episodes asked about the right
door over three seeds, where no preference gives 25%): each behaviour equally often (answer at once with any
code, ask without naming a door, ask about the question's door, ask about the door after it in `DOORS`), and
given a reply, the reply's code or as often another one. What GRPO adds is the choice. How far it gets, per seed, and what the
ablations do, is in `evals/bench/learning.py` and its results; `tests/test_learning.py` checks the gain in CI.

Needs the `dev` extra (the tokenizer and the scripted environment).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CODES",
    "DOORS",
    "build_door_model",
    "door_codes",
    "door_environment",
    "door_rows",
    "format_episodes",
    "grpo_config",
    "named_doors",
    "training_rows",
    "question_for",
]

# Many doors, so that the facts are not learned by heart in a short run: the agent has to ask.
DOORS = (
    "amber", "azure", "beige", "black", "blue", "bronze", "brown", "coral", "cream", "cyan", "gold", "green",
    "grey", "indigo", "ivory", "jade", "lilac", "lime", "navy", "olive", "pink", "plum", "rose", "ruby",
)  # fmt: skip
CODES = ("alpha", "delta", "gamma", "kappa", "omega", "sigma", "theta", "zeta")  # words: single tokens

ASK = "<think>ask</think><interaction_prompt>{prompt}</interaction_prompt>"
ANSWER = "<think>{thought}</think><answer>{code}</answer>"


def question_for(door: str) -> str:
    return f"Which code opens the {door} door?"


def door_codes(seed: int = 0) -> dict[str, str]:
    """The environment's facts: one code per door, fixed for a run (drawn from `seed`)."""
    rng = random.Random(seed)
    return {door: rng.choice(CODES) for door in DOORS}


def door_rows(n: int, seed: int = 0, codes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`n` dataset rows (id, question, golden_answers), the doors taken in turn from a shuffled cycle."""
    codes = codes or door_codes(seed)
    rng = random.Random(seed + 1)
    doors = [DOORS[i % len(DOORS)] for i in range(n)]
    rng.shuffle(doors)
    return [
        {"id": f"door-{i}", "question": question_for(door), "golden_answers": [codes[door]]}
        for i, door in enumerate(doors)
    ]


def named_doors(text: str) -> list[str]:
    """The doors a text names, as whole words, in `DOORS` order."""
    return [door for door in DOORS if re.search(rf"\b{door}\b", text, re.IGNORECASE)]


def door_environment(codes: dict[str, str]) -> Callable[[dict[str, Any]], str]:
    """The environment as a `ScriptedServer` responder: it reads the agent's prompt (the last user message)."""

    def respond(body: dict[str, Any]) -> str:
        messages = body.get("messages") or [{}]
        content = messages[-1].get("content", "")
        text = content if isinstance(content, str) else " ".join(str(part) for part in content)
        named = named_doors(text)
        if not named:
            return "Name the door."
        if len(named) > 1:
            return "Name one door."
        return f"The {named[0]} door code is {codes[named[0]]}."

    return respond


def _reply(door: str | None, rng: random.Random) -> tuple[str, str | None]:
    """The environment's reply to a fine-tuning prompt about `door` and the code in it: a code drawn afresh for
    every episode, so that fine-tuning holds no facts, only replies to copy."""
    if door is None:
        return "Name the door.", None
    code = rng.choice(CODES)
    return f"The {door} door code is {code}.", code


def format_episodes(n: int = 256, seed: int = 0) -> list[tuple[str, str, Any, Any]]:
    """Episodes of the protocol's format for `build_protocol_model`, every behaviour equally likely (see the
    module docstring): nothing in them says which behaviour the reward prefers, and no code is a fact."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        door = rng.choice(DOORS)
        question = question_for(door)
        behaviour = rng.choice(("answer", "ask-none", "ask-own", "ask-other"))
        if behaviour == "answer":
            episodes.append((question, ANSWER.format(thought="guess", code=rng.choice(CODES)), None, None))
            continue
        if behaviour == "ask-none":
            asked = None
        else:  # the question's door, or as often the next one: either way the question is read
            asked = door if behaviour == "ask-own" else DOORS[(DOORS.index(door) + 1) % len(DOORS)]
        prompt = question_for(asked) if asked else "Which code?"
        reply, known = _reply(asked, rng)
        code = known if known and rng.random() < 0.5 else rng.choice([c for c in CODES if c != known])
        episodes.append((question, ASK.format(prompt=prompt), reply, ANSWER.format(thought="ok", code=code)))
    return episodes


def reading_episodes(n: int = 256, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """Episodes that ask about the question's door and give the reply's code: the first fine-tuning stage of
    `build_door_model`, which teaches reading the question and copying the reply (a pretrained model's skills).
    The reply's code is drawn afresh each time, so copying is the only way to fit them."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        door = rng.choice(DOORS)
        reply, code = _reply(door, rng)
        episodes.append(
            (
                question_for(door),
                ASK.format(prompt=question_for(door)),
                reply,
                ANSWER.format(thought="ok", code=code),
            )
        )
    return episodes


def build_door_model(
    path: str | Path,
    *,
    seed: int = 0,
    steps: int = 300,
    episodes: int = 512,
    batch_size: int = 64,
    **shape: Any,
) -> Path:
    """The tiny agent for the task, fine-tuned in two stages of `steps` each: `reading_episodes` give it the skills
    (a tiny model does not learn to read the question from the mixture alone), then `format_episodes` undo any
    preference (see the module docstring). No code in either stage is a fact: each reply's is drawn afresh.
    Its tokenizer knows the protocol's tags and its instruction as one
    token each, and the doors and codes as words, so a prompt is about thirty tokens and the model fine-tunes
    and trains in seconds."""
    from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE
    from prompt_r1.testing.tiny_models import build_protocol_model

    corpus = [
        *(f"{question_for(d)} The {d} door code is {c}." for d in DOORS for c in CODES),
        "Name the door. Name one door. Which code?",
        *(ANSWER.format(thought="ok", code=c) for c in CODES),
    ]
    tags = [f"<{t}>" for t in ("think", "interaction_prompt", "answer", "interaction_response")]
    tags += [t.replace("<", "</") for t in tags]
    common = dict(seed=seed, batch_size=batch_size, steps=steps)
    path = Path(path)
    build_protocol_model(
        path,
        reading_episodes(episodes // 2, seed=seed),
        corpus=corpus,
        added_tokens=[INSTRUCTION_TEMPLATE, *tags],
        **common,
        **shape,
    )
    return build_protocol_model(path, format_episodes(episodes, seed=seed), start_from=path, **common)


def training_rows(n: int, seed: int = 0, codes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`door_rows` as GRPO's training rows: the protocol's first message as the prompt, and the golden answers."""
    from prompt_r1.core.prompts import question_message

    return [
        {
            "prompt": [{"role": "user", "content": question_message(r["question"])}],
            "golden_answers": r["golden_answers"],
        }
        for r in door_rows(n, seed=seed, codes=codes)
    ]


def grpo_config(output_dir: str | Path, model: str | Path, env_base_url: str, **settings: Any) -> Any:
    """The GRPO settings the learning benchmark and its CI test train with (the `train` extra): two turns, the
    `reference` reward preset (its gate lets a two-turn episode through), no KL term; `settings` override them."""
    from prompt_r1.training.config import PromptR1GRPOConfig

    defaults: dict[str, Any] = dict(
        output_dir=str(output_dir),
        model_name_or_path=str(model),
        env_model="env",
        env_base_url=env_base_url,
        env_api_key_env="PROMPT_R1_DOOR_TASK_NO_KEY",
        env_rate_limit=1_000_000,  # the scripted environment has no provider's limit
        per_device_train_batch_size=32,
        num_generations=8,
        max_turns=2,
        max_turn_tokens=32,  # a turn that asks is 14 tokens; room to go wrong
        max_total_tokens=128,
        learning_rate=2e-3,
        beta=0.0,
        temperature=1.0,
        reward_preset="reference",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
        data_seed=0,
    )
    return PromptR1GRPOConfig(**{**defaults, **settings})
