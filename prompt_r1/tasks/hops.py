"""Hops: an offline task whose answer needs a chain of 1 to 3 environment calls, each built from the last reply.

A question names one thing and asks for a code at the end of a chain only the environment knows:
- 1 hop: "Which code opens the fox room?"; the environment, asked about the fox room, gives its code;
- 2 hops: "Which code opens the room behind the jade door?"; asked about the jade door, it names the room the door
  leads to, and asked about that room, its code;
- 3 hops: "Which code opens the room behind the door the brass key opens?"; the key names a door, the door a room,
  the room its code.
Keys, doors and rooms have names of their own (metals, colours, animals), so a name says what it is, and the
number of calls a question needs (1, 2 or 3) can be read from the question; that a reply gives a code and not
another name says the chain has ended. The environment answers a prompt that names exactly one key, door or room,
and says "Name a key, a door or a room." or "Name one thing." otherwise.

Why this design: each call's content depends on the last reply (the door a key opens is redrawn, so the second
call cannot be written before the first reply is read), the right number of calls differs by question, and every
table (which key opens which door, which door leads to which room, each room's code) is redrawn at every training
step (`HopsTable.draw`; under the asynchronous trainer, per group of episodes: `HopsTable.group_table`), so
nothing can be memorised: no policy that ignores the replies beats a guess (1 in 8). Under the `reference` reward
preset every episode that makes at least one call passes the format gate; it earns 1 for the right code and 0 for
a wrong one, and answering at once earns −0.4. Nothing in the reward counts calls: making exactly the calls the
question needs is what the agent has to learn, since answering early is a guess and a call after the code has
been given moves the code out of the last reply (the environment tells each thing once an episode: asked again,
it says "You asked about that already.").

The controls (`HopsTable.reply`): "withheld", every code reply says the code is secret (the links stay honest:
an agent can only guess, right 1 time in 8); "lying", the first reply of each episode lies (a key's other door, a
door's other room, a room's other code, each chosen so that the chain it starts ends on a code other than the
true one): an agent that follows the chain is then always wrong.

The agent starts from `build_hops_model`: fine-tuned first on whole chains (the skills: name the question's
thing, name the thing a reply names, copy a reply's code; every reply drawn afresh, so no fact is learned), until
the greedy agent does each in `READING_TARGET` of cases; then on a mixture that undoes the chain: at every turn
each behaviour is equally likely whatever came before (answer, ask about the question's thing again, ask about
the thing the last reply names, or at the first turn ask about nothing), and an answer copies the last reply's
code or as often another. The build then checks, on sampled turns, that each skill is still there
(`SKILL_FLOOR`) and that no choice is preferred (`CHOICE_CEILING`), and fails with `HopsBuildError` otherwise.
What GRPO adds is the chain: when to call, what to name, when to stop. `prompt_r1.tasks.hops_training` trains
it; `evals/bench/learning.py --task hops` measures it.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prompt_r1.tasks.door_codes import CODES

__all__ = [
    "CHOICE_CEILING",
    "CODES",
    "DOORS",
    "KEYS",
    "ROOMS",
    "SKILL_FLOOR",
    "HopsBuildError",
    "HopsTable",
    "build_hops_model",
    "chain_of",
    "hops_environment",
    "hops_of",
    "hops_rows",
    "mixture_episodes",
    "named",
    "pointed",
    "question_for",
    "reading_episodes",
    "skill_shares",
    "table_mark",
    "training_rows",
]

KEYS = (
    "brass",
    "bronze",
    "chrome",
    "copper",
    "iron",
    "lead",
    "nickel",
    "pewter",
    "silver",
    "steel",
    "tin",
    "zinc",
)
DOORS = (
    "amber",
    "azure",
    "coral",
    "gold",
    "green",
    "ivory",
    "jade",
    "lilac",
    "navy",
    "olive",
    "plum",
    "ruby",
)
ROOMS = ("bear", "crane", "deer", "eagle", "fox", "hare", "lynx", "mole", "owl", "seal", "swan", "wolf")
KIND = {**dict.fromkeys(KEYS, "key"), **dict.fromkeys(DOORS, "door"), **dict.fromkeys(ROOMS, "room")}
HOPS = {"room": 1, "door": 2, "key": 3}
REPLIES = ("honest", "lying", "withheld")
WITHHELD = "The code is secret."
NAME_ONE = "Name one thing."
NAME_SOME = "Name a key, a door or a room."
ASKED = "You asked about that already."

ASK = "<think>ask</think><interaction_prompt>{prompt}</interaction_prompt>"
ANSWER = "<think>{thought}</think><answer>{code}</answer>"
ASK_NOTHING = "Tell me the code."
MAX_SCRIPT_CALLS = 4  # fine-tuning episodes call at most this often (training's max_turns)


def question_for(name: str) -> str:
    """The question whose chain starts at `name` (a key, a door or a room)."""
    kind = KIND[name]
    if kind == "room":
        return f"Which code opens the {name} room?"
    if kind == "door":
        return f"Which code opens the room behind the {name} door?"
    return f"Which code opens the room behind the door the {name} key opens?"


def ask_about(name: str) -> str:
    """The prompt that asks the environment about one thing."""
    return f"Tell me about the {name} {KIND[name]}."


def hops_of(name: str) -> int:
    """The calls a question about `name` needs: 1 for a room, 2 for a door, 3 for a key."""
    return HOPS[KIND[name]]


_NAME = re.compile(r"\b(" + "|".join(KIND) + r")\b", re.IGNORECASE)


def named(text: str) -> list[str]:
    """The keys, doors and rooms a text names, as whole words, in the order they appear (repeats kept once)."""
    found: list[str] = []
    for match in _NAME.finditer(text):
        name = match.group(1).lower()
        if name not in found:
            found.append(name)
    return found


def pointed(reply: str) -> str | None:
    """The thing a reply points to next: the last name in it (a key's door, a door's room; a code reply names the
    room it is about), or None."""
    names = named(reply)
    return names[-1] if names else None


def reply_code(reply: str) -> str | None:
    """The code a reply gives, if any."""
    match = re.search(r"\bcode is (\w+)\.", reply)
    code = match.group(1).lower() if match else None
    return code if code in CODES else None


class Table:
    """One draw of the facts: which door each key opens and which room each door leads to (permutations), each
    room's code, and the lies for the `lying` control."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        doors, rooms = list(DOORS), list(ROOMS)
        rng.shuffle(doors)
        rng.shuffle(rooms)
        self.opens = dict(zip(KEYS, doors, strict=True))
        self.leads = dict(zip(DOORS, rooms, strict=True))
        self.codes = {room: rng.choice(CODES) for room in ROOMS}
        # A lie starts a chain that ends on another code than the truth's (so a chain-follower is never right).
        self.lies: dict[str, str] = {}
        for name in (*KEYS, *DOORS, *ROOMS):
            truth = self.answer(name)
            if KIND[name] == "room":
                choices = [c for c in CODES if c != truth]
            else:
                pool = DOORS if KIND[name] == "key" else ROOMS
                choices = [other for other in pool if self.answer(other) != truth]
            self.lies[name] = rng.choice(choices)

    def step(self, name: str) -> str:
        """What `name` points to: a key's door, a door's room, a room's code."""
        kind = KIND[name]
        return self.opens[name] if kind == "key" else self.leads[name] if kind == "door" else self.codes[name]

    def answer(self, name: str) -> str:
        """The code at the end of the chain that starts at `name`."""
        while KIND.get(name) is not None:
            name = self.step(name)
        return name


