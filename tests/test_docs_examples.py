"""Every shell and Python example of the README and the docs runs, or says why it cannot here.

Each fenced `bash` or `python` block is preceded by one marker line, an HTML comment the site does not show:

    <!-- example: runs -->                         run here, offline (`runs, slow`: only with `-m slow`)
    <!-- example: needs gpu: WHY -->               cannot run without a GPU
    <!-- example: needs hub: WHY -->               needs a model hub, a provider's API key or a trained model
    <!-- example: needs service: WHY -->           needs a service of the user's own (a Redis every machine reaches)
    <!-- example: covered by tests/F.py::NAME: WHY -->   too long for the suite, or run by a test already; NAME
                                                         runs the same path (smaller) or the same commands

A block that runs does so from the repository root with `.venv/bin` first on PATH (as after
`source .venv/bin/activate`), in a fresh process, and must exit 0. An unmarked block fails the suite, so a new
example cannot be added without saying which it is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "SECURITY.md",
    ROOT / "training" / "README.md",
    ROOT / "evals" / "README.md",
    ROOT / "graphs" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^ *```(bash|sh|shell|python)\s*$")
MARK = re.compile(
    r"^<!-- example: (?P<kind>runs(?:, slow)?|needs (?:gpu|hub|service): .+|covered by \S+::\w+: .+) -->$"
)


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    language: str
    code: str
    mark: str | None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _examples() -> list[Example]:
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            fence = FENCE.match(lines[index])
            if not fence:
                index += 1
                continue
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            before = next((lines[i].strip() for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            mark = MARK.match(before)
            code = "\n".join(lines[index + 1 : end])
            found.append(Example(page, index + 1, fence.group(1), code, mark.group("kind") if mark else None))
            index = end + 1
    return found


EXAMPLES = _examples()


def test_every_example_is_marked():
    unmarked = [example.id for example in EXAMPLES if example.mark is None]
    assert not unmarked, f"examples without an `<!-- example: ... -->` line before them: {unmarked}"
    assert sum(example.mark.startswith("runs") for example in EXAMPLES) >= 6


def test_a_covering_test_exists():
    for example in EXAMPLES:
        if example.mark and example.mark.startswith("covered by "):
            file, name = re.match(r"covered by (\S+)::(\w+):", example.mark).groups()
            target = f"{file}::{name}"
            assert f"def {name}(" in (ROOT / file).read_text(encoding="utf-8"), f"{example.id}: no {target}"


def _params():
    for example in EXAMPLES:
        if example.mark is None or not example.mark.startswith("runs"):
            continue
        marks = [pytest.mark.slow] if example.mark == "runs, slow" else []
        yield pytest.param(example, id=example.id, marks=marks)


@pytest.mark.parametrize("example", list(_params()))
def test_example_runs(example, tmp_path):
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
        "VIRTUAL_ENV": str(Path(venv_bin).parent),
    }
    env["TMPDIR"] = str(tmp_path)
    if example.language == "python":
        script = tmp_path / "example.py"
        script.write_text(example.code, encoding="utf-8")
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", example.code]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{example.id} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
