#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv, installs torch 2.13.0 (CPU) when torch is
# missing, installs the package with its test dependencies, then runs the asked-for job.
#   bash run.sh demo [ARGS]   end-to-end demo on the embedded default (random:tiny + Seattle weather)
#   bash run.sh test [ARGS]   the test suite (pytest)
#   bash run.sh cli ARGS      any causal-qwen command, run in the caller's directory
set -euo pipefail
CALLER_DIR="$PWD"  # `cli` runs there, so a config's relative paths mean what they say
cd "$(dirname "$0")"
ROOT="$PWD"

VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.causal-qwen-installed"

if [ ! -x "$PY" ]; then
    echo "[setup] creating virtual environment in $VENV" >&2
    python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing torch==2.13.0" >&2
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet "torch==2.13.0"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "[setup] installing causal-qwen and its test dependencies" >&2
    "$PY" -m pip install --quiet -e ".[test,gguf]"
    touch "$STAMP"
fi

job="${1:-demo}"
shift || true
export TOKENIZERS_PARALLELISM=false
case "$job" in
    demo) exec "$VENV/bin/causal-qwen" demo "$@" ;;
    test) exec "$PY" -m pytest "$@" ;;
    cli)  cd "$CALLER_DIR" && exec "$ROOT/$VENV/bin/causal-qwen" "$@" ;;
    *) echo "usage: bash run.sh demo|test|cli [ARGS...]" >&2; exit 2 ;;
esac
