"""The shared limit store: one endpoint's request window, token window, in-flight leases and cool-down, kept in
Redis so that every process and machine naming the same store and endpoint shares one provider limit.

    store = RedisLimitStore.connect("redis://127.0.0.1:6379/0", prefix=key_prefix(endpoint, api_key))
    granted, wait, processes = await store.acquire(lease, tokens, limits)

Why Lua of our own and not `limits` or `pyrate-limiter` (both keep moving windows in Redis, and were the first
choice): both stamp a hit when it is *sent*, as one indivisible weight. A shared provider limit needs three things
neither has, and they must change together in one atomic step:
- a request counts from the moment it is sent until it *completes* (a lease), and is stamped in the window at
  its completion: the provider counts a request when it arrives, which lies between the two, so counting this
  way never falls below what the provider counts (the local limiter's rule, prompt_r1.clients.ratelimit);
- a token reservation is an estimate made before the call, replaced after it by the usage the reply reports;
- a lease expires when its holder stops renewing it (a process killed with SIGKILL), instead of holding its
  slot forever, and then counts as sent (the provider may have received it).
The cool-down after a 429 and the budget the provider's `x-ratelimit-remaining-*` headers announce are two more
fields of the same state. So each operation below is one short script over one endpoint's keys, run with
EVALSHA by the asyncio `redis` client; times come from the Redis server's clock (`TIME`), so machines whose
clocks differ still agree on every window.

Keys, all under `prefix` (the endpoint and a hash of its API key, never the key): `flight` (lease -> expiry),
`done` (completed request -> completion time), `tok` ("lease|tokens" -> time), `lease_tok` (lease -> estimate),
`state` (token sums, cool-down, header budget), `procs` (process -> last seen). They expire when unused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from prompt_r1.core.errors import ConfigError
from prompt_r1.core.redaction import mask_secrets
from prompt_r1.core.urls import is_shared_store

__all__ = [
    "Limits",
    "RedisLimitStore",
    "check_store",
    "key_prefix",
    "redis_asyncio",
    "store_errors",
    "store_label",
]

# Seconds a process stays counted among the store's processes after its last request (for the local share).
PROCESS_SEEN_SECONDS = 30.0

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# KEYS: flight, done, tok, lease_tok, state, procs.
# ARGV: lease, tokens, rate_limit, period, token_limit (0: none), token_period, lease_ttl, max_in_flight, process,
# seconds a process stays counted after its last request.
# Returns {granted 0/1, wait seconds as text (-1: poll, a slot frees only when a request completes), processes}.
_ACQUIRE = (
    _PRELUDE
    + """
local lease, tokens = ARGV[1], tonumber(ARGV[2])
local limit, period = tonumber(ARGV[3]), tonumber(ARGV[4])
local tlimit, tperiod = tonumber(ARGV[5]), tonumber(ARGV[6])
local ttl, cap, proc = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
redis.call('ZADD', KEYS[6], now, proc)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[10]))
local procs = redis.call('ZCARD', KEYS[6])
-- Leases nobody renewed: their holder died or hung. They count as sent, at their estimate.
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], now, id)
  local est = tonumber(redis.call('HGET', KEYS[4], id) or '0')
  redis.call('HDEL', KEYS[4], id)
  redis.call('HINCRBY', KEYS[5], 'tok_res', 0 - est)
  redis.call('ZADD', KEYS[3], now, id .. '|' .. est)
  redis.call('HINCRBY', KEYS[5], 'tok_sum', est)
end
-- Half-open windows, as providers count them: a stamp `period` old no longer shares a window with now.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - period)
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tperiod)
for _, m in ipairs(old) do
  redis.call('HINCRBY', KEYS[5], 'tok_sum', 0 - tonumber(string.match(m, '|(%-?%d+)$')))
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tperiod)
local st = redis.call('HMGET', KEYS[5], 'cool_until', 'tok_sum', 'tok_res', 'hdr_req', 'hdr_tok', 'hdr_req_until',
  'lim_req', 'lim_tok', 'hdr_tok_until')
