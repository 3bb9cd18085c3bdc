"""A connection pool for `httpx.AsyncClient` whose bookkeeping grows linearly with the requests in flight.

httpcore's pool (1.0) re-examines every connection each time a request is queued or a response is closed: for
each idle connection it builds a list of all connections (to count them), and it asks each idle connection's
socket whether the server closed it (a poll system call). A training step sends one environment call per episode
at once and gets their replies back together, so at 64 episodes that was a third of the loop's CPU time in
`evals/bench/step_overhead.py`, and it grows with the square of the batch (each of n events looks at n
connections, and the count inside is itself n).

`LinearPool` keeps the same rules with less work: a connection is checked for expiry (its keep-alive over, or
the server gone) right before it is reused, as before; the sweep that closes expired and surplus idle connections
(and drops closed ones) runs at most every `SWEEP_S` seconds instead of on every event; counting is `len`.
`speed_up(client)` puts it under a client's default transport (proxies and every other setting untouched), and
leaves any other httpcore version alone: the override follows 1.0's internals.
"""

from __future__ import annotations

import time
from typing import Any

import httpcore
import httpx

__all__ = ["SWEEP_S", "LinearPool", "speed_up"]

SWEEP_S = 0.5  # how late an expired idle connection may be closed, at most (it is never reused meanwhile)


class LinearPool(httpcore.AsyncConnectionPool):
    """httpcore's `AsyncConnectionPool` with `_assign_requests_to_connections` linear in the connections."""

    _swept_at = float("-inf")

    def _assign_requests_to_connections(self) -> list[Any]:
        closing: list[Any] = []
        now = time.monotonic()
        if now - self._swept_at >= SWEEP_S:
            self._swept_at = now
            closing += self._sweep()
        # This runs on every request and every response, over all in flight: `connection is None` is 1.0's
        # `is_queued()` without a call per request, and a closed connection is left for the sweep (it is never
        # available, so never reused) unless the limit is reached, where it counts. Asking every connection
        # whether it closed, on every event, was most of the pool's CPU at 256 episodes.
        queued = [r for r in self._requests if r.connection is None]
        # The connections handed to requests, only when some request waits for one (not on a response's close).
        taken = {r.connection for r in self._requests if r.connection is not None} if queued else set()
        for pool_request in queued:
            origin = pool_request.request.url.origin
            connection = self._reusable(origin, closing, taken)
            if connection is None:
                if len(self._connections) >= self._max_connections:
                    self._connections[:] = [c for c in self._connections if not c.is_closed()]
                if len(self._connections) >= self._max_connections:
                    # Not one handed to a request that has not started on it yet (it is idle until then).
                    idle = next((c for c in self._connections if c.is_idle() and c not in taken), None)
                    if idle is None:
                        continue  # stays queued until a connection frees
                    self._connections.remove(idle)
                    closing.append(idle)
                connection = self.create_connection(origin)
                self._connections.append(connection)
            pool_request.assign_to_connection(connection)
            taken.add(connection)
        return closing

    def _reusable(self, origin: Any, closing: list[Any], taken: set[Any]) -> Any:
        """The first connection that can take a request to `origin` now; expired ones met on the way are closed.

        An HTTP/1.1 connection already handed to another request is passed over: it stays idle, so available, until
        that request's task next runs, and httpcore's rule handed it to every request queued meanwhile, all but one
        of which then failed with ConnectionNotAvailable and queued again. In a burst of 256 calls that was five
        passes per request, each over the idle connections, and as many failed attempts."""
        for connection in list(self._connections):
            if connection in taken and isinstance(connection._connection, httpcore.AsyncHTTP11Connection):
                continue
            if connection.can_handle_request(origin) and connection.is_available():
                if connection.has_expired():
                    self._connections.remove(connection)
                    closing.append(connection)
                    continue
                return connection
        return None

    def _sweep(self) -> list[Any]:
        """Drop closed connections, close expired ones and the idle ones beyond the keep-alive count."""
        closing: list[Any] = []
        kept = []
        for connection in self._connections:
            if connection.is_closed():
                continue
            if connection.has_expired():
                closing.append(connection)
            else:
                kept.append(connection)
        surplus = len(kept) - self._max_keepalive_connections
        for connection in [c for c in kept if c.is_idle()][: max(surplus, 0)]:
            kept.remove(connection)
            closing.append(connection)
        self._connections[:] = kept
        return closing


def speed_up(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """`client` with `LinearPool` under its default transport, where that is httpcore 1.0's own pool."""
    pool = getattr(getattr(client, "_transport", None), "_pool", None)
    if type(pool) is httpcore.AsyncConnectionPool and httpcore.__version__.startswith("1.0."):
        pool.__class__ = LinearPool
    return client
