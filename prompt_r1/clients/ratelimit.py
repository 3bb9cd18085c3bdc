"""Process-wide rate limits per endpoint: requests per period, optionally tokens per minute, and a cap on
requests in flight.

Every `EnvironmentClient` for the same endpoint key shares one `EndpointLimiter`, so a thousand concurrent
episodes together stay inside the provider's limit. The period limit is an `asyncio_throttle.Throttler` (a
sliding window of send times, independent of any event loop); the in-flight cap is a semaphore per event loop
(`PerLoop`), because asyncio primitives belong to the loop that first waits on them.

The provider counts requests when they arrive, which is some unknown time after they are sent (a cold TCP/TLS
connection alone can take longer than the gap between two windows). So the window here counts every request in
flight, and stamps a request with the time it *completed*: a request's arrival always lies between its send and
its completion, so the count this side never falls below what the server counts in the same window. The price
is one request latency per window (a few percent at provider-scale periods of a minute).

Order matters: a request first takes an in-flight slot, then its share of the token window, and only then a slot
in the request window, and is sent at once. Taking the rate slot first would let requests that waited for an
in-flight slot go out in a burst.

Tokens per minute work like the request window: a request reserves its estimated tokens (prompt size, plus
max_tokens when set, as providers count them) while in flight, and on completion is stamped with the tokens the
server reported. A request larger than the whole budget still goes out alone, or it could never be sent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass

from asyncio_throttle import Throttler

from prompt_r1.core.aio import PerLoop
from prompt_r1.core.errors import ConfigError

__all__ = ["EndpointLimiter", "LimiterStats", "TokenWindow", "get_limiter", "reset_limiters"]


@dataclass
class LimiterStats:
    """Counters for progress bars and logs."""

    acquired: int = 0
    waiting: int = 0
    in_flight: int = 0
    completed: int = 0
    rate_waited: int = 0  # requests that found the request window full (or others queued for it) and waited
    held_seconds: float = 0.0  # summed over completed requests, from their rate slot to their stamp

    @contextmanager
    def holding(self):
        """Count one request from its slot to its stamp: acquired, in flight, then completed and its held time."""
        self.acquired += 1
        self.in_flight += 1
        held_from = time.monotonic()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.completed += 1
            self.held_seconds += time.monotonic() - held_from

    @property
    def mean_held(self) -> float:
        """Mean seconds a request holds its rate slot before it is stamped: what each request adds to the
        period it counts in, so the window passes at most rate_limit × period / (period + mean_held) per period."""
        return self.held_seconds / self.completed if self.completed else 0.0


class CompletionStampedThrottler(Throttler):
    """asyncio_throttle's sliding window, counting requests in flight and stamping each at completion.

    Waiters queue first come, first served, and only the one at the head of the queue watches the window: it
    sleeps until the oldest stamp leaves the window (exactly then: a slot frees at no other time), takes the
    slot, and hands the head of the queue on to the next waiter, which takes a further slot at once if one is
    free. With every waiter sleeping to the same instant instead, each freed slot woke all of them (about 1,300
    wake-ups a second with 50 episodes waiting at 40 requests/s), and the CPU that cost on a small machine
    delayed the replies whose completion the window waits for. When only requests in flight fill the window no
    slot can free before one of them completes and ages out, so the head polls every `retry_interval` until one
    completes. Waiters may belong to different event loops (the background loop and a caller's): each is woken
    on its own.
    """

    def __init__(self, rate_limit: int, period: float = 1.0, retry_interval: float = 0.005) -> None:
        super().__init__(rate_limit=rate_limit, period=period, retry_interval=retry_interval)
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._lock = threading.Lock()  # waiters on two loops (threads) share the window

    def flush(self) -> None:
        # Half-open windows, as providers count them: a stamp `period` old no longer shares a window with a
        # request sent now (whose arrival is later still).
        now = time.monotonic()
        while self._task_logs and now - self._task_logs[0] >= self.period:
            self._task_logs.popleft()

    def _has_room(self) -> bool:
        self.flush()
        return len(self._task_logs) + self.in_flight < self.rate_limit

    def _wake_head(self) -> None:
        """Tell the waiter now at the head of the queue (if any) that it is the one to watch the window."""
        while self._waiters:
            turn = self._waiters[0]
            if turn.done():  # already told, or cancelled: its task moves the queue on itself
                return
            owner = turn.get_loop()
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if owner is running:
                turn.set_result(None)
                return
            try:
                owner.call_soon_threadsafe(_resolve, turn)
                return
            except RuntimeError:  # its loop is closed: nothing will ever await it
                self._waiters.popleft()

    async def acquire(self) -> bool:
        """Take a slot; True when this request had to wait for it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._waiters and self._has_room():
                self.in_flight += 1
                return False
            turn = loop.create_future()
            self._waiters.append(turn)
            if self._waiters[0] is turn:
                turn.set_result(None)
        try:
            await turn  # until this waiter is at the head of the queue
            while True:
                with self._lock:
                    if self._has_room():
                        self._waiters.popleft()  # this waiter, the head
                        self.in_flight += 1
                        self._wake_head()
                        return True
                    wait = self.retry_interval
                    if self._task_logs:
                        wait = self._task_logs[0] + self.period - time.monotonic()
                await asyncio.sleep(max(wait, 0.0))
        except BaseException:  # cancelled while waiting: leave the queue, and pass the head on if it was ours
            with self._lock:
                was_head = bool(self._waiters) and self._waiters[0] is turn
                with suppress(ValueError):
                    self._waiters.remove(turn)
                if was_head:
                    self._wake_head()
            raise

    def release(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self._task_logs.append(time.monotonic())  # monotonic, so the deque stays ordered for flush()


def _resolve(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)


class TokenWindow:
    """A sliding window of tokens: completed requests' reported tokens plus in-flight requests' estimates."""

    def __init__(self, limit: int, period: float = 60.0, retry_interval: float = 0.005) -> None:
        self.limit, self.period, self.retry_interval = limit, period, retry_interval
        self._log: deque[tuple[float, int]] = deque()
        self._logged = 0
        self.reserved = 0

    def _flush(self) -> None:
        now = time.monotonic()
        while self._log and now - self._log[0][0] >= self.period:
            self._logged -= self._log.popleft()[1]

    def used(self) -> int:
        self._flush()
        return self._logged + self.reserved

    async def acquire(self, tokens: int) -> None:
        while True:
            used = self.used()
            if used + tokens <= self.limit or used == 0:
                break
            wait = self.retry_interval  # as in the request window: sleep to the next expiry, poll otherwise
            if self._log:
                wait = max(wait, self._log[0][0] + self.period - time.monotonic())
            await asyncio.sleep(wait)
        self.reserved += tokens

    def release(self, reserved: int, actual: int) -> None:
        self.reserved -= reserved
        self._log.append((time.monotonic(), actual))
        self._logged += actual


class TokenSlot:
    """What a request holding a slot tells the limiter when it completes: the tokens the server reported."""

    __slots__ = ("estimate", "actual", "headers", "replied_at")

    def __init__(self, estimate: int) -> None:
        self.estimate = estimate
        self.actual: int | None = None
        self.headers: dict[str, float] | None = None  # the provider's x-ratelimit-* figures (shared limiters)
        self.replied_at: float | None = None  # time.monotonic() when the reply (or the error) arrived


class EndpointLimiter:
    def __init__(
        self,
        rate_limit: int,
        period: float,
        max_in_flight: int,
        tokens_per_minute: int | None = None,
        *,
        token_period: float = 60.0,
    ) -> None:
        """`tokens_per_minute`: the token limit, per `token_period` seconds (a minute unless said otherwise)."""
        self.rate_limit = rate_limit
        self.period = period
        self.max_in_flight = max_in_flight
        self.tokens_per_minute = tokens_per_minute
        self.token_period = token_period
        self._tokens = TokenWindow(tokens_per_minute, token_period) if tokens_per_minute else None
        self._cool_until = 0.0
        # 5 ms polling: fine-grained enough to keep sends close to the window edge without spinning.
        self._throttler = CompletionStampedThrottler(
            rate_limit=rate_limit, period=period, retry_interval=0.005
        )
        self._semaphores = PerLoop(lambda: asyncio.Semaphore(max_in_flight))
        self.stats = LimiterStats()

    @asynccontextmanager
    async def slot(self, tokens: int = 0) -> AsyncIterator[TokenSlot]:
        """Hold one in-flight slot, `tokens` (an estimate) of the token window and one rate-window slot for the
        duration of a request. Set `.actual` on the yielded slot to the tokens the server reported."""
        handle = TokenSlot(tokens)
        while (pause := self._cool_until - time.monotonic()) > 0:
            await asyncio.sleep(pause)
        async with self._semaphores.get():
            self.stats.waiting += 1
            reserved = False
            try:
                if self._tokens is not None:
                    await self._tokens.acquire(tokens)
                    reserved = True
                if await self._throttler.acquire():
                    self.stats.rate_waited += 1
            except BaseException:  # also when cancelled while waiting
                if reserved:
                    self._tokens.release(tokens, 0)
                raise
            finally:
                self.stats.waiting -= 1
            try:
                with self.stats.holding():
                    yield handle
            finally:
                self._throttler.release()
                if self._tokens is not None:
                    # A failed call's tokens are unknown: count the estimate, as the provider may have.
                    self._tokens.release(tokens, handle.actual if handle.actual is not None else tokens)

    def seed(self, completed: list[tuple[float, int]]) -> None:
        """Count requests completed elsewhere, as (time.monotonic() stamp, tokens), in both windows (a process that
        loses its shared store goes on here with what it sent lately). Stamps must not be later than now."""
        with self._throttler._lock:
            for stamp, tokens in sorted(completed):
                self._throttler._task_logs.append(stamp)
                if self._tokens is not None:
                    self._tokens._log.append((stamp, tokens))
                    self._tokens._logged += tokens

    def fill(self) -> None:
        """Count what is left of both windows (beyond what this limiter holds in them, its requests in flight
        included) as sent now by someone else: room this limiter leaves for one window."""
        with self._throttler._lock:
            self._throttler.flush()
            now = time.monotonic()
            room = self.rate_limit - len(self._throttler._task_logs) - self._throttler.in_flight
            self._throttler._task_logs.extend([now] * max(0, room))
            if self._tokens is not None and (left := self._tokens.limit - self._tokens.used()) > 0:
                self._tokens._log.append((now, left))
                self._tokens._logged += left

    def adopt(self, tokens: int) -> None:
        """Count a request sent elsewhere, `tokens` its estimate, as in flight here until `complete`: in the request
        and token windows, not against the in-flight cap (it was sent under another's)."""
        with self._throttler._lock:
            self._throttler.in_flight += 1
        if self._tokens is not None:
            self._tokens.reserved += tokens

    def complete(self, estimate: int, actual: int) -> None:
        """An adopted request completed: stamped now in both windows, its estimate replaced by `actual`."""
        self._throttler.release()
        if self._tokens is not None:
            self._tokens.release(estimate, actual)

    def cool_down(self, seconds: float) -> None:
        """No request of this limiter starts in the next `seconds` (a later cool-down never shortens one)."""
        self._cool_until = max(self._cool_until, time.monotonic() + seconds)

    def same_limits(
        self,
        rate_limit: int,
        period: float,
        max_in_flight: int,
        tokens_per_minute: int | None = None,
        token_period: float = 60.0,
    ) -> bool:
        mine = (self.rate_limit, self.period, self.max_in_flight, self.tokens_per_minute, self.token_period)
        return mine == (rate_limit, period, max_in_flight, tokens_per_minute, token_period)


_LIMITERS: dict[str, EndpointLimiter] = {}
_LOCK = threading.Lock()


def get_limiter(
    key: str,
    *,
    rate_limit: int,
    period: float,
    max_in_flight: int,
    tokens_per_minute: int | None = None,
    token_period: float = 60.0,
) -> EndpointLimiter:
    """The process-wide limiter for `key` (normally base URL + model), created on first use.

    Two clients that name the same endpoint with different limits would silently undercut each other, so that
    is an error naming both settings.
    """
    with _LOCK:
        limiter = _LIMITERS.get(key)
        if limiter is None:
            limiter = _LIMITERS[key] = EndpointLimiter(
                rate_limit, period, max_in_flight, tokens_per_minute, token_period=token_period
            )
        elif not limiter.same_limits(rate_limit, period, max_in_flight, tokens_per_minute, token_period):
            raise ConfigError(
                f"endpoint {key} already has limits {limiter.rate_limit} requests/{limiter.period}s with "
                f"{limiter.max_in_flight} in flight and {limiter.tokens_per_minute} tokens/{limiter.token_period}s; "
                f"got {rate_limit}/{period}s with {max_in_flight} in flight and {tokens_per_minute} tokens/"
                f"{token_period}s. "
                "Use the same limits for every client of one endpoint, or give the client its own limiter_key."
            )
        return limiter


def reset_limiters() -> None:
    """Forget every limiter (tests, or a long-lived process that changes its limits)."""
    with _LOCK:
        _LIMITERS.clear()