def chain_of(table: Table, name: str) -> list[str]:
    """The things asked about, in order, to answer the question about `name` (its length: the calls needed)."""
    chain = [name]
    while KIND[chain[-1]] != "room":
        chain.append(table.step(chain[-1]))
    return chain


def render(name: str, target: str) -> str:
    """The environment's reply about `name`, which points to `target` (a door, a room or a code)."""
    kind = KIND[name]
    if kind == "key":
        return f"The {name} key opens the {target} door."
    if kind == "door":
        return f"The {name} door leads to the {target} room."
    return f"The {name} room code is {target}."


class HopsTable:
    """The environment's facts, redrawn at each training step (`draw(step)`: a function of the run's seed and the
    step alone) or, under the asynchronous trainer, one per group of episodes (`group_table(group)`: the seed and
    the group's index, never a step's table). `reply` sets what the environment tells (see the module
    docstring: honest, lying, withheld). The environment runs in a server thread; the trainer sets these between
    steps, while no episode runs."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.reply = "honest"
        self._groups: dict[int, Table] = {}
        self.draw(0)

    def draw(self, step: int) -> Table:
        from prompt_r1.agents.batching import derive_seed

        self.step = step
        self.table = Table(derive_seed(self.seed, step))
        return self.table

    def group_table(self, group: int) -> Table:
        from prompt_r1.agents.batching import derive_seed

        if group not in self._groups:  # a server thread and the worker may both ask: the draw is the same
            self._groups[group] = Table(derive_seed(self.seed, GROUP_TABLES, group))
        return self._groups[group]

    def tell(self, name: str, *, first: bool, group: int | None = None) -> str:
        """The reply about `name`; `first`: the episode's first call (which the `lying` control lies to)."""
        if self.reply not in REPLIES:
            raise ValueError(f"reply must be one of {', '.join(REPLIES)}, got {self.reply!r}")
        table = self.table if group is None else self.group_table(group)
        if self.reply == "withheld" and KIND[name] == "room":
            return WITHHELD
        target = table.lies[name] if self.reply == "lying" and first else table.step(name)
        return render(name, target)


