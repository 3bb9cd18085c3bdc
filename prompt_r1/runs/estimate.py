"""What a run will cost before it runs: episodes, environment calls, tokens, dollars, and the time the rate and token
limits alone impose, from the real questions, the protocol's messages, the loop's limits and the price table.
Nothing is sent and no model is loaded; `batch`, `eval` and `train` print it with `--dry-run` (docs/cost.md).

    shape = EpisodeShape.from_rows(rows, loop=loop) or EpisodeShape.assumed(loop)
    part = episode_part("batch", questions, shape, loop=loop, env_model="gpt-4o-mini", counter=TokenCounter())
    estimate = Estimate([part], prices=PriceTable.load(), environment=env_config, budget=5.0)
    print(render_estimate(estimate))           # prompt_r1.runs.estimate_report

The model of an episode (its numbers are the `EpisodeShape`):
- **Calls.** An episode makes `n` environment calls, at most `max_turns` (exact: the loop never makes more), and
  `n + 1` agent turns (one more when the turns run out and the agent is asked for a final answer). `n` is the mean
  of earlier episodes when there are any (the rows of the results file being resumed, or `--expect-from FILE`),
  `--expect-turns N` when given, else the assumption `ASSUMED_CALLS` (the instruction template's first
  explanation and one refinement). Low: the fewest calls seen in earlier episodes, else one.
- **Tokens.** Environment call `k` reads the system prompt, the `k - 1` earlier prompt/reply pairs and the new
  prompt; agent turn `k` reads the first message (rendered from each real question) and every earlier turn and
  reply. Turn, prompt and reply lengths are the means of earlier episodes, else `ASSUMED_TOKENS`; high uses the
  limits: `max_turn_tokens` per agent turn and prompt, the environment's `max_tokens` per reply (when unset, an
  assumption the report names). Text is counted at `chars_per_token` characters a token (4, OpenAI's rule of
  thumb), measured from earlier episodes' reported usage when there are any, and every chat message adds
  `MESSAGE_TOKENS`.
- **Dollars** are the tokens priced by the price table (prompt_r1/clients/costs.py); an unpriced paid model is
  named, never counted as free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.core.config import EnvironmentConfig, LoopConfig
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT, interaction_response

__all__ = [
    "ASSUMED_CALLS",
    "ASSUMED_TOKENS",
    "ASSUMED_UNCAPPED_REPLY",
    "EpisodeShape",
    "Estimate",
    "Part",
    "Spend",
    "TokenCounter",
    "episode_part",
    "single_call_part",
]

ASSUMED_CALLS = 2.0  # environment calls per episode when no earlier episode says otherwise
# Tokens per agent turn, per interaction prompt (the part of a turn the environment reads), per environment reply:
# the template's "brief thinking, not over 80 words" plus a prompt, and a paragraph-long answer.
ASSUMED_TOKENS = {"agent_turn": 200.0, "prompt": 100.0, "reply": 400.0}
# The longest reply `high` assumes when the environment's max_tokens is unset (the endpoint's own default then
# decides, and no bound holds).
ASSUMED_UNCAPPED_REPLY = 4096
MESSAGE_TOKENS = 4  # what a chat message adds to its text (role and separators; OpenAI counts 3 to 4)
SCENARIOS = ("low", "expected", "high")


@dataclass(frozen=True)
class TokenCounter:
    """Tokens of a text: `chars_per_token` characters a token, or the agent's own tokenizer for its first prompt."""

    chars_per_token: float = 4.0
    tokenizer: Any = None

    def text(self, text: str) -> float:
        return len(text) / self.chars_per_token

    def messages(self, messages: Sequence[Mapping[str, str]]) -> float:
        return sum(self.text(str(m.get("content", ""))) + MESSAGE_TOKENS for m in messages)

    def first_prompt(self, protocol: Any, question: str) -> float:
        """The agent's first prompt: exact through its tokenizer's chat template when one is at hand."""
        if self.tokenizer is not None:
            return float(len(protocol.first_prompt_ids(self.tokenizer, question)))
        return self.messages(protocol.agent_messages({"question": question, "turns": []}))


def _count(value: Any) -> bool:
    """Whether a row's token or call count can be learned from: a finite number ≥ 0 (a row from a hostile or broken
    server may say Infinity, -5 or "many")."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


def _as_float(value: float) -> float:
    """A limit as a float; an integer past any float (--env-max-tokens 10**310) is infinite: no bound.

    >>> _as_float(10**400)
    inf
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf


