"""The hops task's agent (`prompt_r1.tasks.hops`): fine-tuning data that teaches skills but no chain, the build,
and its checks.

The agent starts from `build_hops_model`: fine-tuned first on whole chains (the skills: name the question's
thing, name the thing a reply names, copy a reply's code; every reply drawn afresh, so no fact is learned), until
the greedy agent does each in `READING_TARGET` of cases; then on a mixture that undoes the chain: at every turn
each behaviour is equally likely whatever came before (answer, ask about the question's thing again, ask about
the thing the last reply names, or at the first turn ask about nothing). An answer copies the last reply's code
when it gives one, and guesses otherwise: copying is a skill (how to answer), not a choice (when to answer), so
the mixture keeps it whole; door codes' mixture copied half the time, which here, with 24 codes, left some seeds'
agents copying in under a fifth of their answers. Fewer than one mixture answer in ten copies, though, and the
stage's drift wore copying down on some seeds (40-70 % sampled): so a guess's code is not trained on (it taught
random codes), whole chains of which only the copied code is trained go in the same batches (copying, with no
choice a target), and the rate decays to 0 (a constant one left the agent wherever its last step fell). The
build then checks, on sampled turns, that each skill is still there (`SKILL_FLOOR` for the choices' skills,
`COPY_FLOOR` for copying) and that no choice is preferred (`CHOICE_CEILING`), and fails with `HopsBuildError`
otherwise.
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

from prompt_r1.tasks.hops import (
    ANSWER,
    ASK,
    ASK_NOTHING,
    ASKED,
    CODES,
    KIND,
    MAX_SCRIPT_CALLS,
    NAME_ONE,
    NAME_SOME,
    ROOMS,
    WITHHELD,
    Table,
    ask_about,
    chain_of,
    named,
    pointed,
    question_for,
    render,
    reply_code,
)

__all__ = [
    "CHOICE_CEILING",
    "COPY_FLOOR",
    "READING_TARGET",
    "SKILL_FLOOR",
    "HopsBuildError",
    "all_but_copied_code",
    "build_hops_model",
    "guessed_code",
    "mixture_episodes",
    "mixture_stage",
    "reading_episodes",
    "skill_shares",
    "whole_chain_stage",
]


def _answer(rng: random.Random, last_reply: str | None) -> str:
    """The answer after `last_reply`: its code when it gives one, else a guess."""
    code = reply_code(last_reply or "")
    if code is not None:
        return ANSWER.format(thought="ok", code=code)
    return ANSWER.format(thought="guess", code=rng.choice(CODES))


def _code_in(thought: str) -> re.Pattern[str]:
    return re.compile(re.escape(ANSWER.format(thought=thought, code="@")).replace("@", "(.*?)"))


GUESSED, COPIED = _code_in("guess"), _code_in("ok")


def guessed_code(turn: str) -> list[tuple[int, int]]:
    """The mixture stage's untrained spans: a guess's code (nine in ten of its answers guess; trained on, their
    uniform codes taught the sampled agent to answer a random code after a code reply too)."""
    return [m.span(1) for m in GUESSED.finditer(turn)]


def all_but_copied_code(turn: str) -> list[tuple[int, int]]:
    """The copy rows' untrained spans: everything but a copied code (no choice is a target there)."""
    match = COPIED.search(turn)
    return [(0, match.start(1)), (match.end(1), len(turn))] if match else [(0, len(turn))]


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
        script.append(_answer(rng, script[-1]))
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
                script.append(_answer(rng, reply))
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
# After the mixture (sampled turns): each choice's skill at least this often (the mixture gives 1/3 for naming the
# question's thing, naming the reply's thing, and answering after a code) ...
SKILL_FLOOR = 0.2
# ... an answer after a code reply copies it at least this often (the mixture always copies) ...
COPY_FLOOR = 0.8
# ... and no choice this much more often than the mixture's share (no chain held: its 1/3 choices stay below it).
CHOICE_CEILING = 0.55
MAX_READING_STEPS = 3000
MIXTURE_ATTEMPTS = 5


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