-- Where the provider announced its limits (x-ratelimit-limit-*), the lower of theirs and ours.
if st[7] then limit = math.min(limit, tonumber(st[7])) end
if st[8] and tlimit > 0 then tlimit = math.min(tlimit, tonumber(st[8])) end
local cool = tonumber(st[1] or '0')
if cool > now then return {0, tostring(cool - now), procs} end
local flying = redis.call('ZCARD', KEYS[1])
if flying >= cap then return {0, '-1', procs} end
if redis.call('ZCARD', KEYS[2]) + flying >= limit then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if oldest[2] then return {0, tostring(tonumber(oldest[2]) + period - now), procs} end
  return {0, '-1', procs}
end
if tlimit > 0 then
  local used = tonumber(st[2] or '0') + tonumber(st[3] or '0')
  -- A request larger than the whole budget still goes out alone, or it could never be sent.
  if used > 0 and used + tokens > tlimit then
    local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    if oldest[2] then return {0, tostring(tonumber(oldest[2]) + tperiod - now), procs} end
    return {0, '-1', procs}
  end
end
-- The provider's own count, from its x-ratelimit-remaining-* headers, each until the reset it announced: none
-- left, nothing is sent; some left, what is sent is taken off it. (Tokens are taken off as estimates, larger
-- than the usage, so a request goes out while any tokens are left, as the token window lets one through.)
local req_until, tok_until = tonumber(st[6] or '0'), tonumber(st[9] or '0')
local left_req, left_tok = tonumber(st[4] or '-1'), tonumber(st[5] or '-1')
if req_until > now and left_req == 0 then return {0, tostring(req_until - now), procs} end
if tok_until > now and left_tok == 0 then return {0, tostring(tok_until - now), procs} end
if req_until > now and left_req > 0 then redis.call('HINCRBY', KEYS[5], 'hdr_req', -1) end
if tok_until > now and left_tok > 0 then
  redis.call('HSET', KEYS[5], 'hdr_tok', math.max(0, left_tok - tokens))
end
redis.call('ZADD', KEYS[1], now + ttl, lease)
redis.call('HSET', KEYS[4], lease, tokens)
redis.call('HINCRBY', KEYS[5], 'tok_res', tokens)
local keep = math.ceil(1000 * (math.max(period, tperiod) + ttl + 60))
for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], keep) end
return {1, '0', procs}
"""
)

# KEYS as above. ARGV: lease, actual tokens (-1: unknown, keep the estimate), remaining requests, reset
# seconds for them, remaining tokens, reset seconds for them, the provider's request and token limits ('' where
# the reply had no such header), and the seconds since the reply arrived.
_RELEASE = (
    _PRELUDE
    + """
local lease, actual = ARGV[1], tonumber(ARGV[2])
-- Stamped when the reply arrived, not when this script runs: the provider counted the request before that.
local at = now - math.max(0, tonumber(ARGV[9]))
if redis.call('ZREM', KEYS[1], lease) == 1 then
  redis.call('ZADD', KEYS[2], at, lease)
  local est = tonumber(redis.call('HGET', KEYS[4], lease) or '0')
  redis.call('HDEL', KEYS[4], lease)
  redis.call('HINCRBY', KEYS[5], 'tok_res', 0 - est)
  local n = est
  if actual >= 0 then n = actual end
  redis.call('ZADD', KEYS[3], at, lease .. '|' .. n)
  redis.call('HINCRBY', KEYS[5], 'tok_sum', n)
end
-- What the provider says is left, as of this reply. (Not less the requests in flight: most of them have
-- arrived and are counted in it already, and the shared windows bound the few that have not.)
if ARGV[3] ~= '' and ARGV[4] ~= '' then
  redis.call('HSET', KEYS[5], 'hdr_req', math.max(0, math.floor(tonumber(ARGV[3]))),
    'hdr_req_until', tostring(now + tonumber(ARGV[4])))
