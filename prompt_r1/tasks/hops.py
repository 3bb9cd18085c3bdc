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
nothing can be memorised: no policy that ignores the replies beats a guess (1 in 24: the codes are the 24 Greek
letters, so that a lucky guess's reward is rare beside a chain's). Under the `reference` reward
preset every episode that makes at least one call passes the format gate; it earns 1 for the right code and 0 for
a wrong one, and answering at once earns −0.4. Nothing in the reward counts calls: making exactly the calls the
question needs is what the agent has to learn, since answering early is a guess and a call after the code has
been given moves the code out of the last reply (the environment tells each thing once an episode: asked again,
it says "You asked about that already.").

The controls (`HopsTable.reply`): "withheld", every code reply says the code is secret (the links stay honest:
an agent can only guess, right 1 time in 24); "lying", the first reply of each episode lies (a key's other door, a
door's other room, a room's other code, each chosen so that the chain it starts ends on a code other than the
true one): an agent that follows the chain is then always wrong.

The agent a tiny model starts from, and its checks, are in `prompt_r1.tasks.hops_agent`."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from prompt_r1.tasks.door_codes import message_text

__all__ = [
    "CODES",
    "DOORS",
    "KEYS",
    "ROOMS",
    "HopsTable",
    "chain_of",
    "hops_environment",
    "hops_of",
    "hops_rows",
    "named",
    "pointed",
    "question_for",
    "render",
    "reply_code",
    "starts",
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
# The Greek letters, single tokens: a guess is right 1 time in 24, so a chain's reward stands out from a lucky guess's.
CODES = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
    "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
)  # fmt: skip
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
    request with no earlier assistant message is the episode's first call; a thing already asked about alone by an
    earlier prompt of the episode is not told again (`ASKED`), so that calling on after the code has come costs the code its place in the
    last reply, and a lie on the first call cannot be undone by asking the same thing twice."""

    def respond(body: dict[str, Any]) -> str:
        messages = body.get("messages") or [{}]
        names = named(message_text(messages[-1]))
        if not names:
            return NAME_SOME
        if len(names) > 1:
            return NAME_ONE
        earlier = [named(message_text(m)) for m in messages[:-1] if m.get("role") == "user"]
        if names in earlier:  # each thing is told once an episode: a call never repeats the last reply's news
            return ASKED
        system = next((message_text(m) for m in messages if m.get("role") == "system"), "")
        mark = _MARK.search(system)
        first = not any(m.get("role") == "assistant" for m in messages)
        return table.tell(names[0], first=first, group=int(mark.group(1)) if mark else None)

    return respond


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