def whole_chain_stage(
    path: str | Path,
    *,
    seed: int = 0,
    steps: int = 300,
    episodes: int = 256,
    batch_size: int = 64,
    **shape: Any,
) -> Path:
    """The build's first round: a new tiny model fine-tuned `steps` steps on `episodes` whole chains
    (`reading_episodes`), with the task's words in its tokenizer. No check: `build_hops_model` checks it and goes on;
    a test that needs a model that plays the protocol, not a skilled one, uses it alone."""
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
    return build_protocol_model(
        path, reading_episodes(episodes, seed=seed), corpus=corpus, added_tokens=[INSTRUCTION_TEMPLATE, *tags],
        seed=seed, batch_size=batch_size, steps=steps, **shape,
    )  # fmt: skip


def mixture_stage(
    path: Path, start_from: Path, *, seed: int, steps: int, episodes: int, batch_size: int
) -> Path:
    """The build's second round, from the whole-chain agent at `start_from`: `steps` on `mixture_episodes` (a
    guess's code untrained) and, in the same batches, `episodes // 2` whole chains of which only the copied code
    is trained, so copying (fewer than one mixture answer in ten copies) stays whole; no choice is a target in
    those rows, though they do shift the answer-after-a-code share up (a third on average on development seeds,
    about 0.42 against 0.32; `CHOICE_CEILING` is checked after). The rate decays to 0, so the agent saved is where
    training settled. Each `seed` draws other episodes as well as another batch order."""
    from prompt_r1.testing.tiny_models import build_protocol_model

    mixture, copies = mixture_episodes(episodes, seed=seed), reading_episodes(episodes // 2, seed=seed + 1)
    return build_protocol_model(
        path, mixture, start_from=start_from, seed=seed,
        # Batches grow by the copy rows' share, so a step trains as many mixture rows as without them.
        batch_size=batch_size * (len(mixture) + len(copies)) // len(mixture),
        steps=steps, decay=True, untrained=guessed_code, more=[(copies, all_but_copied_code)],
    )  # fmt: skip


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
    `READING_TARGET` of cases (at most `max_reading_steps`), then `mixture_stage`, after which the sampled agent
    must still have each skill (`SKILL_FLOOR`; copying `COPY_FLOOR`) and prefer no choice (`CHOICE_CEILING`; the
    stage is redone with other episodes and batches, `MIXTURE_ATTEMPTS` in all, when it does not: the choice
    shares swing from try to try, and five make a lasting miss rare). Raises HopsBuildError when a check
    still fails. The figures go to PATH/hops_build.json, written last."""
    import json

    from prompt_r1.testing.tiny_models import build_protocol_model

    path = Path(path)
    reading = reading_episodes(episodes // 2, seed=seed)
    _say(f"seed {seed}: fine-tuning a tiny model on whole chains, {steps} steps a round")
    whole_chain_stage(path, seed=seed, steps=steps, episodes=episodes // 2, batch_size=batch_size, **shape)
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
            mixture_stage(path, reading_stage, seed=seed + 7919 * attempt, steps=steps,
                          episodes=episodes, batch_size=batch_size)  # fmt: skip
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
    """What the sampled agent lacks (a skill under its floor) or holds (a choice over `CHOICE_CEILING`)."""
    floors = {skill: COPY_FLOOR if skill == "copy" else SKILL_FLOOR for skill in sampled}
    problems = [f"{s} {v:.0%} < {floors[s]:.0%} (a skill lost)" for s, v in sampled.items() if v < floors[s]]
    problems += [
        f"{s} {sampled[s]:.0%} > {CHOICE_CEILING:.0%} (a choice preferred)"
        for s in ("question", "follow", "stop")
        if sampled[s] > CHOICE_CEILING
    ]
    return problems
