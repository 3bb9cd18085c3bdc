"""Notes: a task only the environment can answer, in real text, for a real agent and a real environment model.

Each question has a sheet of notes of its own about made-up things, people and places, which the environment (a
real instruct model, the built-in `smollm2-135m` served over HTTP) holds in its system prompt and the agent never
sees. A sheet has two things, each built by a person, and where each person was born:

    The Varn Bridge was built by Tovi Lannet.        (two of these)
    Tovi Lannet was born in Quellmoor.               (and two of these, in the same order)

Questions ask for one fact (1 call) or a fact about a fact (2 dependent calls):
- "Who built the Varn Bridge?"                      -> Tovi Lannet   (1 call)
- "Where was Tovi Lannet born?"                     -> Quellmoor     (1 call)
- "Where was the builder of the Varn Bridge born?"  -> Quellmoor     (2 calls: the builder, then where they
  were born; the second call names what the first reply gave)

Why this design. The names are drawn from word pools (`POOLS`): training draws from the `train` pool and
evaluation from the `eval` pool, which share no first name, surname, place or thing-name (the kinds of thing,
Bridge or Mill, are common to both), so no fact (and no name of an evaluation question) is ever seen in training,
and neither model can know a fact beforehand. Two facts of each kind is what the built-in environment reads
reliably enough: on 12 held-out sheets, greedy, it named the builder of the first thing 11 times and of the second
8, the birthplace of the first person 7 times and of the second 10; with three of each it fell to 6-12 of 12 for
builders and 3-7 of 12 for birthplaces. Asked a 2-call question directly it answers with the builder, not the
place (0 right of 24).
So the chain, not the environment's reading, is what separates a good prompting policy from a bad one: asked
directly, the environment cannot do the second hop; asked the two sub-questions in turn, it can. The reward is the
double-constrained reward on the final answer against the gold name, with the release's coefficients
(`notes_training.grpo_config` says why).

Routing: many sheets are in play at once (a training step's questions, an evaluation's chunk of questions run
concurrently), and the environment finds an episode's sheet by the names its prompts carry: `NotesWorld.sheet_for`
reads the newest prompt first, then the earlier ones of the episode, and takes the sheet a thing or person of which
is named (names are unique across the sheets in play: `NotesWorld.draw` makes them so). A prompt that names
nothing of any sheet gets the notes of no sheet: the environment then cannot know, as a person asked about nothing
would not. The `withheld` control gives every episode an empty sheet: the agent can then only guess.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KINDS",
    "POOLS",
    "NotesEnvironment",
    "NotesQuestion",
    "NotesWorld",
    "Sheet",
    "calls_of",
    "draw_sheets",
    "mentions",
    "parse",
    "training_questions",
    "notes_system_prompt",
    "question_about",
    "questions_for",
]

_FIRST = (
    "Tovi", "Mira", "Hale", "Oren", "Lysa", "Bram", "Cass", "Dain", "Edda", "Fenn", "Gita", "Ivo", "Juno", "Kell",
    "Loma", "Nils", "Pia", "Rune", "Sela", "Tam", "Ulla", "Vero", "Wyn", "Yara", "Zeb", "Arlo", "Bess", "Cole",
    "Dara", "Eli"
)  # fmt: skip
_LAST = (
    "Lannet", "Kestrel", "Brisk", "Marrow", "Quill", "Thorne", "Vesk", "Holloway", "Pell", "Garron", "Ashby",
    "Wend", "Corvin", "Dellow", "Fairholt", "Grint", "Hask", "Ivers", "Jowett", "Kemble", "Lorrin", "Mossop",
    "Nettle", "Orme", "Pryor", "Rusk", "Stave", "Tolland", "Ulcott", "Varrow"
)  # fmt: skip
_PLACES = (
    "Quellmoor", "Farrowby", "Lindquay", "Ostwick", "Brenhollow", "Carrowmere", "Duskfield", "Eastmarch",
    "Felgrave", "Harrowgate", "Ivywick", "Jessmoor", "Kilnbury", "Larkspire", "Mornhaven", "Netherby",
    "Orchardine", "Pellworth", "Quarrydown", "Rillsby", "Saltmere", "Thornbury", "Umberlee", "Vantry"
)  # fmt: skip
_PREFIXES = (
    "Varn", "Ostel", "Dunmore", "Sable", "Kettle", "Amber", "Rook", "Cinder", "Brae", "Corran", "Dovel", "Emmer",
    "Fallow", "Garnet", "Heron", "Ilsby", "Jarrow", "Kestel", "Lumen", "Marsh", "Nettor", "Oakum", "Parrel",
    "Quoin", "Russet", "Shale", "Tarn", "Umber"
)  # fmt: skip
_KINDS_OF_THING = ("Bridge", "Clock", "Mill", "Tower", "Lighthouse", "Gate", "Fountain", "Hall")


def _half(words: Sequence[str], part: int) -> tuple[str, ...]:
    return tuple(words[part::2])


# Two pools that share no word: training draws from one, evaluation from the other.
POOLS: dict[str, dict[str, tuple[str, ...]]] = {
    name: {
        "first": _half(_FIRST, part),
        "last": _half(_LAST, part),
        "places": _half(_PLACES, part),
        "prefixes": _half(_PREFIXES, part),
    }
    for name, part in (("train", 0), ("eval", 1))
}
FACTS = 2  # things (and people) a sheet holds
KINDS = ("builder", "birthplace", "builder_birthplace")  # the questions: 1, 1 and 2 calls


@dataclass(frozen=True)
class Sheet:
    """One sheet of notes: `things[i]` was built by `people[i]`, who was born in `places[i]`."""

    things: tuple[str, ...]
    people: tuple[str, ...]
    places: tuple[str, ...]

    def lines(self) -> list[str]:
        made = [f"The {t} was built by {p}." for t, p in zip(self.things, self.people, strict=True)]
        born = [f"{p} was born in {q}." for p, q in zip(self.people, self.places, strict=True)]
        return made + born

    def names(self) -> tuple[str, ...]:
        """What a prompt can name to reach this sheet."""
        return self.things + self.people


EMPTY = Sheet((), (), ())


def notes_system_prompt(sheet: Sheet) -> str:
    """The environment's system prompt for `sheet` (the empty sheet: notes that hold nothing)."""
    notes = "\n".join(f"- {line}" for line in sheet.lines()) or "- (nothing)"
    return f"Answer questions using only these notes.\n{notes}"


