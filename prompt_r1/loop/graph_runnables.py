"""How the loop's nodes and routers run under LangGraph: each has a sync and an async path, and no extra run.

Kept apart from graph.py, which holds what the loop does; this is how its functions become LangGraph nodes.
"""

from __future__ import annotations

from langchain_core.runnables import RunnableConfig, RunnableLambda

from prompt_r1.core.aio import run_sync

__all__ = ["both_paths", "inline", "sync_and_async"]


def both_paths(func, afunc, name: str, *, trace: bool = True):
    """A node or router with a sync and an async path, run as such by LangGraph.

    LangGraph's own wrapper adds no run of its own around the node's (a RunnableLambda would nest a second
    one) and never hands a sync function to a thread pool under `ainvoke`. Measured on the loop's graph, the two
    together cost ~1.5 ms per turn.
    """
    try:
        from langgraph._internal._runnable import RunnableCallable

        return RunnableCallable(func, afunc, name=name, trace=trace)
    except ImportError:  # a LangGraph that moved it: a Runnable with both paths still avoids the pool
        return RunnableLambda(func, afunc=afunc, name=name)


def sync_and_async(afunc, name: str):
    """A node usable from `invoke` as well as `ainvoke`: the sync path runs the coroutine on the process-wide
    background loop (prompt_r1.core.aio), so clients and batchers stay on one loop."""

    def func(state: dict, config: RunnableConfig) -> dict:
        return run_sync(afunc(state, config))

    # LangGraph already traces each node as a run of its name; a traced callable would nest a copy inside it.
    return both_paths(func, afunc, name, trace=False)


def inline(func, name: str, *, trace: bool = True):
    """A cheap synchronous node or router (a pure function of the state), called on the event loop."""

    async def afunc(state):
        return func(state)

    return both_paths(func, afunc, name, trace=trace)