end
if ARGV[5] ~= '' and ARGV[6] ~= '' then
  redis.call('HSET', KEYS[5], 'hdr_tok', math.max(0, math.floor(tonumber(ARGV[5]))),
    'hdr_tok_until', tostring(now + tonumber(ARGV[6])))
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[5], 'lim_req', math.max(1, math.floor(tonumber(ARGV[7])))) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[5], 'lim_tok', math.max(1, math.floor(tonumber(ARGV[8])))) end
return 1
"""
)

# KEYS: flight, procs. ARGV: lease, lease_ttl, process. Keeps a lease (and its process) alive.
_RENEW = (
    _PRELUDE
    + """
redis.call('ZADD', KEYS[2], now, ARGV[3])
return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
"""
)

# KEYS: state. ARGV: seconds. Nobody sends before now + seconds (a later cool-down never shortens an earlier one).
_COOL_DOWN = (
    _PRELUDE
    + """
local until_ = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'cool_until') or '0')
if until_ > cur then redis.call('HSET', KEYS[1], 'cool_until', tostring(until_)) end
return 1
"""
)


def store_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the store did not answer (a script's own error is a bug, and is raised)."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OSError, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class Limits:
    """One endpoint's limits as this process asks for them (every process should name the same)."""

    rate_limit: int
    period: float
    max_in_flight: int
    token_limit: int | None = None
    token_period: float = 60.0
    lease_seconds: float = 10.0


def store_label(url: str) -> str:
    """The store URL as it may be printed: scheme, host, port and database, never a user or password.

    >>> store_label("redis://user:secret@10.0.0.5:6380/2")
    'redis://10.0.0.5:6380/2'
    """
    if not is_shared_store(url):
        return url
    parsed = urlparse(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.hostname}{port}{parsed.path or ''}"


def key_prefix(endpoint: str, api_key: str | None) -> str:
    """The keys' prefix for one endpoint and key: the endpoint by name (for whoever inspects the store) and a
    short hash of the API key, never the key, so two keys of one endpoint keep two limits. A URL's user part and
    secret query parameters are masked in the name (a Redis server writes its keys to disk) and go into the hash.

    >>> key_prefix("https://api.openai.com/v1::gpt-4o-mini", "sk-abc")
    'prompt-r1:limit:https://api.openai.com/v1::gpt-4o-mini:key-1460db1b6902:'
    """
    shown = mask_secrets(endpoint)
    secret = (api_key or "") + ("" if shown == endpoint else "\n" + endpoint)
    digest = hashlib.sha256(secret.encode()).hexdigest()[:12]
    return f"prompt-r1:limit:{shown}:key-{digest}:"


# KEYS: done, tok, state. ARGV: the process and its absence (one id per absence: a second one's requests are not
# taken for the first's), then (age in seconds, tokens) pairs: requests this process completed on its local share
# while the store was away (a restarted store has forgotten the window the provider remembers).
_SEED = (
    _PRELUDE
    + """
for i = 2, #ARGV, 2 do
  local id = 'seed:' .. ARGV[1] .. ':' .. i
  local at, n = now - tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if redis.call('ZADD', KEYS[1], 'NX', at, id) == 1 then
    redis.call('ZADD', KEYS[2], at, id .. '|' .. n)
    redis.call('HINCRBY', KEYS[3], 'tok_sum', n)
  end
end
return 1
"""
)