@dataclass(frozen=True)
class NotesQuestion:
    """A question, its gold answer, the calls it needs and its sheet."""

    question: str
    answer: str
    kind: str
    sheet: Sheet

    @property
    def calls(self) -> int:
        return calls_of(self.kind)

    def row(self) -> dict[str, Any]:
        """As a training or evaluation row (`golden_answers`, and the kind and calls for the figures)."""
        return {
            "question": self.question,
            "golden_answers": [self.answer],
            "kind": self.kind,
            "calls": self.calls,
        }


def calls_of(kind: str) -> int:
    return 2 if kind == "builder_birthplace" else 1


def question_about(kind: str, sheet: Sheet, i: int) -> NotesQuestion:
    """The `kind` question about the sheet's `i`-th thing (or person, for `birthplace`), with its gold answer."""
    thing, person, place = sheet.things[i], sheet.people[i], sheet.places[i]
    if kind == "builder":
        return NotesQuestion(f"Who built the {thing}?", person, kind, sheet)
    if kind == "birthplace":
        return NotesQuestion(f"Where was {person} born?", place, kind, sheet)
    return NotesQuestion(f"Where was the builder of the {thing} born?", place, kind, sheet)


def draw_sheets(n: int, rng: random.Random, pool: str = "train") -> list[Sheet]:
    """`n` sheets from `pool`. Within a sheet no two names share a word, the kinds of thing aside (the environment
    would mix "Dara Lannet" and "Dara Nettle" up); across the sheets no whole name repeats, so a name finds one
    sheet."""
    words, sheets, seen = POOLS[pool], [], set()
    if n > len(words["prefixes"]) * len(_KINDS_OF_THING) // FACTS:
        raise ValueError(f"too many sheets in play at once: {n}")
    while len(sheets) < n:
        things = tuple(f"{p} {rng.choice(_KINDS_OF_THING)}" for p in rng.sample(words["prefixes"], FACTS))
        people = tuple(
            f"{f} {s}"
            for f, s in zip(rng.sample(words["first"], FACTS), rng.sample(words["last"], FACTS), strict=True)
        )
        if seen.isdisjoint(things + people):
            seen.update(things + people)
            sheets.append(Sheet(things, people, tuple(rng.sample(words["places"], FACTS))))
    return sheets


def questions_for(
    n: int, rng: random.Random, pool: str = "train", *, two_call_share: float = 0.5
) -> list[NotesQuestion]:
    """`n` questions on `n` sheets of `pool` (one each, all names distinct): a `two_call_share` of 2-call
    questions, the rest split between the two 1-call kinds."""
    sheets = draw_sheets(n, rng, pool)
    out = []
    for sheet in sheets:
        kind = "builder_birthplace" if rng.random() < two_call_share else rng.choice(KINDS[:2])
        out.append(question_about(kind, sheet, rng.randrange(FACTS)))
    return out


_PATTERNS = {
    "builder": re.compile(r"Who built the (.+)\?"),
    "birthplace": re.compile(r"Where was (.+) born\?"),
    "builder_birthplace": re.compile(r"Where was the builder of the (.+) born\?"),
}


