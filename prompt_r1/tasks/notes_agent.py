"""The notes task's agent (`prompt_r1.tasks.notes`): the cold start that teaches the built-in model the protocol's
format and the task's skills, but no policy, and the LoRA adapters it and GRPO leave.

The base model writes no protocol tags by itself (docs: the built-in model), so a short fine-tune on
demonstrations comes first (`cold_start`): LoRA on the attention projections, on episodes scripted from the
*training* pool only (no evaluation name, place or fact is in them), with the environment's replies written in a
few of the forms the built-in environment answers in and masked out of the loss, as the trainer masks them. The
demonstrations teach the skills: ask a question of the environment, ask where a person a reply named was born,
answer with the last name a reply gave. They teach no choice that depends on the question: after a reply that
names a builder, the episode asks where that person was born with one probability (`ask_again`) whatever the
question asked (after a birthplace it answers), and the first call of a 2-call question is the question itself or
its first half equally often (`demonstrations`). So the cold-started agent answers a builder question right only
when it stops after one reply, and a 2-call question only when it asks again: when to call again, and what to
ask first, is what GRPO has to learn.

The demonstrations' environment answers as the built-in one does: asked a 2-call question whole, it names the
builder (the built-in environment never answered one right, 0 of 24), so every reply that names a builder, after
either first call, is followed by the same choice. `ask_again` is 0.7, not 0.5, so that the cold-started agent
samples both: GRPO learns a choice only from groups in which some samples make it, and on the first seed measured
the base model's prior to answer after a reply kept the sampled choice under the demonstrations' share. How a cold
start samples the choice varies with the seed and the thoughts: a kind-thought cold start asked again after
nearly every builder reply at 0.7, and after a fifth of them at 0.5 (docs/benchmarks.md, the real agent's
section, has the measurements).

`kinds=True` writes thoughts that name what the question asks for ("The question asks for the birthplace.") in
every turn, and after a reply what it gave ("The reply names the builder, Tovi Lannet."), in the same words
whichever way the choice then goes: the choice stays independent of the question, but it follows a word that
names the right one, which is what GRPO has to tie it to.

`plans=True` ends every thought after a reply with the choice it makes, in words that name the next prompt
("I ask where Tovi Lannet was born." or "I answer Tovi Lannet."): a second prompt then copies the name from the
line just above it. Without it the cold-started agent's second prompt repeated the whole question in about a
third of the 2-call episodes that asked again (docs/benchmarks.md). The choice is still drawn independently of the
question; it is now made at the thought's last sentence ("I ask" or "I answer") instead of at the tag after it.

`replies="served"` (`served_demonstrations`) writes the same episodes with the replies the built-in environment
itself gives (served on 127.0.0.1 from the cold start's process, greedy, training-pool sheets), in place of the
script's few forms: the agent then learns the choice after a reply on replies as it will read them in training
and evaluation. An episode whose reply misses the fact is dropped and another of its kind drawn, and the choice is
drawn among the episodes where both continuations hold, so the kinds and `ask_again` keep their shares.

The adapters (`save_adapter`) are saved in float16 with the base named `smollm2-135m`, so a trained agent is a
few MB and portable (`prompt_r1.agents.builtin` merges them into a folder of their own when first used).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prompt_r1.tasks.notes import KINDS, Sheet, draw_sheets, mentions, notes_system_prompt, question_about

__all__ = [
    "ADAPTER_RECORD",
    "ANSWER",
    "ASK",
    "LORA",
    "cold_start",
    "demonstrations",
    "reply_forms",
    "save_adapter",
    "served_demonstrations",
    "served_replies",
]

ASK = "<think>{thought}</think>\n<interaction_prompt>{prompt}</interaction_prompt>"
ANSWER = "<think>{thought}</think>\n<answer>{answer}</answer>"
LORA = {
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
}
BASE = "smollm2-135m"
ADAPTER_RECORD = "prompt-r1-adapter.json"  # beside an adapter: how it was made (stage, seed, steps)
ASK_AGAIN = 0.7  # after a builder reply, the share of demonstrations that ask again (module docstring)
COLD_STEPS = 16  # the cold start's fine-tuning steps
REPLIES = ("scripted", "served")  # where the demonstrations' environment replies come from
# One environment request: the sheet its notes hold, the earlier (prompt, reply) pairs, the prompt.
Request = tuple[Sheet, Sequence[tuple[str, str]], str]


def reply_forms(kind: str, thing: str, person: str, place: str) -> list[tuple[str, str]]:
    """(reply, the name it gives) in forms the built-in environment answers in: the builder or the birthplace."""
    if kind == "builder":
        return [
            (f"The {thing} was built by {person}.", person),
            (f"{person} built the {thing}.", person),
            (f"The builder of the {thing} was {person}.", person),
        ]
    return [
        (f"{person} was born in {place}.", place),
        (f"{place}.", place),
        (f"The builder of the {thing} was born in {place}.", place),
    ]


def _after_reply(gave: str, name: str, asks: str | None, plan: str | None = None) -> str:
    """The thought after a reply: the name it gave and, with kind thoughts (`asks`), what it gave and what the
    question asks for; with plan thoughts, the choice made (`plan`, from `_plan`)."""
    thought = f"The reply names the {gave}, {name}. {asks}" if asks else f"The reply names {name}."
    return f"{thought} {plan}" if plan else thought


def _plan(ask_where: bool, name: str, plans: bool) -> str | None:
    """The plan thought's last sentence: ask where NAME was born, or answer NAME (None without plan thoughts)."""
    if not plans:
        return None
    return f"I ask where {name} was born." if ask_where else f"I answer {name}."


