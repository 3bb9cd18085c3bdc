#!/usr/bin/env bash
# Set up .venv with prompt-r1 and the extras named in $1 (default: dev,train,eval,serve,app). Safe to run again: installed
# pieces are kept. Run from anywhere: bash scripts/setup.sh [EXTRAS]
#
# torch: on a machine without CUDA this installs the CPU build, torch==2.13.0, before anything else can pull
# the multi-GB CUDA build. Where pip's own index would give the CUDA build (plain Linux + PyPI), set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu. Machines with CUDA are left alone: pip picks their build.
# deepspeed (train extra) compiles no ops at install (DS_BUILD_OPS=0) and needs torch at build time
# (--no-build-isolation); its ops are JIT-built on first use on GPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev,train,eval,serve,app}"
PYTHON="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "prompt-r1 needs Python >= 3.11; set PYTHON=/path/to/python3.11+")'
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: CUDA found; torch comes with the package's dependencies"
  else
    echo "setup: no CUDA; installing the CPU build of torch 2.13.0"
    "${PIP[@]}" "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
  fi
fi

if [[ ",$EXTRAS," == *",train,"* ]] && ! .venv/bin/python -c 'import deepspeed' 2>/dev/null; then
  echo "setup: installing deepspeed (DS_BUILD_OPS=0, --no-build-isolation)"
  DS_BUILD_OPS=0 "${PIP[@]}" --no-build-isolation deepspeed
fi

echo "setup: installing prompt-r1[$EXTRAS]"
"${PIP[@]}" -e ".[$EXTRAS]"
.venv/bin/python -c 'import torch, prompt_r1; print(f"setup: ok (prompt-r1 {prompt_r1.__version__}, torch {torch.__version__})")'
