"""The checkpoint a run resumes from, read through before anything loads, so that a damaged one is one line.

`train(..., resume=True)` resumes from the last `checkpoint-N` folder of output_dir. A file in it that a killed
save or a full disk left cut, emptied or overwritten would otherwise fail deep in transformers, safetensors or
torch as a long traceback, after the model has loaded. `check_resume_checkpoint` reads what can be read cheaply:
the trainer state (JSON), every JSON file, the header of every safetensors file (which must cover the file
exactly, so a cut file shows), and the zip directory of every torch file (`.pt`, `.pth`, `.bin`: torch saves zip
archives, whose directory is at their end). Bytes changed inside a tensor's data cannot be seen: safetensors and
torch keep no checksum of it.

    check_resume_checkpoint("runs/tiny/checkpoint-4")   # ResumeError naming the file and what is wrong
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from prompt_r1.core.errors import ConfigError

__all__ = ["ResumeError", "check_ledger_for_resume", "check_resume_checkpoint"]

TRAINER_STATE = "trainer_state.json"


class ResumeError(ConfigError):
    """A checkpoint that cannot be resumed from; the message names the file and what is wrong, in one line."""


def _problem(path: Path) -> str | None:
    """What is wrong with one file of a checkpoint, or None when it reads."""
    suffix = path.suffix
    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    if suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return f"is not JSON ({str(exc).splitlines()[0]})"
    elif suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="numpy") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as exc:
            return f"is not a whole safetensors file ({str(exc).splitlines()[0]})"
    elif suffix in (".pt", ".pth", ".bin"):
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return f"is not a whole torch file ({exc})"
    return None


def check_resume_checkpoint(folder: str | Path) -> None:
    """Refuse, in one line naming the file, a checkpoint folder whose trainer state is missing or whose files do
    not read (see the module). Nothing is changed."""
    folder = Path(folder)
    if not (folder / TRAINER_STATE).is_file():
        raise ResumeError(
            f"--resume: {folder} has no {TRAINER_STATE}, so it is not a whole checkpoint; {_fix(folder)}"
        )
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            problem = _problem(path)
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
        if problem is not None:
            raise ResumeError(f"--resume: {path} {problem}: the checkpoint is damaged; {_fix(folder)}")


def _fix(folder: Path) -> str:
    return (
        f"move {folder.name} out of {folder.parent} to resume from the checkpoint before it, or point "
        "--resume_from_checkpoint at another"
    )


def logged_calls(folder: str | Path) -> float:
    """The environment calls the run had paid for when the checkpoint was saved, as its log says (0 when none)."""
    state = json.loads((Path(folder) / TRAINER_STATE).read_text(encoding="utf-8"))
    logged = [
        row for row in state.get("log_history", []) if isinstance(row, dict) and "env/total_calls" in row
    ]
    return float(logged[-1]["env/total_calls"]) if logged else 0.0


def check_ledger_for_resume(folder: str | Path, ledger: str | Path) -> None:
    """Refuse to resume from a checkpoint that logged paid calls when this process's ledger is gone: a new one
    in its place would pay them again and restart the spend total at nothing. (A ledger that is there but lost
    calls is refused when training begins, by `prompt_r1.training.shared.spend`, which sums every process's.)"""
    ledger = Path(ledger)
    paid = logged_calls(folder)
    if paid > 0 and not ledger.exists():
        raise ResumeError(
            f"--resume: the call ledger {ledger} is missing, but {Path(folder).name} logged {paid:.0f} paid calls: "
            "restore it, or resume with call_ledger false (the spend total then comes from the checkpoint's log, "
            "and calls after it are paid again)"
        )