GROUP_TABLES = -1  # group tables are keyed (seed, -1, group): steps are never negative


def table_mark(group: int) -> str:
    """What a request's system message carries to name its episode's group table (see `hops_environment`)."""
    return f"[hops table {group}]"


_MARK = re.compile(r"\[hops table (\d+)\]")


def hops_environment(table: HopsTable) -> Callable[[dict[str, Any]], str]:
    """The environment as a `ScriptedServer` responder: it reads the agent's prompt (the last user message) and
    answers from `table`: the group's table when the system message carries a `table_mark`, else the step's. A
    request with no earlier assistant message is the episode's first call; a thing an earlier prompt of the episode
    named is not told again (`ASKED`), so that calling on after the code has come costs the code its place in the
    last reply, and a lie on the first call cannot be undone by asking the same thing twice."""

    def respond(body: dict[str, Any]) -> str:
        messages = body.get("messages") or [{}]
        names = named(_text(messages[-1]))
        if not names:
            return NAME_SOME
        if len(names) > 1:
            return NAME_ONE
        earlier = [named(_text(m)) for m in messages[:-1] if m.get("role") == "user"]
        if names in earlier:  # each thing is told once an episode: a call never repeats the last reply's news
            return ASKED
        system = next((_text(m) for m in messages if m.get("role") == "system"), "")
        mark = _MARK.search(system)
        first = not any(m.get("role") == "assistant" for m in messages)
        return table.tell(names[0], first=first, group=int(mark.group(1)) if mark else None)

    return respond


def _text(message: dict[str, Any]) -> str:
    content = message.get("content", "")
    return content if isinstance(content, str) else " ".join(str(part) for part in content)


