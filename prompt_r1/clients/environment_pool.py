"""Several environment endpoints behind one `respond`: session-level routing (paper Eq. 19) and fallback.

    pool = EnvironmentPool([EnvironmentClient(a), EnvironmentClient(b)], weights=[3, 1])
    pool = EnvironmentPool.from_file("pool.yaml", base=EnvironmentConfig(...))   # `prompt-r1 batch --env-pool`
    reply = await pool.respond(prompt, history, run_config=run_config)

Each member is an `EnvironmentClient` (clients.environment) with its own rate limit, retries and response cache;
the pool decides only which member answers a call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path

from langchain_core.runnables import RunnableConfig

from prompt_r1.clients.environment import OPENAI_BASE_URL, EnvironmentClient, EnvironmentReply
from prompt_r1.core.checks import number
from prompt_r1.core.config import EnvironmentConfig
from prompt_r1.core.errors import ConfigError, EnvironmentCallError, is_retryable
from prompt_r1.core.redaction import mask_secrets

__all__ = ["EnvironmentPool", "session_key"]


def session_key(run_config: RunnableConfig | None) -> str | None:
    """The episode a call belongs to: the graph run's thread id, else an `episode_id` in its metadata."""
    if not run_config:
        return None
    key = (run_config.get("configurable") or {}).get("thread_id")
    if key is None:
        key = (run_config.get("metadata") or {}).get("episode_id")
    return None if key is None else str(key)