def parse(question: str) -> tuple[str, str]:
    """(kind, the thing or person named) of a question `question_about` wrote; ValueError for any other text."""
    for kind in reversed(
        KINDS
    ):  # the 2-call form first: "Where was the builder of ..." also fits "Where was ..."
        found = _PATTERNS[kind].fullmatch(question.strip())
        if found:
            return kind, found.group(1)
    raise ValueError(f"not a notes question: {question!r}")


def training_questions(n: int, seed: int, *, two_call_share: float = 0.5) -> list[str]:
    """`n` question texts from the training pool, for a trainer's dataset: each names a thing or a person whose
    sheet `NotesWorld.redraw` draws afresh at every step (drawn 40 at a time: a question's name is in play with
    its step's others only)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        out += [
            q.question
            for q in questions_for(min(40, n - len(out)), rng, "train", two_call_share=two_call_share)
        ]
    return out


def _shares_a_word(names: Sequence[str], others: Sequence[str]) -> bool:
    """Whether a name of `names` shares a word with one of `others` (the kinds of thing aside)."""

    def words(group: Sequence[str]) -> set[str]:
        return {w for n in group for w in n.split() if w not in _KINDS_OF_THING}

    return not words(names).isdisjoint(words(others))


def mentions(text: str, name: str) -> bool:
    """Whether `text` names `name` (as whole words, in any case)."""
    return re.search(rf"\b{re.escape(name.lower())}\b", text.lower()) is not None


class NotesWorld:
    """The sheets in play, and which one an episode's prompts reach (see the module docstring). `withheld`: every
    prompt gets the empty sheet (the control)."""

    def __init__(self) -> None:
        self.sheets: list[Sheet] = []
        self.withheld = False

    def put(self, questions: Sequence[NotesQuestion]) -> None:
        """Put the questions' sheets in play (and no others)."""
        sheets = list(dict.fromkeys(q.sheet for q in questions))
        names = [n for s in sheets for n in s.names()]
        if len(set(names)) != len(names):
            raise ValueError("two sheets in play share a name; draw them together (questions_for)")
        self.sheets = sheets

    def redraw(
        self, questions: Sequence[str], rng: random.Random, pool: str = "train"
    ) -> list[NotesQuestion]:
        """Put in play a fresh sheet around each thing or person the questions name (questions that name the same
        one share it; its other names drawn apart from every other name in play), and return the questions with
        their gold answers, in order."""
        parsed = {q: parse(q) for q in dict.fromkeys(questions)}
        used = {name for _, name in parsed.values()}
        around: dict[str, tuple[Sheet, int]] = {}
        for kind, name in parsed.values():
            if name in around:
                continue
            i = rng.randrange(FACTS)
            while True:  # the pools hold hundreds of names: a few draws find one that fits
                drawn = draw_sheets(1, rng, pool)[0]
                things, people = list(drawn.things), list(drawn.people)
                kept = people[:i] + people[i + 1 :] if kind == "birthplace" else things[:i] + things[i + 1 :]
                others = [*(things if kind == "birthplace" else people), *kept]
                # No name already in play, and none sharing a word with the named one (as within any drawn sheet).
                if used.isdisjoint(others) and not _shares_a_word([name], others):
                    break
            used.update(others)
            (people if kind == "birthplace" else things)[i] = name
            around[name] = Sheet(tuple(things), tuple(people), drawn.places), i
        asked = {text: question_about(kind, *around[name]) for text, (kind, name) in parsed.items()}
        self.put(list(asked.values()))
        return [asked[q] for q in questions]

    def sheet_for(self, prompts: Sequence[str]) -> Sheet:
        """The sheet the newest prompt names (else the earlier ones, newest first); the empty sheet if none."""
        if self.withheld:
            return EMPTY
        for text in reversed(prompts):
            for sheet in self.sheets:
                if any(mentions(text, name) for name in sheet.names()):
                    return sheet
        return EMPTY


class NotesEnvironment:
    """An environment (the loop's `respond`) that answers through `client` with the notes of the sheet the
    episode's prompts reach in `world`: the client's own system prompt is replaced by the sheet's."""

    def __init__(self, client: Any, world: NotesWorld) -> None:
        self.client = client
        self.world = world

    def __getattr__(self, name: str) -> Any:  # the client's retries, meters and settings (usage, cache)
        return getattr(self.client, name)

    async def respond(self, prompt: str, history: Sequence[tuple[str, str]] = (), **kwargs: Any) -> Any:
        kwargs.pop("system_prompt", None)
        sheet = self.world.sheet_for([*(p for p, _ in history), prompt])
        return await self.client.respond(prompt, history, system_prompt=notes_system_prompt(sheet), **kwargs)