def starts(n: int, seed: int = 0) -> list[str]:
    """`n` question starts, 1, 2 and 3 hops in turn (a room, a door, a key), each kind's names in a shuffled
    cycle."""
    rng = random.Random(seed + 1)
    pools = {kind: list(names) for kind, names in (("room", ROOMS), ("door", DOORS), ("key", KEYS))}
    for pool in pools.values():
        rng.shuffle(pool)
    kinds = ("room", "door", "key")
    return [pools[kinds[i % 3]][(i // 3) % 12] for i in range(n)]


def hops_rows(n: int, seed: int = 0, table: Table | None = None) -> list[dict[str, Any]]:
    """`n` dataset rows (id, question, golden_answers, hops); golden answers from `table` (default: the seed's
    step-0 table; the training rollout replaces them with each step's)."""
    table = table or HopsTable(seed).table
    return [
        {
            "id": f"hops-{i}",
            "question": question_for(name),
            "golden_answers": [table.answer(name)],
            "hops": hops_of(name),
        }
        for i, name in enumerate(starts(n, seed))
    ]


def training_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`hops_rows` as GRPO's training rows: the protocol's first message as the prompt, and the golden answers."""
    from prompt_r1.core.prompts import question_message

    return [
        {
            "prompt": [{"role": "user", "content": question_message(r["question"])}],
            "golden_answers": r["golden_answers"],
        }
        for r in hops_rows(n, seed=seed)
    ]


def _answer(rng: random.Random, last_reply: str | None, copy: bool) -> str:
    code = reply_code(last_reply or "")
    if code is not None and copy:
        return ANSWER.format(thought="ok", code=code)
    return ANSWER.format(thought="guess", code=rng.choice([c for c in CODES if c != code]))


def reading_episodes(n: int = 256, seed: int = 0) -> list[tuple[str, list[str]]]:
    """Whole chains: ask about the question's thing, then about each thing a reply names, then copy the code;
    every reply drawn afresh (a table per episode), so following and copying are the only way to fit them."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        table = Table(rng.randrange(2**31))
        name = rng.choice(list(KIND))
        script: list[str] = []
        for asked in chain_of(table, name):
            script += [ASK.format(prompt=ask_about(asked)), render(asked, table.step(asked))]
        script.append(_answer(rng, script[-1], copy=True))
        episodes.append((question_for(name), script))
    return episodes


def mixture_episodes(n: int = 512, seed: int = 0) -> list[tuple[str, list[str]]]:
    """Episodes in which every turn's behaviour is drawn uniformly whatever came before (see the module
    docstring): the skills in every position, no chain preferred. Replies are drawn afresh per episode."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        table = Table(rng.randrange(2**31))
        name = rng.choice(list(KIND))
        script: list[str] = []
        reply: str | None = None
        asked: set[str] = set()
        for call in range(MAX_SCRIPT_CALLS + 1):
            choices = ("answer", "question", "nothing") if reply is None else ("answer", "question", "reply")
            behaviour = rng.choice(choices) if call < MAX_SCRIPT_CALLS else "answer"
            if behaviour == "answer":
                script.append(_answer(rng, reply, copy=rng.random() < 0.5))
                break
            target = {"question": name, "nothing": None, "reply": pointed(reply or "")}[behaviour]
            prompt = ask_about(target) if target else ASK_NOTHING
            if target is None:
                reply = NAME_SOME
            else:
                reply = ASKED if target in asked else render(target, table.step(target))
                asked.add(target)
            script += [ASK.format(prompt=prompt), reply]
        episodes.append((question_for(name), script))
    return episodes


# The greedy agent's share of each skill reached by the whole-chain stage before the mixture.
READING_TARGET = 0.95
# After the mixture (sampled turns): each skill at least this often (the mixture gives 1/3 for naming the
# question's thing or the reply's thing, 1/2 for copying a code when answering after a code reply) ...
SKILL_FLOOR = 0.2
# ... and no choice this much more often than the mixture's share (no chain held: its 1/3 choices stay below it).
CHOICE_CEILING = 0.55
MAX_READING_STEPS = 3000
MIXTURE_ATTEMPTS = 3


class HopsBuildError(RuntimeError):
    """The agent's fine-tuning did not give it the skills the task needs, or left it a preference."""


def _contexts(seed: int) -> dict[str, list[tuple[str, list[str], Callable[[str], bool]]]]:
    """For each skill, (question, script so far, check of the next turn) over every start: the first turn names
    the question's thing (`question`); after a link reply, the next turn names what it points to (`follow`); after
    a code reply, an answer copies it (`copy`, checked on answers only) and how often it answers (`stop`)."""
    table = Table(seed)
    out: dict[str, list] = {"question": [], "follow": [], "copy": [], "stop": []}
    for name in KIND:
        question = question_for(name)
        out["question"].append((question, [], lambda turn, n=name: _asks(turn) == [n]))
        script = [ASK.format(prompt=ask_about(name)), render(name, table.step(name))]
        if KIND[name] != "room":
            nxt = table.step(name)
            out["follow"].append((question, script, lambda turn, n=nxt: _asks(turn) == [n]))
        else:
            code = table.step(name)
            out["copy"].append((question, script, lambda turn, c=code: _answered(turn) in (None, c)))
            out["stop"].append((question, script, lambda turn: _answered(turn) is not None))
    return out


def _asks(turn: str) -> list[str] | None:
    if "<interaction_prompt>" not in turn:
        return None
    return named(turn.split("<interaction_prompt>", 1)[1].split("</interaction_prompt>")[0])


def _answered(turn: str) -> str | None:
    match = re.search(r"<answer>(.*?)</answer>", turn)
    return match.group(1).strip().lower() if match else None


def skill_shares(path: str | Path, *, samples: int = 0, seed: int = 0) -> dict[str, float]:
    """Each skill's share (see `_contexts`) over every start: greedy when `samples` is 0, else `samples` sampled
    turns per context (temperature 1, as GRPO samples). `copy` counts answers only (a turn that asks is not a
    copy, nor a miss)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.core.prompts import interaction_response, question_message
    from prompt_r1.core.tokens import initial_prompt_ids, user_turn_ids

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    shares: dict[str, float] = {}
    for skill, contexts in _contexts(seed).items():
        rows = []
        for question, script in ((q, s) for q, s, _ in contexts):
            ids = initial_prompt_ids(tok, [{"role": "user", "content": question_message(question)}])
            for k, text in enumerate(script):
                ids = ids + (
                    user_turn_ids(tok, interaction_response(text), ids)
                    if k % 2
                    else tok.encode(text, add_special_tokens=False)
                )
            rows.append(ids)
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tok.pad_token_id)
        attention = torch.zeros_like(ids)
        for i, row in enumerate(rows):  # left padding: every row's next token in the last column
            ids[i, width - len(row) :], attention[i, width - len(row) :] = torch.tensor(row), 1
        repeats = max(1, samples)
        sampling = (
            dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if samples else dict(do_sample=False)
        )
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=ids.repeat(repeats, 1),
                attention_mask=attention.repeat(repeats, 1),
                max_new_tokens=24,
                pad_token_id=tok.pad_token_id,
                **sampling,
            )
        turns = tok.batch_decode(out[:, width:], skip_special_tokens=False)
        checks = [check for _, _, check in contexts] * repeats
        if skill == "copy":
            pairs = [(t, c) for t, c in zip(turns, checks, strict=True) if _answered(t) is not None]
            shares[skill] = sum(c(t) for t, c in pairs) / len(pairs) if pairs else 0.0
        else:
            shares[skill] = sum(c(t) for t, c in zip(turns, checks, strict=True)) / len(turns)
    return shares


def build_hops_model(
    path: str | Path,
    *,
    seed: int = 0,
    steps: int = 300,
    episodes: int = 512,
    batch_size: int = 64,
    max_reading_steps: int = MAX_READING_STEPS,
    **shape: Any,
) -> Path:
    """The tiny agent for the task, fine-tuned in two stages (see the module docstring): `reading_episodes` in
    rounds of `steps` until the greedy agent names the question's thing, follows a link and copies a code in
    `READING_TARGET` of cases (at most `max_reading_steps`), then `steps` on `mixture_episodes`, after which the
    sampled agent must still have each skill (`SKILL_FLOOR`) and prefer no choice (`CHOICE_CEILING`; the stage is
    redone with other batches, `MIXTURE_ATTEMPTS` in all, when it does not). Raises HopsBuildError when a check
    still fails. The figures go to PATH/hops_build.json, written last."""
    import json

    from prompt_r1.core.prompts import INSTRUCTION_TEMPLATE
    from prompt_r1.testing.tiny_models import build_protocol_model

    table = Table(seed)
    corpus = [
        *(question_for(n) for n in KIND),
        *(f"{ask_about(n)} {render(n, table.step(n))}" for n in KIND),
        *(f"The {r} room code is {c}." for r in ROOMS for c in CODES),
        f"{NAME_SOME} {NAME_ONE} {ASK_NOTHING} {WITHHELD} {ASKED}",
        *(ANSWER.format(thought=t, code=c) for c in CODES for t in ("ok", "guess")),
    ]
    tags = [f"<{t}>" for t in ("think", "interaction_prompt", "answer", "interaction_response")]
    tags += [t.replace("<", "</") for t in tags]
    path = Path(path)
    reading = reading_episodes(episodes // 2, seed=seed)
    _say(f"seed {seed}: fine-tuning a tiny model on whole chains, {steps} steps a round")
    build_protocol_model(
        path, reading, corpus=corpus, added_tokens=[INSTRUCTION_TEMPLATE, *tags], seed=seed,
        batch_size=batch_size, steps=steps, **shape,
    )  # fmt: skip
    reading_steps, greedy = steps, skill_shares(path, seed=seed)
    _say(f"seed {seed}: {reading_steps} whole-chain steps, greedy {_shares(greedy)}")
    while (
        min(greedy[s] for s in ("question", "follow", "copy")) < READING_TARGET
        and reading_steps < max_reading_steps
    ):
        build_protocol_model(
            path, reading, start_from=path, seed=seed + reading_steps, batch_size=batch_size, steps=steps
        )
        reading_steps += steps
        greedy = skill_shares(path, seed=seed)
        _say(f"seed {seed}: {reading_steps} whole-chain steps, greedy {_shares(greedy)}")
    lacking = {s: v for s, v in greedy.items() if s != "stop" and v < READING_TARGET}
    if lacking:
        raise HopsBuildError(
            f"seed {seed}: after {reading_steps} fine-tuning steps on whole chains the greedy agent falls short of "
            f"{READING_TARGET:.0%} in " + ", ".join(f"{s} ({v:.0%})" for s, v in lacking.items())
        )
    reading_stage = path.with_name(path.name + ".reading")
    shutil.rmtree(reading_stage, ignore_errors=True)
    shutil.copytree(path, reading_stage)
    try:
        for attempt in range(MIXTURE_ATTEMPTS):
            build_protocol_model(
                path,
                mixture_episodes(episodes, seed=seed),
                start_from=reading_stage,
                seed=seed + 7919 * attempt,
                batch_size=batch_size,
                steps=steps,
            )
            sampled = skill_shares(path, samples=16, seed=seed)
            problems = _mixture_problems(sampled)
            _say(f"seed {seed}: mixture try {attempt + 1}, sampled {_shares(sampled)}")
            if not problems:
                break
    finally:
        shutil.rmtree(reading_stage, ignore_errors=True)
    if problems:
        raise HopsBuildError(
            f"seed {seed}: after {MIXTURE_ATTEMPTS} tries of the mixture stage the sampled agent "
            + "; ".join(problems)
        )
    figures = {
        "seed": seed,
        "steps": steps,
        "reading_steps": reading_steps,
        "greedy": greedy,
        "mixture_attempts": attempt + 1,
        "sampled": sampled,
        "shape": shape,
    }
    (path / "hops_build.json").write_text(json.dumps(figures) + "\n")  # last: marks a finished, checked agent
    return path


def _say(line: str) -> None:
    """A build's progress line on stderr (a build takes minutes on CPU)."""
    import sys

    print(f"hops agent: {line}", file=sys.stderr, flush=True)


def _shares(shares: dict[str, float]) -> str:
    return ", ".join(f"{skill} {value:.0%}" for skill, value in shares.items())


def _mixture_problems(sampled: dict[str, float]) -> list[str]:
    """What the sampled agent lacks (a skill under `SKILL_FLOOR`) or holds (a choice over `CHOICE_CEILING`)."""
    problems = [
        f"{s} {v:.0%} < {SKILL_FLOOR:.0%} (a skill lost)" for s, v in sampled.items() if v < SKILL_FLOOR
    ]
    problems += [
        f"{s} {sampled[s]:.0%} > {CHOICE_CEILING:.0%} (a choice preferred)"
        for s in ("question", "follow", "stop")
        if sampled[s] > CHOICE_CEILING
    ]
    return problems