class EnvironmentPool:
    """Several environment endpoints behind one `respond`, with session-level routing and fallback.

    Routing: each episode (session) is assigned one member for all its turns, drawn with probability
    proportional to `weights` from a hash of its thread id, so the environment's conversation stays with one
    model and a rerun routes the same episode the same way. Calls without a session id are routed at random.

    Fallback: a member's own retries come first; when a call still fails, the next member (in pool order) takes
    it. A member that fails `trip_after` calls in a row with retryable failures (429, 5xx, timeouts, dropped
    connections: the endpoint's fault, not the request's) is skipped by every episode for `cooldown` seconds, then
    tried again; when all members are skipped, the least recently failed one is used.
    """

    def __init__(
        self,
        members: Sequence[EnvironmentClient],
        weights: Sequence[float] | None = None,
        *,
        names: Sequence[str] | None = None,
        trip_after: int = 3,
        cooldown: float = 30.0,
    ) -> None:
        if not members:
            raise ConfigError("an environment pool needs at least one member")
        weights = list(weights) if weights is not None else [1.0] * len(members)
        for weight in weights:
            number(weight, "a pool weight", minimum=0)
        number(trip_after, "trip_after", integer=True, minimum=1)
        number(cooldown, "cooldown (seconds)", minimum=0)
        if len(weights) != len(members) or sum(weights) <= 0:
            raise ConfigError(
                f"pool weights must be one non-negative number per member with a positive sum, got {weights}"
            )
        if names is not None:
            if len(names) != len(members) or len(set(names)) != len(names):
                raise ConfigError(f"pool member names must be unique, one per member, got {list(names)}")
            for member, name in zip(members, names, strict=True):
                member.name = name
        self.members = list(members)
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.trip_after, self.cooldown = trip_after, cooldown
        self._failures = [0] * len(members)  # consecutive failed calls per member
        self._tripped_at: list[float | None] = [None] * len(members)
        self.fallbacks = 0  # calls answered by a member other than the session's own
        self.config = members[0].config

    @classmethod
    def from_file(cls, path: str | Path, base: EnvironmentConfig | None = None) -> EnvironmentPool:
        """A pool from a YAML/JSON file: `environments:` a list of EnvironmentConfig fields plus `weight` and
        an optional `name` per member (unset fields come from `base`, i.e. the --env-* flags), and optionally
        `trip_after` and `cooldown`.

            environments:
              - {model: gpt-4o-mini, weight: 3, rate_limit: 500}
              - {model: gpt-oss-20b, base_url: http://127.0.0.1:8000/v1, api_key_env: NONE, weight: 1}
        """
        import dataclasses

        from prompt_r1.core.config import read_yaml_file

        path = Path(path)
        data = read_yaml_file(path, "environment pool file")
        if isinstance(data, list):
            data = {"environments": data}
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("environments"), list)
            or not data["environments"]
        ):
            raise ConfigError(f"{path}: expected `environments:` with a list of endpoints")
        unknown_top = set(data) - {"environments", "trip_after", "cooldown"}
        if unknown_top:
            raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown_top))}")
        base = base or EnvironmentConfig()
        known = {f.name for f in dataclasses.fields(EnvironmentConfig)}
        members, weights, names = [], [], []
        for i, entry in enumerate(data["environments"]):
            if not isinstance(entry, dict):
                raise ConfigError(f"{path}: environment {i} is not a mapping")
            entry = dict(entry)
            weight = entry.pop("weight", 1.0)
            name = entry.pop("name", None)
            unknown = set(entry) - known
            if unknown:
                raise ConfigError(f"{path}: environment {i}: unknown field(s) {', '.join(sorted(unknown))}")
            try:
                config = dataclasses.replace(base, **entry)
            except TypeError as exc:
                raise ConfigError(f"{path}: environment {i}: {exc}") from None
            weight = number(weight, f"{path}: environment {i}: weight", minimum=0)
            members.append(EnvironmentClient(config))
            weights.append(float(weight))
            names.append(
                str(name) if name else mask_secrets(f"{config.model}@{config.base_url or OPENAI_BASE_URL}")
            )
        return cls(
            members,
            weights,
            names=names,
            trip_after=number(data.get("trip_after", 3), f"{path}: trip_after", integer=True, minimum=1),
            cooldown=number(data.get("cooldown", 30.0), f"{path}: cooldown (seconds)", minimum=0),
        )

    @property
    def retries(self) -> int:
        return sum(m.retries for m in self.members)

    def route(self, key: str | None) -> int:
        """The member index for a session: a weighted draw from the key's hash (stable across processes)."""
        if key is None:
            point = random.random()
        else:
            import hashlib

            digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
            point = int.from_bytes(digest, "big") / 2**64
        cumulative = 0.0
        for index, weight in enumerate(self.weights):
            cumulative += weight
            if point < cumulative and weight > 0:
                return index
        return max(i for i, w in enumerate(self.weights) if w > 0)

    def _available(self, index: int) -> bool:
        tripped = self._tripped_at[index]
        return tripped is None or time.monotonic() - tripped >= self.cooldown

    def _order(self, first: int) -> list[int]:
        n = len(self.members)
        ring = [(first + k) % n for k in range(n)]
        usable = [i for i in ring if self._available(i)]
        if usable:
            return usable
        return sorted(ring, key=lambda i: self._tripped_at[i] or 0.0)[:1]

    async def respond(
        self,
        prompt: str,
        history: Sequence[tuple[str, str]] = (),
        *,
        run_config: RunnableConfig | None = None,
        system_prompt: str | None = None,
    ) -> EnvironmentReply:
        home = self.route(session_key(run_config))
        last_error: EnvironmentCallError | None = None
        for index in self._order(home):
            member = self.members[index]
            try:
                reply = await member.respond(
                    prompt, history, run_config=run_config, system_prompt=system_prompt
                )
            except EnvironmentCallError as exc:
                last_error = exc
                # Only failures of the endpoint count toward its trip. A rejected request (a 4xx such as a bad
                # request) says nothing about the endpoint's health: a run of them, e.g. episodes whose prompts
                # are too long, must not take a working endpoint out of every other episode's rotation.
                if is_retryable(exc):
                    self._failures[index] += 1
                    if self._failures[index] >= self.trip_after:
                        self._tripped_at[index] = time.monotonic()
                continue
            self._failures[index] = 0
            self._tripped_at[index] = None
            if index != home:
                self.fallbacks += 1
            return reply
        assert last_error is not None
        raise last_error
