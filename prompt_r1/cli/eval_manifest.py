"""`prompt-r1 eval`'s manifest (prompt_r1.runs.manifest): `manifest.json` in each output folder, from the
command's flags and the settings `record_settings` checked (prompt_r1.evaluation.plan).

    write_eval_manifest(args, folder, settings, env_cfg, sources, prices, agent_cfg, search, earlier)
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.evaluation.optimizers.search import SearchSettings
from prompt_r1.runs.manifest import build_manifest, manifest_path, write_manifest

__all__ = ["write_eval_manifest"]


def write_eval_manifest(
    args: argparse.Namespace,
    folder: Path,
    settings: dict[str, Any],
    env_cfg: Any,
    sources: dict[str, str],
    prices: PriceTable,
    agent_cfg: Any,
    search: SearchSettings,
    earlier: dict[str, Any] | None,
) -> None:
    """The folder's manifest (prompt_r1.runs.manifest): what changes its rows is `settings` (run.json's, every
    method's and dataset's, checked by `record_settings`); the rest is operational, --limit and the scorer with it."""
    runs_on = {"methods": settings["methods"], "datasets": settings["datasets"]}
    operational = {
        "limit": args.limit, "scorer": args.scorer, "run_datasets": sources,
        "concurrency": args.concurrency, "max_failures": args.max_failures, "budget": args.budget,
        "env_cache": args.env_cache, "env_cache_always": args.env_cache_always,
        "agent": None if agent_cfg is None else dataclasses.asdict(agent_cfg),
        "environment": None if env_cfg is None else dataclasses.asdict(env_cfg),
    }  # fmt: skip
    seeds = {"agent": getattr(agent_cfg, "seed", None), "optimizers": search.opro.seed}
    manifest = build_manifest("eval", runs_on, operational, seeds=seeds, prices=prices)
    write_manifest(manifest_path(folder=folder), manifest, earlier, settings["changed"])
