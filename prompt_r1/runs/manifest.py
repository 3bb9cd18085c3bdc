"""The manifest beside every output: which code, libraries, settings, seeds, prices, command and machine made it.

    path = manifest_path(results_file=Path("results.jsonl"))          # results.manifest.json, beside it
    path = manifest_path(folder=Path("eval-results"))                  # eval-results/manifest.json
    earlier = check_manifest(path, settings, allow_changed=False, flag="--allow-changed-settings")
    write_manifest(path, build_manifest("batch", settings, seeds=..., prices=...), earlier)

`batch` writes `NAME.manifest.json` beside `NAME.jsonl`; `eval` and `train` write `manifest.json` in their
output folder. One file holds:
- `prompt_r1`: the package's version and, from a git checkout, its commit; `libraries`: torch, transformers, trl,
  vllm, langgraph (as installed; null when not);
- `settings`: the run's resolved settings, every registered key cut out (prompt_r1.core.redaction): `measured`
  (what changes results: compared when a run adds to the output) and `operational` (endpoints, limits, files);
  `seeds`;
- `prices`: the price table the costs came from (`--prices` or the bundled one), $ per 1M tokens;
- `command_line` (URL secrets and the values of secret-named flags such as `--hub_token` masked), `machine` (OS, Python, CPU, GPUs), `written_at`;
- `runs`: one entry per run that wrote to the output (its time, command line, code and, when it was allowed to
  differ, which settings changed).

A run that adds to an output made before compares the settings that change results (`measured`: models,
sampling, loop; not endpoints, limits or retries) with the manifest's, and is refused in one line naming each that
differs unless the user allows it. A manifest that does not parse is refused too (exit 2), and left as it is.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prompt_r1.clients.costs import PriceTable
from prompt_r1.core import redaction
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.files import write_whole

__all__ = [
    "FOLDER_MANIFEST",
    "LIBRARIES",
    "OPERATIONAL",
    "ManifestError",
    "build_manifest",
    "changed_settings",
    "check_manifest",
    "manifest_path",
    "measured",
    "read_manifest",
    "write_manifest",
]

FORMAT = "prompt-r1 manifest"
VERSION = 1
FOLDER_MANIFEST = "manifest.json"
LIBRARIES = ("torch", "transformers", "trl", "vllm", "langgraph")

# Settings that change how a run reaches its endpoints but not what it measures; a resumed run may change them
# (a server that moved to another port keeps its model name; a run that ran out of memory resumes with a lower
# generate bound).
OPERATIONAL = frozenset(
    {
        "base_url",
        "api_key_env",
        "rate_limit",
        "rate_period",
        "max_in_flight",
        "tokens_per_minute",
        "token_limit",
        "rate_store",
        "timeout",
        "max_retries",
        "backoff_initial",
        "backoff_max",
        "max_retry_after",
        "device",
        "generate_memory_mb",
    }
)


class ManifestError(ConfigError):
    """A manifest that cannot be read, or an output made under other settings; one line naming the file."""


def measured(config: Any) -> dict[str, Any]:
    """A config's fields that change results (`OPERATIONAL` left out), as a dict."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return {k: v for k, v in values.items() if k not in OPERATIONAL}


def manifest_path(*, results_file: Path | None = None, folder: Path | None = None) -> Path:
    """Where an output's manifest goes: NAME.manifest.json beside a results file NAME.jsonl, or manifest.json in
    an output folder."""
    if results_file is not None:
        return Path(results_file).with_name(Path(results_file).stem + ".manifest.json")
    assert folder is not None
    return Path(folder) / FOLDER_MANIFEST


def git_commit(*, mark_changes: bool = False) -> str | None:
    """The commit of the checkout prompt-r1 runs from, or None when it is not one (an installed wheel);
    `mark_changes`: with `+changes` after it when tracked files differ from it (a benchmark's figures record it)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=5, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD") or None
    if commit and mark_changes and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    return commit


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """The GPUs this machine has: torch's view when torch is loaded already, else nvidia-smi's, else none (no
    import of torch only to write a manifest: it takes seconds)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:  # a broken driver is not the manifest's problem
            return []
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu(),
        "cpus": os.cpu_count(),
        "gpus": _gpus(),
    }


