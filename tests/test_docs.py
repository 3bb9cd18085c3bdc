"""The docs site (mkdocs.yml, docs/) builds with `mkdocs build --strict` (a broken link or a missing reference
fails; the Concepts page's Mermaid drawing is a diagram; the home page and Concepts link the paper), and its
architecture page draws the layers of the import contract in pyproject.toml."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def test_the_docs_site_builds_strict(tmp_path):
    result = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    assert (site / "reference" / "loop" / "index.html").is_file()
    # The loop's drawing is a diagram (mermaid.js draws a `pre.mermaid`), not its source shown as code.
    concepts = (site / "concepts" / "index.html").read_text(encoding="utf-8")
    assert '<pre class="mermaid"><code>' in concepts and "language-mermaid" not in concepts
    assert "assets/stylesheets/extra.css" in concepts  # wide code blocks scroll inside a wider page
    for page in ("index.html", "concepts/index.html"):
        assert 'href="https://arxiv.org/abs/2511.01016"' in (site / page).read_text(encoding="utf-8"), page


def test_the_architecture_page_draws_the_contracts_layers():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c for c in contracts["contracts"] if c["type"] == "layers")["layers"]
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = re.search(r"## Layers\n.*?```text\n(.*?)```", page, re.S).group(1)
    drawn = [re.split(r"\s{2,}", line.strip())[0] for line in drawing.splitlines() if line.strip()]
    assert drawn == layers