@dataclass(frozen=True)
class EpisodeShape:
    """What one episode is expected to do, per scenario (low, expected, high): environment calls, and tokens per
    agent turn, per interaction prompt and per environment reply. `source` says where the numbers come from."""

    calls: tuple[float, float, float]
    agent_turn: tuple[float, float, float]
    prompt: tuple[float, float, float]
    reply: tuple[float, float, float]
    chars_per_token: float = 4.0
    source: str = "assumed"
    notes: tuple[str, ...] = ()

    @classmethod
    def assumed(
        cls,
        loop: LoopConfig,
        *,
        agent_max_tokens: int = 1024,
        env_max_tokens: int | None = None,
        expect_turns: float | None = None,
    ) -> EpisodeShape:
        """The stated assumptions (`ASSUMED_CALLS`, `ASSUMED_TOKENS`), or `expect_turns` calls per episode."""
        turn_max = loop.max_turn_tokens or agent_max_tokens
        calls = ASSUMED_CALLS if expect_turns is None else expect_turns
        source = (
            f"--expect-turns {expect_turns:g}"
            if expect_turns is not None
            else f"assumed: {ASSUMED_CALLS:g} environment calls per episode"
        )
        shape = cls(
            calls=(min(1.0, calls), calls, 0.0),
            agent_turn=(ASSUMED_TOKENS["agent_turn"],) * 3,
            prompt=(ASSUMED_TOKENS["prompt"],) * 3,
            reply=(ASSUMED_TOKENS["reply"],) * 3,
            source=source + f"; {ASSUMED_TOKENS['agent_turn']:g} tokens per agent turn, "
            f"{ASSUMED_TOKENS['reply']:g} per reply (no earlier episodes)",
        )
        return shape.bounded(loop, turn_max, env_max_tokens)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Mapping[str, Any]],
        loop: LoopConfig,
        *,
        agent_max_tokens: int = 1024,
        env_max_tokens: int | None = None,
        expect_turns: float | None = None,
        where: str = "earlier episodes",
    ) -> EpisodeShape | None:
        """The means of earlier episodes' rows (a batch results file, eval's loop rows), or None when none
        finished. Characters per token are measured from the usage their providers reported."""
        calls, turns, turn_tokens, reply_tokens, prompts = [], 0, 0, 0, []
        turn_chars = reply_chars = 0
        for row in rows:
            usage = {k: v for k, v in (row.get("usage") or {}).items() if _count(v)}
            records = row.get("turns") or []
            if row.get("status") in {"environment_error", "agent_error", "internal_error"} or not records:
                continue
            made = [t for t in records if t.get("environment_call")]
            calls.append(len(made))
            turns += usage.get("agent_calls", len(records))
            turn_tokens += usage.get("agent_completion_tokens", 0)
            turn_chars += sum(len(t.get("text") or "") for t in records)
            for t in made:
                reply = t["environment_call"].get("output_tokens", 0)
                reply_tokens += reply if _count(reply) else 0
                reply_chars += len(t.get("response") or "")
                prompts.append(len(t.get("prompt") or ""))
        if not calls:
            return None
        tokens, chars = turn_tokens + reply_tokens, turn_chars + reply_chars
        per_token = chars / tokens if tokens and chars else 4.0
        if not math.isfinite(per_token) or per_token <= 0:  # counts near 0 or past 1e308: no ratio to learn
            per_token = 4.0
        mean_calls = sum(calls) / len(calls) if expect_turns is None else expect_turns
        mean_reply = reply_tokens / sum(calls) if sum(calls) else ASSUMED_TOKENS["reply"]
        mean_turn = turn_tokens / turns if turns else ASSUMED_TOKENS["agent_turn"]
        mean_prompt = (sum(prompts) / len(prompts) / per_token) if prompts else ASSUMED_TOKENS["prompt"]
        shape = cls(
            calls=(min(min(calls), mean_calls), mean_calls, 0.0),
            agent_turn=(mean_turn,) * 3,
            prompt=(mean_prompt,) * 3,
            reply=(mean_reply,) * 3,
            chars_per_token=per_token,
            source=f"{len(calls)} {where}: {mean_calls:.2f} environment calls per episode"
            + (" (--expect-turns)" if expect_turns is not None else "")
            + f", {mean_turn:.0f} tokens per agent turn, {mean_reply:.0f} per reply, "
            f"{per_token:.2f} characters per token",
        )
        turn_max = loop.max_turn_tokens or agent_max_tokens
        return shape.bounded(loop, turn_max, env_max_tokens)

    def bounded(self, loop: LoopConfig, turn_max: int, env_max_tokens: int | None) -> EpisodeShape:
        """Expected numbers held to the limits, and `high` set to them."""
        cap = _as_float(loop.max_turns)
        reply_max = _as_float(env_max_tokens or ASSUMED_UNCAPPED_REPLY)
        notes = list(self.notes)
        if env_max_tokens is None:
            notes.append(
                f"the environment's max_tokens is unset: high assumes {ASSUMED_UNCAPPED_REPLY:,} tokens a "
                "reply and is no bound (set --env-max-tokens to make it one)"
            )

        def held(values: tuple[float, float, float], top: float) -> tuple[float, float, float]:
            return (min(values[0], top), min(values[1], top), top)

        return replace(
            self,
            calls=held(self.calls, cap),
            agent_turn=held(self.agent_turn, _as_float(turn_max)),
            prompt=held(self.prompt, _as_float(turn_max)),
            reply=held(self.reply, reply_max),
            notes=tuple(notes),
        )