class RedisLimitStore:
    """One endpoint's shared state in one Redis database, through the asyncio `redis` client (one per event
    loop: its connections belong to the loop that opened them)."""

    SUFFIXES = ("flight", "done", "tok", "lease_tok", "state", "procs")

    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.keys = [prefix + s for s in self.SUFFIXES]
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._renew = client.register_script(_RENEW)
        self._cool = client.register_script(_COOL_DOWN)
        self._seed = client.register_script(_SEED)

    @classmethod
    def connect(
        cls, url: str, prefix: str, password: str | None = None, timeout: float = 2.0
    ) -> RedisLimitStore:
        """A store over a new client (no connection is opened until the first command)."""
        aioredis = redis_asyncio()
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No retries of its own: a store that does not answer within `timeout` is handled by the caller (the
        # limiter falls back to its local share at once instead of stalling every request).
        client = aioredis.from_url(
            url,
            password=password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        return cls(client, prefix)

    async def ping(self) -> None:
        await self.client.ping()

    async def acquire(self, lease: str, tokens: int, limits: Limits, process: str) -> tuple[bool, float, int]:
        """Take a lease when every window has room: (granted, seconds to wait before asking again (-1: soon),
        processes seen lately)."""
        granted, wait, procs = await self._acquire(
            keys=self.keys,
            args=[
                lease,
                int(tokens),
                limits.rate_limit,
                limits.period,
                limits.token_limit or 0,
                limits.token_period,
                limits.lease_seconds,
                limits.max_in_flight,
                process,
                PROCESS_SEEN_SECONDS,
            ],
        )
        return bool(granted), float(wait), int(procs)

    async def release(
        self, lease: str, actual: int | None, headers: dict[str, float] | None = None, ago: float = 0.0
    ) -> None:
        """End a lease: stamp the request (`ago` seconds back, when its reply arrived), replace its estimate by
        `actual` tokens, note the provider's headers."""
        h = headers or {}

        def arg(name: str) -> str:
            return "" if h.get(name) is None else repr(float(h[name]))

        await self._release(
            keys=self.keys,
            args=[
                lease,
                -1 if actual is None else int(actual),
                arg("remaining_requests"),
                arg("reset_requests"),
                arg("remaining_tokens"),
                arg("reset_tokens"),
                arg("limit_requests"),
                arg("limit_tokens"),
                repr(float(ago)),
            ],
        )

    async def renew(self, lease: str, limits: Limits, process: str) -> bool:
        return bool(
            await self._renew(keys=[self.keys[0], self.keys[5]], args=[lease, limits.lease_seconds, process])
        )

    async def cool_down(self, seconds: float) -> None:
        await self._cool(keys=[self.keys[4]], args=[float(seconds)])

    async def seed(self, process: str, recent: list[tuple[float, int]]) -> None:
        """Add (age, tokens) of requests made while the store was away to its windows."""
        if recent:
            args: list = [process]
            for age, tokens in recent:
                args += [repr(float(age)), int(tokens)]
            await self._seed(keys=[self.keys[1], self.keys[2], self.keys[4]], args=args)

    async def close(self) -> None:
        await self.client.aclose()


def redis_asyncio():
    """The asyncio redis client, or one line saying which extra brings it (not a ModuleNotFoundError traceback)."""
    try:
        import redis.asyncio as aioredis
    except ModuleNotFoundError:
        raise ConfigError(
            "a redis:// rate store needs the redis client: pip install 'prompt-r1[store]' (bash scripts/setup.sh "
            "installs it), or use --env-rate-store memory"
        ) from None
    return aioredis


def check_store(url: str, password: str | None = None, timeout: float = 3.0) -> str | None:
    """None when the store at `url` answers PING, else why not (one phrase, no password): for a command's start,
    before anything is sent to the provider."""
    import asyncio

    aioredis = redis_asyncio()
    from redis.exceptions import AuthenticationError, RedisError

    async def ping() -> None:
        client = aioredis.from_url(
            url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(ping())
    except AuthenticationError:
        return "the password was refused" if password else "it asks for a password"
    except (RedisError, OSError) as exc:
        text = str(exc).split(". ")[0] or type(exc).__name__
        return text.replace(password, "***") if password else text
    return None
