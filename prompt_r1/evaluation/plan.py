"""What an evaluation runs and under which settings: the methods, the paper's suites, the plan of a run, and the
settings manifest (run.json) that keeps one output folder to one set of settings.

Methods: `prompt-r1` (the agent ⇄ environment loop, through the same graph and client as `prompt-r1 run`),
`env-only` (the question straight to the environment: the paper's "w/o agent"), `agent-only` (the agent answers
alone: "w/o env"), `env-cot` (a chain-of-thought prompt to the environment), `opro`, `gepa` and `textgrad` (a prompt optimiser's
searched instruction, then env-only's request: prompt_r1.evaluation.optimizers.search).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.data.datasets import DATASETS
from prompt_r1.evaluation.optimizers.search import OPTIMIZERS
from prompt_r1.runs.manifest import measured as _measured

__all__ = [
    "MANIFEST",
    "METHODS",
    "SUITES",
    "MethodInfo",
    "Suite",
    "ordered",
    "record_settings",
    "resolve_plan",
]

MANIFEST = "run.json"


@dataclass(frozen=True)
class MethodInfo:
    title: str  # the row label of the tables
    needs_agent: bool
    needs_environment: bool


METHODS: dict[str, MethodInfo] = {
    "prompt-r1": MethodInfo("Prompt-R1", needs_agent=True, needs_environment=True),
    "env-only": MethodInfo("Env only (w/o agent)", needs_agent=False, needs_environment=True),
    "agent-only": MethodInfo("Agent only (w/o env)", needs_agent=True, needs_environment=False),
    "env-cot": MethodInfo("Env CoT", needs_agent=False, needs_environment=True),
    # A prompt optimiser's instruction, searched on training rows, then env-only's request (prompt_r1.evaluation.optimizers.search).
    "opro": MethodInfo("OPRO", needs_agent=False, needs_environment=True),
    "gepa": MethodInfo("GEPA", needs_agent=False, needs_environment=True),
    "textgrad": MethodInfo("TextGrad", needs_agent=False, needs_environment=True),
}


@dataclass(frozen=True)
class Suite:
    datasets: tuple[str, ...]
    methods: tuple[str, ...]  # used when no --method is given
    description: str


_MAIN = tuple(name for name, info in DATASETS.items() if info.split == "main")
_OOD = tuple(name for name, info in DATASETS.items() if info.split == "ood")
SUITES: dict[str, Suite] = {
    "paper-main": Suite(_MAIN, ("prompt-r1", "env-only", "env-cot"), "the 8 in-distribution sets (Table 2)"),
    "paper-ood": Suite(
        _OOD, ("prompt-r1", "env-only", "env-cot"), "the 4 out-of-distribution sets (Table 3)"
    ),
    "ablation": Suite(_MAIN, ("prompt-r1", "agent-only", "env-only"), "w/o agent and w/o env (Table 4)"),
}


def ordered(groups: Sequence[Any]) -> list[Any]:
    """Per-(dataset, method) results (anything with `.dataset` and `.method`) in the paper's order: bundled
    datasets as listed, then others by name; methods as `METHODS` lists them, then others by name."""
    dataset_rank = {name: i for i, name in enumerate(DATASETS)}
    method_rank = {name: i for i, name in enumerate(METHODS)}
    return sorted(
        groups,
        key=lambda g: (
            dataset_rank.get(g.dataset, len(dataset_rank)),
            g.dataset,
            method_rank.get(g.method, len(method_rank)),
            g.method,
        ),
    )


def resolve_plan(
    suite: str | None, datasets: Sequence[str] | None, methods: Sequence[str] | None
) -> tuple[list[str], list[str]]:
    """The datasets and methods of a run: a suite's, extended by explicit datasets; explicit methods win."""
    if suite is not None and suite not in SUITES:
        raise ConfigError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    chosen = list(SUITES[suite].datasets) if suite else []
    for name in datasets or []:
        if name not in chosen:
            chosen.append(name)
    if not chosen:
        raise ConfigError("nothing to evaluate: give --suite or at least one --dataset")
    picked = list(dict.fromkeys(methods or (SUITES[suite].methods if suite else ("prompt-r1",))))
    unknown = [m for m in picked if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    return chosen, picked


def _method_settings(
    method: str, agent_config: Any, environment_config: Any, loop: LoopConfig, search: dict | None
) -> dict:
    info = METHODS[method]
    settings: dict[str, Any] = {}
    if info.needs_agent and agent_config is not None:
        settings["agent"] = _measured(agent_config)
    if info.needs_environment and environment_config is not None:
        settings["environment"] = _measured(environment_config)
    if method == "prompt-r1":
        settings["loop"] = dataclasses.asdict(loop)
    if method in OPTIMIZERS and search is not None:  # the instruction, and so every row, comes of the search
        settings["search"] = search
    return settings


def _read_settings(path: Path) -> dict[str, Any]:
    """The settings file of an evaluation folder, or a `ConfigError` when the file there is not one."""
    if not path.exists():
        return {"methods": {}}
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        recorded = None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("methods"), dict):
        raise ConfigError(
            f"{path} is not the settings file of a prompt-r1 eval folder; it was left untouched: use another --out"
        )
    return recorded