@dataclass
class Spend:
    """Calls and tokens of one scenario, and what they cost (None: a paid model has no price)."""

    env_calls: float = 0.0
    agent_calls: float = 0.0
    env_in: float = 0.0
    env_out: float = 0.0
    agent_in: float = 0.0
    agent_out: float = 0.0
    env_usd: float | None = 0.0
    agent_usd: float | None = 0.0

    @property
    def usd(self) -> float | None:
        return None if self.env_usd is None or self.agent_usd is None else self.env_usd + self.agent_usd

    def __add__(self, other: Spend) -> Spend:
        out = Spend()
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(out, f.name, None if a is None or b is None else a + b)
        return out

    def scaled(self, factor: float) -> Spend:
        return Spend(
            **{f.name: (None if (v := getattr(self, f.name)) is None else v * factor) for f in fields(self)}
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: None if (v := getattr(self, f.name)) is None else round(v, 6) for f in fields(self)}
        out["usd"] = None if self.usd is None else round(self.usd, 6)
        return out


@dataclass
class Part:
    """One share of a run (a method on a dataset, a search, a training step's episodes): how many episodes or
    requests, and its spend per scenario. `kind` groups parts in the report (rows, search, training)."""

    label: str
    episodes: int
    spend: dict[str, Spend]
    kind: str = "rows"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "kind": self.kind,
            "episodes": self.episodes,
            **{name: self.spend[name].to_dict() for name in SCENARIOS},
            **({"note": self.note} if self.note else {}),
        }


def _price(
    prices: PriceTable, model: str | None, tokens_in: float, tokens_out: float, paid: bool
) -> float | None:
    """Dollars for these tokens; 0 for an unpaid model the table does not price, None for a paid one."""
    if model is None or (tokens_in == 0 and tokens_out == 0):
        return 0.0
    if not (math.isfinite(tokens_in) and math.isfinite(tokens_out)):  # beyond measure: no dollar figure
        return None if paid or prices.cost(model, 0, 0) is not None else 0.0
    cost = prices.cost(model, round(tokens_in), round(tokens_out))
    if cost is None:
        return None if paid else 0.0
    return cost


def episode_part(
    label: str,
    first_prompts: Sequence[float],
    shape: EpisodeShape,
    *,
    loop: LoopConfig,
    prices: PriceTable,
    env_model: str,
    agent_model: str | None,
    agent_paid: bool,
    counter: TokenCounter,
    system_prompt: str | None = None,
    kind: str = "rows",
) -> Part:
    """The spend of one episode per question (`first_prompts`: each question's first agent prompt in tokens)."""
    system = counter.text(system_prompt or ENVIRONMENT_SYSTEM_PROMPT) + MESSAGE_TOKENS
    wrap = counter.text(interaction_response("")) + MESSAGE_TOKENS
    episodes, q0 = len(first_prompts), float(sum(first_prompts))
    spend = {}
    for i, name in enumerate(SCENARIOS):
        n = shape.calls[i]
        a, p, r = shape.agent_turn[i], shape.prompt[i], shape.reply[i]
        turns = n + 1 + (1 if name == "high" and loop.force_final_answer else 0)
        # Call k reads the system prompt, k - 1 earlier pairs and its prompt: 2k messages.
        env_in = n * (system + p + MESSAGE_TOKENS) + (p + r + 2 * MESSAGE_TOKENS) * n * (n - 1) / 2
        agent_in_extra = (
            (a + wrap + r) * turns * (turns - 1) / 2
        )  # turn k reads the k earlier turns and replies
        s = Spend(
            env_calls=n * episodes,
            agent_calls=turns * episodes,
            env_in=env_in * episodes,
            env_out=n * r * episodes,
            agent_in=turns * q0 + agent_in_extra * episodes,
            agent_out=turns * a * episodes,
        )
        s.env_usd = _price(prices, env_model, s.env_in, s.env_out, True)
        s.agent_usd = _price(prices, agent_model, s.agent_in, s.agent_out, agent_paid)
        spend[name] = s
    return Part(label, episodes, spend, kind=kind)


