"""One provider limit shared by every process and machine: the limiter an `EnvironmentClient` uses when its
`rate_store` is a Redis URL (prompt_r1.clients.limit_store keeps the state; this module is how a process
takes part).

    limiter = SharedLimiter("redis://127.0.0.1:6379/0", key_prefix(endpoint, key), Limits(500, 60.0, 32))
    async with limiter.slot(tokens=estimate) as slot:
        reply = await call()
        slot.actual = reply_tokens  # the reply's usage replaces the estimate

It has the local limiter's interface (`slot`, `stats`, `cool_down`) and its rules (prompt_r1.clients.ratelimit):
a request holds a lease while in flight and is stamped in the window at completion; tokens are reserved as an
estimate and corrected from the reply. What it adds:

- **Leases that expire.** While a request is in flight a renewal task extends its lease every third of
  `lease_seconds`; a process killed with SIGKILL stops renewing, and its slots free within `lease_seconds`.
- **One cool-down.** A 429 (its Retry-After, or the provider's x-ratelimit-reset-*) makes every process wait.
- **The provider's count.** A reply's x-ratelimit-remaining-requests / -tokens bound what is sent until the
  reset it names.
- **Faults.** A store that has never answered this process refuses each request (`RateStoreUnreachable`,
  nothing sent): with no count of the other processes, any share it took could overrun the provider. The
  command-line surfaces check the store before they start instead. When the store stops answering later, the
  limiter says so once (a warning), goes on with a local share of the limits (each limit divided by the
  processes last seen in the store; for the first window, only the slots its own requests free, as the others'
  requests of that window are unknown), and tries the store again every `rejoin_every` seconds; when it
  answers, the limiter says so and rejoins. No request waits on a dead store and none is dropped: only the
  limiter changes under the running episodes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from prompt_r1.clients.limit_store import Limits, RedisLimitStore, key_prefix, store_errors, store_label
from prompt_r1.clients.ratelimit import EndpointLimiter, LimiterStats, TokenSlot
from prompt_r1.core.aio import PerLoop
from prompt_r1.core.config import RATE_STORE_PASSWORD_ENV
from prompt_r1.core.errors import RateStoreUnreachable
from prompt_r1.core.urls import MEMORY_STORE, is_shared_store

__all__ = [
    "SharedLimiter",
    "limiter_for",
    "parse_reset",
    "per_period_limits",
    "rate_headers",
    "reset_shared_limiters",
]

logger = logging.getLogger(__name__)

# Longest sleep between two asks when the store says "poll" (every slot is held by a request in flight).
_POLL = 0.01


def parse_reset(value: str | None) -> float | None:
    """Seconds from an x-ratelimit-reset-* header: OpenAI's durations ("1s", "6m0s", "20ms", "1h2m3.5s") or a
    plain number of seconds.

    >>> parse_reset("6m0s"), parse_reset("20ms"), parse_reset("1.5"), parse_reset("soon")
    (360.0, 0.02, 1.5, None)
    """
    if value is None:
        return None
    text = value.strip().lower()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    import re

    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def rate_headers(headers: dict | None) -> dict[str, float]:
    """The provider's x-ratelimit-remaining-*, -reset-* and -limit-* headers, as numbers (absent: left out)."""
    if not headers:
        return {}
    lower = {str(k).lower(): v for k, v in headers.items()}
    out: dict[str, float] = {}
    for kind in ("requests", "tokens"):
        remaining = lower.get(f"x-ratelimit-remaining-{kind}")
        reset = parse_reset(lower.get(f"x-ratelimit-reset-{kind}"))
        try:
            if remaining is not None and reset is not None:
                out[f"remaining_{kind}"], out[f"reset_{kind}"] = float(remaining), reset
            if lower.get(f"x-ratelimit-limit-{kind}") is not None:
                out[f"limit_{kind}"] = float(lower[f"x-ratelimit-limit-{kind}"])
        except ValueError:
            continue
    return out


