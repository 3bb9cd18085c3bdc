"""A provider's rate limit simulated, for `ScriptedServer(provider_limit=...)`: requests and tokens per period for
each API key, counted as providers count them, answered with 429 and the headers providers send.

- A request counts when it **arrives**; its prompt tokens count when it arrives, its completion tokens when its
  reply is sent. Tokens are counted as a BPE tokenizer of English text averages, one per 4 characters (rounded
  up, per message), and the reply's `usage` reports the same counts.
- A request beyond either limit is answered 429 and not counted. With `headers=True` the 429 carries
  `Retry-After` and `x-ratelimit-*`, and every 200 carries `x-ratelimit-limit-*`, `x-ratelimit-remaining-*`
  and `x-ratelimit-reset-*` (OpenAI's names; resets as durations like "1.25s"). With `headers=False` a 429
  carries nothing: the client must find its own way.
- Everything it accepted is logged (time, key, tokens), for benchmarks to measure throughput against the limit.

    limit = ProviderLimit(requests=60, tokens=9000, period=4.0)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit) as server: ...
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ProviderLimit", "Verdict"]


@dataclass
class Verdict:
    """What the provider decided for one arriving request."""

    accepted: bool
    retry_after: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


class _Window:
    def __init__(self, period: float) -> None:
        self.period = period
        self.log: deque[tuple[float, int]] = deque()
        self.total = 0

    def used(self, now: float) -> int:
        while self.log and now - self.log[0][0] >= self.period:
            self.total -= self.log.popleft()[1]
        return self.total

    def add(self, now: float, amount: int) -> None:
        if amount:
            self.log.append((now, amount))
            self.total += amount

    def frees_in(self, now: float) -> float:
        return max(0.0, self.log[0][0] + self.period - now) if self.log else 0.0


class ProviderLimit:
    """Requests and tokens per `period` seconds, per API key (the request's Authorization header)."""

    def __init__(self, requests: int, tokens: int | None, period: float, *, headers: bool = True) -> None:
        self.requests, self.tokens, self.period, self.headers = requests, tokens, period, headers
        self._windows: dict[str, tuple[_Window, _Window]] = {}
        self._lock = threading.Lock()
        self.accepted: list[tuple[float, str, int]] = []  # (arrival, key, prompt tokens)
        self.completions: list[tuple[float, str, int]] = []  # (reply sent, key, completion tokens)
        self.rejected = 0
        self.rejected_at: list[float] = []

    @staticmethod
    def count_tokens(text: str) -> int:
        """
        >>> ProviderLimit.count_tokens("What is the capital of France?")
        8
        """
        return -(-len(text) // 4)

    def _of(self, key: str) -> tuple[_Window, _Window]:
        if key not in self._windows:
            self._windows[key] = (_Window(self.period), _Window(self.period))
        return self._windows[key]

    def _headers(self, key: str, now: float) -> dict[str, str]:
        if not self.headers:
            return {}
        requests, tokens = self._of(key)
        # The limits per minute, as OpenAI sends them, whatever this provider's own period.
        per_minute = 60.0 / self.period
        out = {
            "x-ratelimit-limit-requests": f"{self.requests * per_minute:g}",
            "x-ratelimit-remaining-requests": str(max(0, self.requests - requests.used(now))),
            "x-ratelimit-reset-requests": f"{requests.frees_in(now):.3f}s",
        }
        if self.tokens:
            out |= {
                "x-ratelimit-limit-tokens": f"{self.tokens * per_minute:g}",
                "x-ratelimit-remaining-tokens": str(max(0, self.tokens - tokens.used(now))),
                "x-ratelimit-reset-tokens": f"{tokens.frees_in(now):.3f}s",
            }
        return out

    def arrive(self, key: str, prompt_tokens: int, now: float) -> Verdict:
        with self._lock:
            requests, tokens = self._of(key)
            waits = []
            if requests.used(now) >= self.requests:
                waits.append(requests.frees_in(now))
            if self.tokens and tokens.used(now) > 0 and tokens.used(now) + prompt_tokens > self.tokens:
                waits.append(tokens.frees_in(now))
            if waits:
                self.rejected += 1
                self.rejected_at.append(now)
                headers = self._headers(key, now)
                if self.headers:
                    headers["Retry-After"] = f"{max(waits):.3f}"
                return Verdict(False, max(waits), headers)
            requests.add(now, 1)
            tokens.add(now, prompt_tokens)
            self.accepted.append((now, key, prompt_tokens))
            return Verdict(True)

    def complete(self, key: str, completion_tokens: int, now: float) -> dict[str, str]:
        """Count a reply's tokens as it is sent; the headers for it."""
        with self._lock:
            self._of(key)[1].add(now, completion_tokens)
            self.completions.append((now, key, completion_tokens))
            return self._headers(key, now)

    def throughput(self, start: float, end: float) -> tuple[float, float]:
        """Requests and tokens accepted per second in [start, end), as fractions of the limits.

        A limit of so many per period lets traffic through in bursts (a sliding window refills as its oldest
        stamps age out, so a client at the limit sends a period's worth together, then waits), and a span of a
        few periods cuts a burst at either end by chance: this figure swings by up to one period's worth of
        requests over the span. `occupancy` is the steady one."""
        span = end - start
        with self._lock:
            requests = sum(1 for t, _, _ in self.accepted if start <= t < end)
            tokens = sum(n for t, _, n in self.accepted if start <= t < end)
            tokens += sum(n for t, _, n in self.completions if start <= t < end)
        request_share = requests / span / (self.requests / self.period)
        token_share = tokens / span / (self.tokens / self.period) if self.tokens else 0.0
        return request_share, token_share

    def occupancy(self, start: float, end: float) -> tuple[float, float]:
        """How full the provider's own windows were, as fractions of the limits: the requests (and tokens) in
        the window [t, t + period), averaged over every t from `start` to `end - period`: a rate weighted less
        at the span's two ends. A client that uses the whole limit scores 1.0 whatever the phase of its bursts,
        since every period-long window then holds a full limit, where `throughput` over the same span can read
        anywhere from about (span - period) / span to 1. Bursts at another spacing still move it a little with
        the phase (a few points over three periods, less over more): measure over many periods.

        A client sending 4 requests together every 1.1 s against 4 a second uses 1 / 1.1 = 0.91 of the limit:

        >>> limit = ProviderLimit(requests=4, tokens=None, period=1.0)
        >>> limit.accepted = [(b * 1.1 + i / 100, "k", 0) for b in range(12) for i in range(4)]
        >>> [round(limit.occupancy(s, s + 6)[0], 2) for s in (2.0, 2.5)]
        [0.9, 0.92]
        >>> [round(limit.throughput(s, s + 3)[0], 2) for s in (2.0, 2.25)]
        [1.0, 0.67]
        """
        if end - start <= self.period:
            raise ValueError(f"occupancy needs a span longer than one period ({self.period:g} s)")
        first, last = start, end - self.period  # the windows' start times

        def weight(
            at: float,
        ) -> float:  # the measure of window starts t in [first, last] with t <= at < t + period
            return max(0.0, min(at, last) - max(at - self.period, first))

        with self._lock:
            requests = sum(weight(t) for t, _, _ in self.accepted)
            tokens = sum(weight(t) * n for t, _, n in self.accepted)
            tokens += sum(weight(t) * n for t, _, n in self.completions)
        spread = last - first
        request_share = requests / spread / self.requests
        token_share = tokens / spread / self.tokens if self.tokens else 0.0
        return request_share, token_share