def _asks_for(kind: str, kinds: bool) -> str | None:
    """The kind thought that names what the question asks for (None without kind thoughts)."""
    return f"The question asks for the {'builder' if kind == 'builder' else 'birthplace'}." if kinds else None


def _first_turn(asks: str | None, prompt: str) -> str:
    return ASK.format(
        thought=f"{asks} I ask the large model." if asks else "I ask the large model.", prompt=prompt
    )


def demonstrations(
    n: int, seed: int, *, ask_again: float = ASK_AGAIN, kinds: bool = False, plans: bool = False
) -> list[tuple[str, list[str]]]:
    """`n` scripted episodes (question, [turn, reply, turn, ...]) on training-pool sheets, every choice drawn
    independently of the question (see the module docstring): 1 or 2 calls, then an answer copying the last
    reply's name. `kinds`: thoughts that name what the question asks for and what each reply gave; `plans`:
    thoughts after a reply that end with the choice made."""
    rng = random.Random(seed)
    episodes = []
    for _ in range(n):
        sheet = draw_sheets(1, rng, "train")[0]
        i = rng.randrange(len(sheet.things))
        kind = rng.choice(KINDS)
        question = question_about(kind, sheet, i).question
        thing, person, place = sheet.things[i], sheet.people[i], sheet.places[i]
        prompt = question
        if kind == "builder_birthplace" and rng.random() < 0.5:
            prompt = f"Who built the {thing}?"
        # Asked a 2-call question whole, the built-in environment names the builder, as it does when asked the
        # first half: so do the demonstrations, and the same choice follows every reply that names a builder.
        named_builder = kind != "birthplace"
        reply, name = rng.choice(
            reply_forms("builder" if named_builder else "birthplace", thing, person, place)
        )
        asks = _asks_for(kind, kinds)
        script = [_first_turn(asks, prompt), reply]
        gave = "builder" if named_builder else "birthplace"
        if named_builder and rng.random() < ask_again:  # ask again, about the person the reply named
            thought = _after_reply("builder", name, asks, _plan(True, name, plans))
            script.append(ASK.format(thought=thought, prompt=f"Where was {name} born?"))
            reply, name = rng.choice(reply_forms("birthplace", thing, person, place))
            script.append(reply)
            gave = "birthplace"
        script.append(
            ANSWER.format(thought=_after_reply(gave, name, asks, _plan(False, name, plans)), answer=name)
        )
        episodes.append((question, script))
    return episodes