def per_period_limits(headers: dict[str, float] | None, limits: Limits) -> dict[str, float] | None:
    """The provider's x-ratelimit-limit-* in the store's periods. OpenAI-style headers give requests and tokens
    per minute: read as per `rate_period`, a limit of 500 a minute would become 500 an hour for a run counting
    hours, sixty times too low."""
    if not headers:
        return headers
    scaled = dict(headers)
    if "limit_requests" in scaled:
        scaled["limit_requests"] *= limits.period / 60.0
    if "limit_tokens" in scaled:
        scaled["limit_tokens"] *= limits.token_period / 60.0
    return scaled


@asynccontextmanager
async def _no_slot(tokens: int) -> AsyncIterator[TokenSlot]:
    yield TokenSlot(tokens)


class SharedLimiter:
    """The limiter of one endpoint whose limits live in a shared store (see the module's docstring)."""

    shared = True

    def __init__(
        self,
        url: str,
        prefix: str,
        limits: Limits,
        *,
        password: str | None = None,
        rejoin_every: float = 1.0,
        timeout: float = 2.0,
    ) -> None:
        self.url, self.label, self.prefix, self.limits = url, store_label(url), prefix, limits
        self.rate_limit, self.period = limits.rate_limit, limits.period
        self.max_in_flight = limits.max_in_flight
        self.rejoin_every = rejoin_every
        self._stores: PerLoop[RedisLimitStore] = PerLoop(
            lambda: RedisLimitStore.connect(url, prefix, password=password, timeout=timeout)
        )
        self.process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Within a process only the first waiter asks the store; the others queue behind it (first come, first
        # served). With every waiter polling, each freed slot woke all of a process's episodes at once.
        self._gates: PerLoop[asyncio.Lock] = PerLoop(asyncio.Lock)
        self._leases = 0
        self.processes_seen = 1
        self.stats = LimiterStats()
        self._local: EndpointLimiter | None = None  # the local share while the store is lost
        self._lost_at: float | None = None
        self._lost_since = 0.0
        self._transition_until = 0.0
        # This process's completed requests of the last window, (monotonic time, tokens): what the local share
        # starts from when the store is lost, and what the store is told when it is back (a restarted store has
        # forgotten the window the provider still counts).
        self._recent: deque[tuple[float, int]] = deque()
        self._flying: dict[str, int] = {}  # leases in flight: their token estimates
        # Leases in flight when the store was lost: the local share they are counted in, and their estimate.
        self._adopted: dict[str, tuple[EndpointLimiter, int]] = {}
        self._flying_lock = threading.Lock()  # the event loops of several threads may share this limiter
        self._probing = False
        self.losses = 0  # times the store was lost (each reported once)
        self.joined = False  # the store has granted this process a lease at least once

    @property
    def store_lost(self) -> bool:
        return self._lost_at is not None

    def _lost(self, exc: BaseException) -> None:
        if self._lost_at is None:
            self.losses += 1
            share = max(1, self.processes_seen)
            logger.warning(
                "rate store %s lost (%s): continuing on this process's share of the limit (1/%d) until it "
                "answers again",
                self.label,
                type(exc).__name__,
                share,
            )
            limits = self.limits
            self._local = EndpointLimiter(
                max(1, limits.rate_limit // share),
                limits.period,
                max(1, limits.max_in_flight // share),
                max(1, limits.token_limit // share) if limits.token_limit else None,
                token_period=limits.token_period,
            )
            local = self._local
            local.seed(list(self._recent))  # each window drops what is older than itself
            # Requests still in flight under the store stay in flight here until they complete: the provider has
            # them, or soon will.
            with self._flying_lock:
                for lease, tokens in self._flying.items():
                    local.adopt(tokens)
                    self._adopted[lease] = (local, tokens)
            # What the other processes sent in the window is unknown from here: the store's count is gone, and
            # one that sent more than its share left that much less to the others. So the share starts as if the
            # window were full: this process's own requests where they are, the rest of its share as sent now.
            # For one window it only reuses the slots its own requests free; after that, no share meets another
            # process's requests sent before the loss (which arrive within a window of being sent).
            local.fill()
            self._lost_since = time.monotonic()
        self._lost_at = time.monotonic()

    def _remember(self, tokens: int) -> None:
        now = time.monotonic()
        self._recent.append((now, tokens))
        horizon = max(self.limits.period, self.limits.token_period if self.limits.token_limit else 0.0)
        while self._recent and now - self._recent[0][0] >= horizon:
            self._recent.popleft()

    async def _rejoined(self) -> bool:
        """While lost: try the store again at most every `rejoin_every` seconds (one probe at a time)."""
        if self._lost_at is None:
            return True
        if self._probing or time.monotonic() - self._lost_at < self.rejoin_every:
            return False
        self._probing = True
        try:
            store = self._stores.get()
            # A restarted server closed every pooled connection: start afresh rather than fail on each of them.
            await store.client.connection_pool.disconnect()
            await store.ping()
            now = time.monotonic()
            absence = f"{self.process}:{self.losses}"  # a later absence's requests get ids of their own
            await store.seed(absence, [(now - t, n) for t, n in self._recent if t >= self._lost_since])
        except store_errors():
            self._lost_at = time.monotonic()
            return False
        finally:
            self._probing = False
        logger.warning("rate store %s answers again: rejoining the shared limit", self.label)
        self._lost_at = None
        window = max(self.limits.period, self.limits.token_period if self.limits.token_limit else 0.0)
        self._transition_until = time.monotonic() + self.rejoin_every + window
        return True

    async def _acquire(self, store: RedisLimitStore, lease: str, tokens: int) -> None:
        while True:
            granted, wait, procs = await store.acquire(lease, tokens, self.limits, self.process)
            self.processes_seen = max(1, procs)
            if granted:
                self.joined = True
                return
            await asyncio.sleep(_POLL if wait < 0 else min(max(wait, 0.001), 5.0))

    async def _renew(self, store: RedisLimitStore, lease: str) -> None:
        # Renew well before expiry: a third of the lease, so two missed renewals still leave it alive.
        while True:
            await asyncio.sleep(self.limits.lease_seconds / 3)
            with suppress(*store_errors()):  # a lost store is noticed (and reported) by the next acquire
                await store.renew(lease, self.limits, self.process)

    @asynccontextmanager
    async def slot(self, tokens: int = 0) -> AsyncIterator[TokenSlot]:
        """Hold a lease (in-flight slot, request-window slot and `tokens` of the token window) for one request;
        set `.actual` on the yielded slot to the tokens the server reported, `.headers` to its rate headers."""
        use_store = await self._rejoined()
        guard = self._local if time.monotonic() < self._transition_until else None
        if guard is None or not use_store:
            async with self._slot(tokens, use_store, local_taken=False) as handle:
                yield handle
            return
        # Just rejoined: processes still on their local share do not show in the store yet, so for one window
        # (and one probe interval) this process keeps to its share as well as to the store.
        async with guard.slot(tokens) as local_handle, self._slot(tokens, True, local_taken=True) as handle:
            try:
                yield handle
            finally:
                local_handle.actual = handle.actual

    @asynccontextmanager
    async def _slot(self, tokens: int, use_store: bool, local_taken: bool) -> AsyncIterator[TokenSlot]:
        lease = None
        store = None
        if use_store:
            store = self._stores.get()
            self._leases += 1
            lease = f"{self.process}:{self._leases}"
            self.stats.waiting += 1
            started = time.monotonic()
            try:
                async with self._gates.get():
                    if self._lost_at is not None:  # lost while this request queued: no second timeout
                        raise ConnectionError("the rate store was lost")
                    await self._acquire(store, lease, tokens)
            except asyncio.CancelledError:
                # Cancelled between a grant and its return, the lease would linger until it expires: end it.
                with suppress(Exception):
                    await asyncio.shield(store.release(lease, 0))
                raise
            except store_errors() as exc:  # the store did not answer: this request goes on the local share
                if not self.joined:
                    raise RateStoreUnreachable(
                        f"cannot reach the rate store at {self.label} ({type(exc).__name__}: {exc}); nothing was "
                        f"sent. Start it, set {RATE_STORE_PASSWORD_ENV} if it wants a password, or use the "
                        f"'{MEMORY_STORE}' rate store"
                    ) from None
                self._lost(exc)
                store = lease = None
            finally:
                self.stats.waiting -= 1
            if lease is not None and time.monotonic() - started > 0.005:
                self.stats.rate_waited += 1
        if store is None or lease is None:
            local = self._local
            assert local is not None
            if local_taken:  # its slot is on the share from before this loss: it counts in this one too
                local.adopt(tokens)
            async with local.slot(tokens) if not local_taken else _no_slot(tokens) as handle:
                try:
                    yield handle
                finally:
                    used = handle.actual if handle.actual is not None else tokens
                    self._remember(used)
                    if local_taken:
                        local.complete(tokens, used)
            return
        handle = TokenSlot(tokens)
        with self._flying_lock:
            self._flying[lease] = tokens
        renewal = asyncio.create_task(self._renew(store, lease))
        try:
            with self.stats.holding():
                yield handle
        finally:
            renewal.cancel()
            used = handle.actual if handle.actual is not None else tokens
            with self._flying_lock:  # against a loss adopting it on another thread's loop meanwhile
                self._flying.pop(lease, None)
                adopted = self._adopted.pop(lease, None)
            self._remember(used)
            if adopted is not None:
                adopted[0].complete(adopted[1], used)
            try:
                # A failed call's tokens are unknown: the estimate stays, as the provider may have counted it.
                ago = time.monotonic() - handle.replied_at if handle.replied_at is not None else 0.0
                headers = per_period_limits(handle.headers, self.limits)
                await asyncio.shield(store.release(lease, handle.actual, headers, ago))
            except asyncio.CancelledError:
                raise
            except store_errors() as exc:  # the lease expires by itself; later requests use the local share
                self._lost(exc)

    async def cool_down(self, seconds: float) -> None:
        """Every process waits `seconds` before its next request (after a 429)."""
        if seconds <= 0:
            return
        if self._local is not None:
            self._local.cool_down(seconds)
        if self._lost_at is None:
            try:
                await self._stores.get().cool_down(seconds)
            except store_errors() as exc:
                self._lost(exc)

    def same_limits(self, limits: Limits, url: str) -> bool:
        return (self.limits, self.url) == (limits, url)


# Seconds a lease lives without renewal: how long a killed process's slots stay taken.
LEASE_SECONDS = 10.0
_SHARED: dict[str, SharedLimiter] = {}


def limiter_for(config, key: str, api_key: str | None):
    """The limiter for an endpoint `key` (base URL + model) under `config` (an EnvironmentConfig): the
    process-wide local one for `rate_store: memory`, else the one shared through the store, whose keys name the
    endpoint and a hash of `api_key`."""
    from prompt_r1.clients.ratelimit import get_limiter
    from prompt_r1.core.config import rate_store_password
    from prompt_r1.core.errors import ConfigError

    if config.token_limit is not None:
        token_limit, token_period = config.token_limit, config.rate_period
    else:
        token_limit, token_period = config.tokens_per_minute, 60.0
    if not is_shared_store(config.rate_store):
        return get_limiter(
            key,
            rate_limit=config.rate_limit,
            period=config.rate_period,
            max_in_flight=config.max_in_flight,
            tokens_per_minute=token_limit,
            token_period=token_period,
        )
    limits = Limits(
        config.rate_limit, config.rate_period, config.max_in_flight, token_limit, token_period, LEASE_SECONDS
    )
    prefix = key_prefix(key, api_key)
    name = f"{config.rate_store} {prefix}"
    limiter = _SHARED.get(name)
    if limiter is None:
        limiter = _SHARED[name] = SharedLimiter(
            config.rate_store, prefix, limits, password=rate_store_password(config.rate_store)
        )
    elif not limiter.same_limits(limits, config.rate_store):
        raise ConfigError(
            f"endpoint {key} already has shared limits {limiter.limits} in {limiter.label}; got {limits}. Use "
            "the same limits for every client of one endpoint."
        )
    return limiter


def reset_shared_limiters() -> None:
    """Forget every shared limiter of this process (tests)."""
    _SHARED.clear()
