#!/usr/bin/env bash
# Set up (once) and run gluon_data from a fresh clone. Needs only Python.
#
#   bash scripts/run.sh demo     # pack a generated VOC-like sample, read it back through a DataLoader
#   bash scripts/run.sh test     # both test lanes: the full suite (Python 3.11, MXNet), then
#                                # the core suite (Python 3.13, numpy 2, no MXNet)
#   bash scripts/run.sh test-full [pytest args]   # the full suite alone
#   bash scripts/run.sh test-core [pytest args]   # the core suite alone
#   bash scripts/run.sh gluon-data --help
#
# Each lane has its own virtual environment (.venv: PYTHON, default python3.11 or python3;
# .venv-core: CORE_PYTHON, default python3.13), rebuilt when pyproject.toml, constraints.txt,
# the C extension's setup.py / source or the lane's client set change. Every command sets up
# .venv the same way (the PyTorch client included), so the environment is the same whichever
# command ran first. Where no Python 3.12+ is found the core lane says so and is not run (CI
# has one; set CORE_PYTHON to point at yours). `test` fails when a test is skipped for a
# reason tests/allowed_skips.txt does not allow here (GLUON_DATA_STRICT_SKIPS=1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

pick() {  # the first interpreter of "$@" that runs
    for p in "$@"; do
        [ -n "$p" ] && "$p" -c 'import sys' >/dev/null 2>&1 && { echo "$p"; return 0; }
    done
    return 1
}

setup() {  # setup VENV PYTHON EXTRA...: create VENV with PYTHON and install the package into it
    local venv="$1" py="$2"
    shift 2
    local stamp="$venv/.gluon-data-installed" want
    want="$( (cat pyproject.toml constraints.txt setup.py gluon_data/format/_jpegregion.c \
        gluon_data/format/_maskrle.c gluon_data/convert/_moments.c gluon_data/arrays/_blur.c; echo "clients: $*") \
        | "$py" -c 'import hashlib,sys; print(sys.version.split()[0], hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "gluon_data: installing into $venv ($("$py" --version)) ..." >&2
        rm -rf "$venv"
        "$py" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --upgrade "pip>=23" >&2
        "$venv/bin/python" -m pip install --quiet -c constraints.txt -e ".[test]" >&2
        for client in "$@"; do torch_client "$venv" "$client"; done
        echo "$want" > "$stamp"
    elif [ $# -gt 0 ] && [ ! -d "$venv/torch-client" ]; then
        # installed before its wheel was on this disk: try again (a probe of the local disk)
        for client in "$@"; do torch_client "$venv" "$client"; done
    fi
}

torch_client() {  # torch_client VENV REQUIREMENT: PyTorch for the client test, beside VENV
    # Installed into a folder of its own (gluoncv refuses to import where torch >= 2 is), and
    # only where the wheel lies on this machine's disk: never a multi-GB download.
    local venv="$1" req="$2" probe
    probe="$(mktemp -d)"
    if "$venv/bin/python" -m pip download --quiet --no-index --no-deps -d "$probe" "$req" \
            >/dev/null 2>&1; then
        echo "gluon_data: installing $req (local wheel) into $venv/torch-client ..." >&2
        "$venv/bin/python" -m pip install --quiet --target "$venv/torch-client" \
            -c constraints.txt "$req" >&2 \
            || echo "gluon_data: $req did not install; the PyTorch client test skips" >&2
    else
        echo "gluon_data: $req is not on this machine's disk; the PyTorch client test skips" >&2
    fi
    rm -rf "$probe"
}

full_py() { pick "${PYTHON:-}" python3.11 python3; }
# .venv's clients: every command that sets .venv up asks for the same ones
FULL_CLIENTS=("torch==2.13.0")
setup_full() { setup "$root/.venv" "$(full_py)" "${FULL_CLIENTS[@]}"; }
core_py() {
    PYENV_VERSION="${PYENV_VERSION:-3.13.0}" pick "${CORE_PYTHON:-}" python3.13 python3.12 \
        || return 1
}

full() {
    setup_full
    echo "== the full suite: $("$root/.venv/bin/python" --version), MXNet" >&2
    # where the client's wheel is not on this disk, its test's skip is allowed (and said so)
    [ -d "$root/.venv/torch-client" ] || export GLUON_DATA_TORCH_ABSENT=1
    GLUON_DATA_TORCH_PATH="$root/.venv/torch-client" "$root/.venv/bin/python" -m pytest "$@"
}

core() {
    local py
    if ! py="$(core_py)"; then
        echo "gluon_data: no Python >= 3.12 found (CORE_PYTHON); the core lane was not run" >&2
        [ "${GLUON_DATA_REQUIRE_CORE:-0}" = 1 ] && return 1
        return 0
    fi
    export PYENV_VERSION="${PYENV_VERSION:-3.13.0}"
    setup "$root/.venv-core" "$py"
    # the lane's point: MXNet is absent (the interop tests reach the full lane's interpreter)
    if "$root/.venv-core/bin/python" -c 'import mxnet' >/dev/null 2>&1; then
        echo "gluon_data: .venv-core has MXNet installed; the core lane must run without it" >&2
        return 1
    fi
    echo "== the core suite: $("$root/.venv-core/bin/python" --version), numpy 2, no MXNet" >&2
    GLUON_DATA_MXNET_PYTHON="$root/.venv/bin/python" "$root/.venv-core/bin/python" -m pytest "$@"
}

cmd="${1:-demo}"
[ $# -gt 0 ] && shift
case "$cmd" in
    demo)      setup_full && exec "$root/.venv/bin/gluon-data" demo "$@" ;;
    test)      export GLUON_DATA_STRICT_SKIPS=1; full "$@"; core "$@" ;;
    test-full) full "$@" ;;
    test-core) core "$@" ;;
    *)         setup_full && exec "$root/.venv/bin/$cmd" "$@" ;;
esac
