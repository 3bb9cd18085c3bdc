"""Door codes: an offline task whose reward needs the environment, to watch GRPO teach a tiny agent to collaborate.

A question asks for the code of one door ("Which code opens the jade door?"). Only the environment knows the
codes: it gives a door's code when the agent's prompt names that one door ("The jade door code is kappa."), asks
which door when the prompt names none, and refuses a prompt that names several. So, under the double-constrained
reward (the `reference` preset's format gate):
- answering at once is never gated in (one turn cannot reach the format cap ε): reward −0.4 whatever the answer;
- asking well-formed but naming another door, or not copying the code back, earns 0 (a guessed code rarely hits);
- asking about the question's own door and copying the reply's code earns 1.

The facts are 24 doors' codes (8 possible codes), and training redraws the whole table at every step
(`DoorTable.draw`; the environment and the golden answers read the same table, see `prompt_r1.tasks.door_training`): no
policy that ignores the reply can do better than a guess (1 in 8). With a table fixed for a run, agents learned to
answer the run's most common code, or to ask another door that happened to share the question's code. Under the
asynchronous trainer, groups of episodes run across steps, so each group has a table of its own instead
(`DoorTable.group_codes`): the environment finds the group in the request's system message (`table_mark`,
`prompt_r1.tasks.door_async`) and answers from that group's table.

The agent starts from `build_door_model`, a tiny model fine-tuned in two stages in which every reply's code is
drawn afresh: fine-tuning holds no facts, so it can teach copying a reply but never a code to recall. First on
episodes that ask about the question's door and copy the reply's code: the skills of reading the question and the
reply, which a pretrained model has and a tiny one does not learn from a mixture of behaviours alone. This stage
runs until the greedy agent names the question's door in its first turn for nearly every door
(`READING_TARGET`): a fixed number of steps left some seeds' agents naming random doors, and GRPO never fixed them.
Then on the mixture, which undoes that stage's preference: each behaviour equally often (answer at once with any
code, ask without naming a door, ask about the question's door, ask about the door after it in `DOORS`), and
given a reply, the reply's code or as often another one. The build checks that the sampled agent still names the
question's door in at least `READING_FLOOR` of its first turns (the mixture gives a quarter), and fails otherwise:
an agent that cannot read the question is never trained silently. What GRPO adds is the choice. How far it gets,
per seed, is in `evals/bench/learning.py` and its results; `tests/test_learning.py` checks it in CI.

Needs the `dev` extra (the tokenizer and the scripted environment).
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "CODES",
    "DOORS",
    "READING_FLOOR",
    "READING_TARGET",
    "SERVED_SHAPE",
    "DoorBuildError",
    "DoorTable",
    "build_door_model",
    "door_codes",
    "door_environment",
    "door_rows",
    "format_episodes",
    "message_text",
    "named_doors",
    "question_for",
    "reading_share",
    "table_mark",
    "training_rows",
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
    """One code per door, drawn from `seed`."""
    rng = random.Random(seed)
    return {door: rng.choice(CODES) for door in DOORS}


REPLIES = ("honest", "lying", "withheld")
WITHHELD = "The code is secret."


class DoorTable:
    """The environment's facts, redrawn at each training step: `draw(step)` makes `codes` the step's table (a
    function of the run's seed and the step alone, so a rerun or a resumed run sees the same tables). Under the
    asynchronous trainer each group of episodes has its own table instead: `group_codes(group)`, a function of the
    run's seed and the group's index alone, never one of the steps' tables.

    `reply` sets what the environment tells, for the controls: "honest" (the table's code), "lying" (for every
    door a code other than its own, drawn per table: an agent that copies the reply is then never right, one that
    knew the codes without asking would not be hurt) or "withheld" (no code at all: any agent can only guess, right
    1 time in 8). The environment runs in a server thread; the trainer sets these between steps, while no episode
    runs.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.reply = "honest"
        self._groups: dict[int, tuple[dict[str, str], dict[str, str]]] = {}
        self.draw(0)

    def draw(self, step: int) -> dict[str, str]:
        self.step = step
        self.codes, self._lies = _table(self.seed, step)
        return self.codes

    def group_codes(self, group: int) -> dict[str, str]:
        """The table of the async worker's group `group` (drawn once, then kept: its episodes and its golden
        answers read the same one)."""
        return self._group(group)[0]

    def _group(self, group: int) -> tuple[dict[str, str], dict[str, str]]:
        if group not in self._groups:  # a server thread and the worker may both ask: the draw is the same
            self._groups[group] = _table(self.seed, GROUP_TABLES, group)
        return self._groups[group]

    def tell(self, door: str, group: int | None = None) -> str:
        """The environment's reply about `door` (see `reply`), from the current step's table or `group`'s."""
        if self.reply not in REPLIES:
            raise ValueError(f"reply must be one of {', '.join(REPLIES)}, got {self.reply!r}")
        if self.reply == "withheld":
            return WITHHELD
        codes, lies = (self.codes, self._lies) if group is None else self._group(group)
        code = lies[door] if self.reply == "lying" else codes[door]
        return f"The {door} door code is {code}."


# Group tables are keyed (seed, GROUP_TABLES, group): steps are never negative, so no group's table is a step's.
GROUP_TABLES = -1


def _table(*key: int) -> tuple[dict[str, str], dict[str, str]]:
    """The table drawn from `key` (seed, step; or seed, GROUP_TABLES, group) and its lies."""
    from prompt_r1.agents.batching import derive_seed

    codes = door_codes(derive_seed(*key))
    rng = random.Random(derive_seed(*key, 1))
    return codes, {door: rng.choice([c for c in CODES if c != code]) for door, code in codes.items()}


def table_mark(group: int) -> str:
    """What a request's system message carries to name its episode's group table (see `door_environment`)."""
    return f"[door table {group}]"


_MARK = re.compile(r"\[door table (\d+)\]")


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


def door_environment(codes: dict[str, str] | DoorTable) -> Callable[[dict[str, Any]], str]:
    """The environment as a `ScriptedServer` responder: it reads the agent's prompt (the last user message), and
    answers from a fixed table or from a `DoorTable`: the group's table when the system message carries a
    `table_mark`, else the current step's."""

    def respond(body: dict[str, Any]) -> str:
        messages = body.get("messages") or [{}]
        named = named_doors(message_text(messages[-1]))
        if not named:
            return "Name the door."
        if len(named) > 1:
            return "Name one door."
        if isinstance(codes, DoorTable):
            system = next((message_text(m) for m in messages if m.get("role") == "system"), "")
            mark = _MARK.search(system)
            return codes.tell(named[0], group=int(mark.group(1)) if mark else None)
        return f"The {named[0]} door code is {codes[named[0]]}."

    return respond


def message_text(message: dict[str, Any]) -> str:
    """A chat message's text, whether its content is a string or a list of parts (what a scripted responder reads)."""
    content = message.get("content", "")
    return content if isinstance(content, str) else " ".join(str(part) for part in content)


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


# The agent's attention: 2 heads 32 wide (1 key/value head), the parameters of `build_tiny_model`'s default 4 heads
# 16 wide (2 key/value heads); vLLM's CPU attention serves heads 32 wide and more, not 16, and the learning
# benchmark's synchronous and asynchronous runs train the same agents.
SERVED_SHAPE: dict[str, int] = {"heads": 2, "kv_heads": 1}

# The greedy agent's share of first turns that name the question's door, reached before the mixture stage.
READING_TARGET = 0.95
# The sampled agent's share after the mixture stage, below which the build fails (the mixture gives about 0.25).
READING_FLOOR = 0.2
MAX_READING_STEPS = 3000
MIXTURE_ATTEMPTS = 3


class DoorBuildError(RuntimeError):
    """The agent's fine-tuning did not give it the skills the task needs (see `build_door_model`)."""


def reading_share(path: str | Path, *, samples: int = 0, seed: int = 0) -> float:
    """The share of first turns that name the question's door, over every door: greedy when `samples` is 0, else
    `samples` sampled turns per door (temperature 1, no top-k, as GRPO samples)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.core.prompts import question_message
    from prompt_r1.core.tokens import initial_prompt_ids

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = [
        initial_prompt_ids(tok, [{"role": "user", "content": question_message(question_for(d))}])
        for d in DOORS
    ]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    attention = torch.zeros_like(ids)
    for i, row in enumerate(rows):  # left padding: every row's next token in the last column
        ids[i, width - len(row) :], attention[i, width - len(row) :] = torch.tensor(row), 1
    repeats = max(1, samples)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if samples else dict(do_sample=False)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=ids.repeat(repeats, 1),
            attention_mask=attention.repeat(repeats, 1),
            max_new_tokens=16,
            pad_token_id=tok.pad_token_id,
            **sampling,
        )
    turns = tok.batch_decode(out[:, width:], skip_special_tokens=False)
    asked = [turn.split("</interaction_prompt>")[0] for turn in turns]
    hits = sum(named_doors(text) == [door] for text, door in zip(asked, DOORS * repeats, strict=True))
    return hits / len(asked)


def build_door_model(
    path: str | Path,
    *,
    seed: int = 0,
    steps: int = 300,
    episodes: int = 512,
    batch_size: int = 64,
    max_reading_steps: int = MAX_READING_STEPS,
    say: Callable[[str], None] | None = None,
    **shape: Any,
) -> Path:
    """The tiny agent for the task, fine-tuned in two stages (see the module docstring): `reading_episodes`, in
    rounds of `steps` until the greedy agent names the question's door in `READING_TARGET` of first turns (at most
    `max_reading_steps`), then `steps` on `format_episodes`, after which the sampled agent must still name it in
    `READING_FLOOR` of them (the stage is redone with other batches, `MIXTURE_ATTEMPTS` in all, when it does not).
    Raises DoorBuildError when either check still fails. No code in either stage is a fact:
    each reply's is drawn afresh. Its tokenizer knows the protocol's tags and its instruction as one token each,
    and the doors and codes as words, so a prompt is about thirty tokens and the model fine-tunes and trains in
    seconds. The figures go to PATH/door_build.json. `say`, when given, is told a line as each stage starts and
    ends (a build takes minutes on 2 cores)."""
    import json
    import time

    from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE
    from prompt_r1.testing.tiny_models import build_protocol_model

    started = time.monotonic()

    def stage(line: str) -> None:
        if say is not None:
            say(f"agent: {line} ({time.monotonic() - started:.0f} s)")

    corpus = [
        *(f"{question_for(d)} The {d} door code is {c}." for d in DOORS for c in CODES),
        "Name the door. Name one door. Which code?",
        *(ANSWER.format(thought="ok", code=c) for c in CODES),
    ]
    tags = [f"<{t}>" for t in ("think", "interaction_prompt", "answer", "interaction_response")]
    tags += [t.replace("<", "</") for t in tags]
    path = Path(path)
    reading = reading_episodes(episodes // 2, seed=seed)
    stage(
        f"a random tiny model (seed {seed}) and a tokenizer trained here; stage 1 of 2, reading: {steps} "
        "fine-tuning steps on asking about the question's door and copying the reply's code"
    )
    build_protocol_model(
        path,
        reading,
        corpus=corpus,
        added_tokens=[INSTRUCTION_TEMPLATE, *tags],
        seed=seed,
        batch_size=batch_size,
        steps=steps,
        **shape,
    )
    reading_steps, greedy = steps, reading_share(path)
    stage(f"after {reading_steps} steps it names the question's door in {greedy:.0%} of first turns (greedy)")
    while greedy < READING_TARGET and reading_steps < max_reading_steps:
        # Each round draws its own batches (seed + round) and starts a fresh optimizer from the saved weights.
        build_protocol_model(
            path, reading, start_from=path, seed=seed + reading_steps, batch_size=batch_size, steps=steps
        )
        reading_steps += steps
        greedy = reading_share(path)
        stage(
            f"after {reading_steps} steps it names the question's door in {greedy:.0%} of first turns (greedy)"
        )
    if greedy < READING_TARGET:
        raise DoorBuildError(
            f"seed {seed}: after {reading_steps} fine-tuning steps the agent names the question's door in "
            f"{greedy:.0%} of first turns (greedy), short of {READING_TARGET:.0%}: it cannot read the question"
        )
    # The mixture's share of asking about the question's door comes out of fine-tuning at 25% give or take a few
    # points, and some seeds land under the floor; such a stage is redone from the reading stage's weights with
    # other batches (`MIXTURE_ATTEMPTS` in all), never trained on.
    reading_stage = path.with_name(path.name + ".reading")
    shutil.rmtree(reading_stage, ignore_errors=True)
    shutil.copytree(path, reading_stage)
    try:
        for attempt in range(MIXTURE_ATTEMPTS):
            stage(
                f"stage 2 of 2, no preference (try {attempt + 1}): {steps} steps on every behaviour equally often "
                "(answer at once; ask about no door, its door or the next; copy the reply or not)"
            )
            build_protocol_model(
                path,
                format_episodes(episodes, seed=seed),
                start_from=reading_stage,
                seed=seed + 7919 * attempt,
                batch_size=batch_size,
                steps=steps,
            )
            sampled = reading_share(path, samples=16, seed=seed)
            stage(
                f"it names the question's door in {sampled:.1%} of sampled first turns (needs {READING_FLOOR:.0%} or more)"
            )
            if sampled >= READING_FLOOR:
                break
    finally:
        shutil.rmtree(reading_stage, ignore_errors=True)
    if sampled < READING_FLOOR:
        raise DoorBuildError(
            f"seed {seed}: after {MIXTURE_ATTEMPTS} tries of the mixture stage the agent names the question's door "
            f"in {sampled:.0%} of sampled first turns, under {READING_FLOOR:.0%}: it has stopped reading the question"
        )
    figures = {
        "seed": seed,
        "steps": steps,
        "reading_steps": reading_steps,
        "greedy_reading": greedy,
        "mixture_attempts": attempt + 1,
        "sampled_reading": sampled,
        "shape": shape,  # the model's shape arguments (none: build_tiny_model's defaults)
    }
    (path / "door_build.json").write_text(json.dumps(figures) + "\n")  # last: marks a finished, checked agent
    return path


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