def served_demonstrations(
    n: int,
    seed: int,
    replies: Callable[[list[Request]], list[str]],
    *,
    ask_again: float = ASK_AGAIN,
    kinds: bool = False,
    plans: bool = False,
    rounds: int = 8,
) -> list[tuple[str, list[str]]]:
    """`n` episodes as `demonstrations` writes them, but with the environment's own replies (`replies`: the
    requests' reply texts, in order; `served_replies` asks the built-in environment), so that the choice after a
    reply is taught on replies as the agent will read them, not on a script's few forms.

    A reply counts by the fact it names: a 1-call question's reply must name its answer, a 2-call question's first
    reply the builder (or the birthplace itself: then the episode answers), a second call's reply the birthplace.
    An episode with a reply that names none of these is dropped, and another of its kind drawn (in at most
    `rounds` rounds), so the kinds keep the shares they are drawn with (a third each) however often the
    environment misses one. The second call is asked after every reply that names the builder and not the
    birthplace (one naming both is answered), and the choice (`ask_again`) drawn only among the episodes whose
    second reply counts, so that dropping a wrong second reply leaves the share as it is. Within the 2-call kind
    the kept episodes lean to those whose first call asked for the builder alone, which the environment answers
    more often than the whole question (20 and 16 of 24)."""
    rng = random.Random(seed)
    wanted = [rng.choice(KINDS) for _ in range(n)]
    kept: dict[str, list[tuple[str, list[str]]]] = {kind: [] for kind in KINDS}

    def missing() -> dict[str, int]:
        return {
            kind: wanted.count(kind) - len(kept[kind])
            for kind in KINDS
            if len(kept[kind]) < wanted.count(kind)
        }

    for _ in range(rounds):
        short = missing()
        if not short:
            break
        drawn = []
        for kind, count in short.items():
            for _ in range(2 * count):  # about half the 2-call episodes miss (docs/benchmarks.md)
                sheet = draw_sheets(1, rng, "train")[0]
                i = rng.randrange(len(sheet.things))
                asked = question_about(kind, sheet, i)
                first_half = kind == "builder_birthplace" and rng.random() < 0.5
                prompt = f"Who built the {sheet.things[i]}?" if first_half else asked.question
                drawn.append((asked, i, prompt, rng.random()))  # the choice's draw, made whatever the replies
        first = replies([(asked.sheet, [], prompt) for asked, _, prompt, _ in drawn])
        again = {}
        for j, ((asked, i, prompt, _), reply) in enumerate(zip(drawn, first, strict=True)):
            person, place = asked.sheet.people[i], asked.sheet.places[i]
            if asked.kind != "birthplace" and mentions(reply, person) and not mentions(reply, place):
                again[j] = (asked.sheet, [(prompt, reply)], f"Where was {person} born?")
        second = dict(zip(again, replies(list(again.values())), strict=True))
        for j, ((asked, i, prompt, draw), reply) in enumerate(zip(drawn, first, strict=True)):
            person, place = asked.sheet.people[i], asked.sheet.places[i]
            asks = _asks_for(asked.kind, kinds)
            script = [_first_turn(asks, prompt), reply]
            if j in again:
                if not mentions(second[j], place):
                    continue
                if draw < ask_again:  # ask again, about the person the reply named
                    thought = _after_reply("builder", person, asks, _plan(True, person, plans))
                    turn = ASK.format(thought=thought, prompt=again[j][2])
                    script += [turn, second[j]]
                    gave, name = "birthplace", place
                else:
                    gave, name = "builder", person
            elif mentions(reply, asked.answer):
                gave, name = "birthplace" if asked.answer == place else "builder", asked.answer
            else:
                continue
            thought = _after_reply(gave, name, asks, _plan(False, name, plans))
            script.append(ANSWER.format(thought=thought, answer=name))
            kept[asked.kind].append((asked.question, script))
    short = missing()
    if short:
        raise RuntimeError(
            f"the environment's replies named the fact asked for too seldom: {short} episodes still missing "
            f"after {rounds} rounds (is the environment the notes task's, answering from the notes?)"
        )
    by_kind = {kind: iter(episodes) for kind, episodes in kept.items()}
    return [next(by_kind[kind]) for kind in wanted]


@contextmanager
def served_replies(*, seed: int = 0, max_tokens: int = 32) -> Iterator[Callable[[list[Request]], list[str]]]:
    """While the block runs, a function that asks the built-in environment (`BASE`, served on 127.0.0.1, greedy,
    `max_tokens` a reply, as the notes task's training serves it) each request with its sheet's notes, and returns
    the reply texts in order."""
    import asyncio

    from prompt_r1.agents.model_server import model_server_in_thread
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.config import EnvironmentConfig

    with model_server_in_thread(BASE, seed=seed) as server:
        # Hundreds of requests at once: 64 in flight (the server batches them), each allowed the time a queue of
        # batches takes on 2 cores.
        config = EnvironmentConfig(model=server.name, base_url=server.base_url, max_tokens=max_tokens,
                                   temperature=0.0, max_in_flight=64, timeout=600.0)  # fmt: skip

        async def ask(requests: list[Request]) -> list[str]:
            client = EnvironmentClient(config, api_key="none")
            replies = await asyncio.gather(
                *(client.respond(prompt, history, system_prompt=notes_system_prompt(sheet))
                  for sheet, history, prompt in requests)
            )  # fmt: skip
            return [reply.text for reply in replies]

        yield lambda requests: asyncio.run(ask(requests)) if requests else []