# Settings added to a section after folders were written, with the value rows made before them had.
_ADDED_AT = {("loop", "protocol"): "paper"}


def record_settings(
    out_dir: str | Path,
    methods: Sequence[str],
    *,
    agent_config: Any = None,
    environment_config: Any = None,
    loop: LoopConfig | None = None,
    search: dict | None = None,
    datasets: dict[str, str] | None = None,
    allow_changed: bool = False,
) -> dict[str, Any]:
    """Refuse to mix rows produced under different settings in one folder; record the settings otherwise, and
    return them (every method's and every dataset's, this run's and earlier runs'), with the changes allowed under
    "changed". The folder's one settings check: its manifest's `measured` part is what this returns.

    Only what changes results is compared (models, sampling, loop, and the file or set each dataset label was
    loaded from); endpoints, limits, retries, `--limit` and the scorer may change (a run on the first N rows may go
    on to more; a scorer rescores the same rows). A method or dataset new to the folder adds rows beside the
    others. `allow_changed` (`eval --allow-changed-settings`) records the new settings instead of refusing them.
    """
    loop = loop or LoopConfig()
    settings = {m: _method_settings(m, agent_config, environment_config, loop, search) for m in methods}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / MANIFEST
    recorded = _read_settings(path)
    allowed: list[str] = []
    for method, current in settings.items():
        before = recorded["methods"].get(method)
        if before is None or before == current:
            continue
        changes = []
        for section in sorted(set(before) | set(current)):
            old, new = before.get(section, {}), current.get(section, {})
            for name in sorted(set(old) | set(new)):
                if name not in old and new.get(name) == _ADDED_AT.get((section, name)):
                    continue  # added since the folder was written, at the value every earlier row had
                if old.get(name) != new.get(name):
                    changes.append(f"{section}.{name}: {old.get(name)!r} → {new.get(name)!r}")
        # A setting added since the folder was written, at its unset value, changed nothing the rows depend on.
        if not changes:
            continue
        if allow_changed:
            allowed += [f"{method} {change}" for change in changes]
            continue
        raise ConfigError(
            f"{out_dir} holds {method} rows made with other settings ({'; '.join(changes)}); "
            "use another --out folder, the same settings to resume, or --allow-changed-settings to mix them"
        )
    known = recorded.setdefault("datasets", {})
    moved = [f"dataset {label}: {known[label]!r} → {source!r}" for label, source in (datasets or {}).items()
             if known.get(label, source) != source]  # fmt: skip
    if moved and not allow_changed:
        raise ConfigError(
            f"{out_dir} holds rows made with other settings ({'; '.join(moved)}); use another --out folder, the "
            "same settings to resume, or --allow-changed-settings to mix them"
        )
    allowed += moved
    known.update(datasets or {})
    recorded["methods"].update(settings)
    path.write_text(json.dumps(recorded, indent=2, ensure_ascii=False) + "\n")
    return {"methods": recorded["methods"], "datasets": known, "changed": allowed}