def _prices(prices: PriceTable | None) -> dict[str, Any] | None:
    if prices is None:
        return None
    return {
        "source": "prompt_r1/clients/prices.yaml" + (f" updated by {prices.path}" if prices.path else ""),
        "usd_per_1m_tokens": {
            m: {"input": p.input, "output": p.output} for m, p in sorted(prices.prices.items())
        },
    }


def build_manifest(
    command: str,
    settings: Mapping[str, Any],
    operational: Mapping[str, Any] | None = None,
    *,
    seeds: Mapping[str, Any] | None = None,
    prices: PriceTable | None = None,
    command_line: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The manifest of one run of `command`: the `settings` that change its results and the `operational` ones
    (endpoints, limits, files), as the run resolved them, keys cut out."""
    code = {"version": _version("prompt-r1"), "commit": git_commit()}
    line = list(sys.argv if command_line is None else command_line)
    scrub = redaction.Redactor().scrub
    return {
        "format": FORMAT,
        "version": VERSION,
        "command": command,
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "prompt_r1": code,
        "libraries": {name: _version(name) for name in LIBRARIES},
        "settings": {
            "measured": scrub(_plain(settings)),
            "operational": scrub(_plain(dict(operational or {}))),
        },
        "seeds": scrub(_plain(dict(seeds or {}))),
        "prices": _prices(prices),
        "command_line": scrub(redaction.mask_command_line(line)),
        "machine": machine(),
    }


def _plain(value: Any) -> Any:
    """JSON-like: paths and other objects as text, tuples as lists."""
    return json.loads(json.dumps(value, default=str))


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at `path`, None when there is none; a `ManifestError` for a file that is not one."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise ManifestError(f"{path} does not parse as a manifest ({why}); it was left untouched: move it away "
                            "or use another output") from None  # fmt: skip
    settings = data.get("settings") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(settings, dict)
        or not isinstance(settings.get("measured"), dict)
    ):
        raise ManifestError(f"{path} is not a prompt-r1 manifest; it was left untouched: move it away or use "
                            "another output")  # fmt: skip
    return data


def changed_settings(before: Mapping[str, Any], now: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Each setting that differs, as `section.name: old → new` (nested sections joined by dots)."""
    changes = []
    for name in sorted(set(before) | set(now)):
        old, new = before.get(name), now.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            changes += changed_settings(old, new, f"{prefix}{name}.")
        elif old != new:
            changes.append(f"{prefix}{name}: {old!r} → {new!r}")
    return changes


def check_manifest(
    path: Path, settings: Mapping[str, Any], *, allow_changed: bool, flag: str, what: str = "output"
) -> tuple[dict[str, Any] | None, list[str]]:
    """Before a run adds to an output: (the manifest there or None, the settings that changed). Refused in one
    line naming each change unless `allow_changed` (the user's `flag`); nothing is written."""
    earlier = read_manifest(path)
    if earlier is None:
        return None, []
    changes = changed_settings(earlier["settings"]["measured"], redaction.Redactor().scrub(_plain(settings)))
    if changes and not allow_changed:
        raise ManifestError(
            f"{path.parent if path.name == FOLDER_MANIFEST else path} holds results made with other settings "
            f"({'; '.join(changes)}); use another {what}, the same settings to resume, or {flag} to mix them"
        )
    return earlier, changes


def write_manifest(
    path: Path,
    manifest: dict[str, Any],
    earlier: Mapping[str, Any] | None = None,
    changes: Iterable[str] = (),
) -> None:
    """Write `manifest` whole (a temporary file renamed into place), with the runs of `earlier` and this one."""
    runs = list(earlier.get("runs") or []) if isinstance(earlier, Mapping) else []
    run = {k: manifest[k] for k in ("written_at", "command_line", "prompt_r1")}
    changes = list(changes)
    if changes:
        run["changed"] = changes
    manifest = {**manifest, "runs": [*runs, run]}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(
        path, redaction.dumps(manifest, indent=2) + "\n"
    )  # its temporary made anew, never through a link
