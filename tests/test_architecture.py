"""The import contract (`[tool.importlinter]` in pyproject.toml): prompt_r1's layers import only the layers below
them, no two modules or subpackages of one package import each other, every module belongs to a layer, core and
scoring load no heavy library, nothing below the surfaces imports cli, integrations or testing, and inference does
not import training. From the project root, `.venv/bin/lint-imports` runs the same check.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120
    )


def test_the_import_contract_holds():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("file", "line", "broken"),
    [
        (
            "core/text.py",
            "from prompt_r1.loop import graph",
            "prompt_r1.core is not allowed to import prompt_r1.loop",
        ),
        ("cli/flags.py", "from prompt_r1.cli import main", "No cycles are allowed in prompt_r1.cli"),
        ("scoring/metrics.py", "import torch", "prompt_r1.scoring is not allowed to import torch"),
        (
            "runs/pool.py",
            "from prompt_r1.testing import scripted",
            "prompt_r1.runs is not allowed to import prompt_r1.testing",
        ),
        (
            "integrations/server.py",
            "from prompt_r1.training import trainer",
            "prompt_r1.integrations is not allowed to import prompt_r1.training",
        ),
        ("stray.py", "import json", "prompt_r1.stray"),  # a module that belongs to no layer
    ],
)
def test_the_contract_catches_an_import_up_a_layer_a_circle_or_a_stray_module(tmp_path, file, line, broken):
    """The contract has teeth: the same tree with one import added, which the contract must refuse."""
    shutil.copytree(ROOT / "prompt_r1", tmp_path / "prompt_r1", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with (tmp_path / "prompt_r1" / file).open("a", encoding="utf-8") as f:
        f.write(f"\n{line}  # added by the test\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in result.stdout, result.stdout


def private_imports(root: Path) -> set[tuple[str, str, str]]:
    """(file, module, name) for every `from prompt_r1.… import _name` in the project's Python files."""
    import ast

    found = set()
    for folder in ("prompt_r1", "tests", "evals", "graphs", "training", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prompt_r1"):
                    found |= {
                        (path.relative_to(root).as_posix(), node.module, alias.name)
                        for alias in node.names
                        if alias.name.startswith("_")
                    }
    return found


def test_no_module_imports_another_modules_private_names(tmp_path):
    """A name another module needs is public (with a docstring) or lives where it is used."""
    assert private_imports(ROOT) == set()
    planted = tmp_path / "prompt_r1" / "stray.py"
    planted.parent.mkdir()
    planted.write_text("from prompt_r1.core.tokens import _DUMMY_USER\n", encoding="utf-8")
    assert private_imports(tmp_path) == {("prompt_r1/stray.py", "prompt_r1.core.tokens", "_DUMMY_USER")}
