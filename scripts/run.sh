#!/usr/bin/env bash
# Set up (once) and run gluon_data from a fresh clone. Needs only python3 (3.9-3.11).
#
#   bash scripts/run.sh demo     # pack a generated VOC-like sample, read it back through a DataLoader
#   bash scripts/run.sh test     # the whole test suite (extra arguments go to pytest)
#   bash scripts/run.sh gluon-data --help
#
# The virtual environment lives in .venv and is rebuilt when pyproject.toml,
# constraints.txt or the C extension's setup.py / source change. Set PYTHON to choose the interpreter.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.gluon-data-installed"
want="$(cat pyproject.toml constraints.txt setup.py gluon_data/format/_jpegregion.c | "$py" -c 'import hashlib,sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "gluon_data: installing into $venv (first run only) ..." >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade "pip>=23" >&2
    "$venv/bin/python" -m pip install --quiet -c constraints.txt -e ".[test]" >&2
    echo "$want" > "$stamp"
fi

cmd="${1:-demo}"
[ $# -gt 0 ] && shift
case "$cmd" in
    demo) exec "$venv/bin/gluon-data" demo "$@" ;;
    test) exec "$venv/bin/python" -m pytest "$@" ;;
    *)    exec "$venv/bin/$cmd" "$@" ;;
esac