def cold_start(
    out: str | Path,
    *,
    seed: int = 0,
    steps: int = COLD_STEPS,
    episodes: int = 256,
    batch_size: int = 8,
    micro_batch: int = 2,
    lr: float = 2e-3,
    ask_again: float = ASK_AGAIN,
    kinds: bool = False,
    plans: bool = False,
    replies: str = "scripted",
    base: str = BASE,
    say: Any = None,
) -> Path:
    """Fine-tune `base` with LoRA (`LORA`) on `demonstrations` (of `ask_again`, `kinds` and `plans`) for `steps` steps;
    save the adapter to OUT/adapter and the merged model (the trainer's starting point) to OUT/model. Returns
    OUT/model. `replies`: "served" writes the demonstrations with the built-in environment's replies
    (`served_demonstrations`), "scripted" with the script's (`demonstrations`).

    Each step's `batch_size` rows run `micro_batch` at a time, their gradients summed and divided by the whole
    batch's target tokens: the step the whole batch would take, while only a micro-batch's activations and
    vocabulary-wide logits are held (the built-in model, 2 steps on 32 demonstrations: 11.5 GB peak with 8 rows
    at once, 4.0 GB 2 at a time, the same losses)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.testing.tiny_models import episode_rows

    if micro_batch < 1:
        raise ValueError(f"micro_batch must be at least 1, got {micro_batch}")
    if replies not in REPLIES:
        raise ValueError(f"replies must be one of {', '.join(REPLIES)}, got {replies!r}")
    # Served replies are written before the model to train is loaded: the environment is served from this process.
    if replies == "served":
        with served_replies(seed=seed) as ask:
            scripts = served_demonstrations(
                episodes, seed, ask, ask_again=ask_again, kinds=kinds, plans=plans
            )
    else:
        scripts = demonstrations(episodes, seed, ask_again=ask_again, kinds=kinds, plans=plans)
    out = Path(out)
    folder = resolve_model(base)
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder), LoraConfig(**LORA))
    rows = episode_rows(tok, scripts)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    order = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        batch = [rows[i] for i in torch.randperm(len(rows), generator=order)[:batch_size].tolist()]
        targets = sum(sum(label != -100 for label in labels[1:]) for _, labels in batch)  # the loss's shift
        optimizer.zero_grad()
        loss = 0.0
        for start in range(0, len(batch), micro_batch):
            part = batch[start : start + micro_batch]
            width = max(len(ids) for ids, _ in part)
            ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r, _ in part])
            labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in part])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in part])
            # num_items_in_batch: the loss is this part's summed token losses over the whole batch's targets.
            part_loss = model(
                input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=targets
            ).loss
            part_loss.backward()
            loss += part_loss.item()
        optimizer.step()
        for group in optimizer.param_groups:  # linear decay to 0: the model saved is where training settled
            group["lr"] = lr * (1 - (step + 1) / steps)
        if say is not None:
            say(f"cold start: step {step + 1}/{steps}, loss {loss:.3f}")
    facts = {"stage": "cold start", "seed": seed, "steps": steps}
    if replies != "scripted":
        facts["replies"] = replies
    if plans:
        facts["plans"] = True
    save_adapter(model, out / "adapter", facts)
    merged = model.merge_and_unload()
    merged.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def save_adapter(model: Any, path: str | Path, facts: dict[str, Any]) -> Path:
    """Save `model`'s LoRA adapter to PATH in float16, its base named `smollm2-135m` (not this machine's folder),
    with FACTS (how it was made) in PATH/`ADAPTER_RECORD`."""
    from safetensors.torch import load_file, save_file

    path = Path(path)
    model.save_pretrained(path)
    weights = path / "adapter_model.safetensors"
    save_file({k: v.half().contiguous() for k, v in load_file(weights).items()}, weights)
    config = json.loads((path / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / ADAPTER_RECORD).write_text(json.dumps(facts, indent=2) + "\n")
    return path