def single_call_part(
    label: str,
    requests: Sequence[float],
    shape: EpisodeShape,
    *,
    prices: PriceTable,
    model: str,
    role: str = "environment",
    paid: bool = True,
    max_out: float | None = None,
    kind: str = "rows",
    calls_per_request: tuple[float, float, float] = (1.0, 1.0, 1.0),
    note: str | None = None,
) -> Part:
    """One call per request (`requests`: each request's input in tokens): a baseline's row, a search's call. The
    reply is the shape's (an agent's: its turn length); `calls_per_request` scales the calls per scenario."""
    spend = {}
    for i, name in enumerate(SCENARIOS):
        out = shape.agent_turn[i] if role == "agent" else shape.reply[i]
        if max_out is not None and name == "high":
            out = max_out
        k = calls_per_request[i]
        tokens_in = k * float(sum(requests))
        tokens_out = k * out * len(requests)
        s = Spend()
        if role == "agent":
            s.agent_calls, s.agent_in, s.agent_out = k * len(requests), tokens_in, tokens_out
            s.agent_usd = _price(prices, model, tokens_in, tokens_out, paid)
        else:
            s.env_calls, s.env_in, s.env_out = k * len(requests), tokens_in, tokens_out
            s.env_usd = _price(prices, model, tokens_in, tokens_out, paid)
        spend[name] = s
    return Part(label, len(requests), spend, kind=kind, note=note)


@dataclass
class Estimate:
    """A run's parts, their totals, the time the environment's limits impose, and where a budget stops it.

    `budget`: (flag name, dollars) of a cap checked before each unit starts (`--budget`: rows and episodes;
    `max_env_cost`: training steps); `calls_cap` likewise for calls. `unit`: what one stop step is (episode, row,
    step), with `per_unit`: the parts' spend per unit (training: one step's; else the parts' own episodes)."""

    parts: list[Part]
    environment: EnvironmentConfig | None = None
    title: str = "dry run"
    shape: EpisodeShape | None = None
    budget: tuple[str, float] | None = None
    calls_cap: tuple[str, float] | None = None
    unit: str = "episode"
    units: int | None = None
    header: list[tuple[str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # batch: the rows to run, done, repeated, kept
    notes: list[str] = field(default_factory=list)
    step: Part | None = None  # training: one generation step's spend, shown beside the run's

    def total(self, kind: str | None = None) -> dict[str, Spend]:
        out = {name: Spend() for name in SCENARIOS}
        for part in self.parts:
            if kind is None or part.kind == kind:
                for name in SCENARIOS:
                    out[name] = out[name] + part.spend[name]
        return out

    def limit_seconds(self, spend: Spend) -> float:
        """The shortest time the environment's request and token limits allow for `spend`'s calls."""
        env = self.environment
        if env is None or not spend.env_calls:
            return 0.0
        seconds = spend.env_calls / env.rate_limit * env.rate_period
        tokens = spend.env_in + spend.env_out
        if env.tokens_per_minute:
            seconds = max(seconds, tokens / env.tokens_per_minute * 60.0)
        if env.token_limit:
            seconds = max(seconds, tokens / env.token_limit * env.rate_period)
        return seconds

    def stops(self) -> list[str]:
        """Where the budget and the calls cap stop the run, per scenario, or that they do not."""
        units = self.units if self.units is not None else sum(p.episodes for p in self.parts)
        lines = []
        totals = self.total()
        for cap, value_of in ((self.budget, lambda s: s.usd), (self.calls_cap, lambda s: s.env_calls)):
            if cap is None:
                continue
            flag, limit = cap
            said = []
            for name in SCENARIOS:
                whole = value_of(totals[name])
                if whole is None:
                    said.append(f"{name}: unknown (a paid model has no price)")
                elif whole <= limit or not units:
                    said.append(f"{name}: not reached")
                else:
                    per = whole / units
                    done = min(units, math.floor(limit / per)) if per else units
                    said.append(f"{name}: stops after about {done:,} of {units:,} {self.unit}s")
            lines.append(f"{flag} {limit:g}: " + "; ".join(said))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The estimate as strict JSON values: a figure beyond any float (a rate period of 1e308 seconds, tokens
        past 1e308) is null, never `Infinity`, which JSON has not and most readers refuse."""
        totals = self.total()
        return _finite({
            "title": self.title,
            "header": dict(self.header),  # what the report's first lines say (episodes, schedule, cache)
            **({"counts": dict(self.counts)} if self.counts else {}),
            "source": self.shape.source if self.shape else None,
            "parts": [p.to_dict() for p in self.parts],
            "total": {name: totals[name].to_dict() for name in SCENARIOS},
            "limit_seconds": {name: round(self.limit_seconds(totals[name]), 3) for name in SCENARIOS},
            "stops": self.stops(),
            **({"step": self.step.to_dict()} if self.step is not None else {}),
            "notes": [*self.notes, *(self.shape.notes if self.shape else ())],
        })  # fmt: skip


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite (inf, nan) made None, through dicts and lists.

    >>> _finite({"a": [1.5, float("inf")], "b": float("nan")})
    {'a': [1.5, None], 'b': None}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
