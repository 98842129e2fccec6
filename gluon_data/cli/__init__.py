"""The ``gluon-data`` command: thin subcommands over the library functions.

:mod:`.parser` builds the command line, :mod:`.commands` runs each command,
:mod:`.signals` decides how it ends, :mod:`.bench` loads the benchmark harness of a
source checkout.

Importing this package is cheap (the parser and the commands load when :func:`main` runs):
a process spawned by ``multiprocessing`` from the ``gluon-data`` script (a local Dask
cluster's worker) imports the script's module again, and so this package, before its task."""
from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from typing import List, Optional

from ..errors import CHECKPOINT_KEPT, GluonDataError
from .bench import BENCH_MODULE, bench_path, load_bench  # noqa: F401
from .signals import (deferred_interrupt, Terminated, catch_sigterm, ignore_late_interrupts,
                      stdout_closed)

__all__ = ["main", "storage_option_parser"]

_LAZY = {"build_parser": ".parser", "storage_option_parser": ".parser",
         "describe": ".commands", "run_demo": ".commands"}


def __getattr__(name):
    """``build_parser``, ``storage_option_parser``, ``describe`` and ``run_demo`` (and the
    submodules), loaded on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    elif name in ("parser", "commands"):
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    globals()[name] = value
    return value


def _bench(argv: List[str]) -> int:
    """``gluon-data bench``: its own parser, in ``benchmarks/bench.py``."""
    bench = load_bench()
    if bench is None:
        print("gluon-data: error: `gluon-data bench` runs from a source checkout (its "
              "harness, benchmarks/bench.py, is not part of the installed package): "
              "`bash scripts/run.sh gluon-data bench` there, or set GLUON_DATA_BENCH to "
              "the harness's path", file=sys.stderr)
        return 2
    return bench.main(argv)


#: ``GLUON_DATA_TRACEBACK=1``: an error prints its traceback above its one line
TRACEBACK_ENV = "GLUON_DATA_TRACEBACK"


def _said(e: BaseException) -> str:
    """The error line's text: an ``OSError`` that names its file as ``FILE: what`` (not
    ``[Errno 2] what: 'FILE'``), anything else as it reads."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        files = [str(f) for f in (e.filename, e.filename2) if f is not None]
        return "%s: %s" % (" -> ".join(files), e.strerror)
    return str(e)


def _resume_hint(interrupt: KeyboardInterrupt) -> str:
    """What an interrupted conversion's last line adds: ``--resume`` continues from its
    checkpoint, unless it says it kept none (stopped before its first, nothing is left)."""
    if getattr(interrupt, CHECKPOINT_KEPT, True):
        return "; rerun the same command with --resume to continue"
    return ("; no checkpoint had been taken yet, so nothing was kept: rerun the same command "
            "to start again")


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``gluon-data`` command ``argv`` (default: this process's command line) and
    return its exit status. Without ``argv`` it is the process's own command (the
    ``gluon-data`` script, ``python -m gluon_data``): once it has ended, a Ctrl-C is ignored
    while the interpreter exits, so the status stands (:func:`.signals.ignore_late_interrupts`)."""
    old = command = None
    exits = argv is None
    # Everything from the first line runs under the one interrupt handler below: the imports
    # of the commands and the argument parsing (most of a command's first second) included,
    # so a Ctrl-C at any moment ends the command with a line, never a traceback.
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = argv[0] if argv else None
        if command == "bench":
            return _bench(argv[1:])
        with deferred_interrupt():  # a Ctrl-C here waits until the modules are loaded
            from .parser import build_parser  # the commands load here, not with the package
            args = build_parser().parse_args(argv)
        old = catch_sigterm()
        code = args.func(args)
        if exits:
            ignore_late_interrupts()
        sys.stdout.flush()  # a closed pipe shows here, not as the interpreter exits
        return code
    except (GluonDataError, OSError, ValueError, ImportError) as e:
        if isinstance(e, BrokenPipeError) and stdout_closed():
            return 141  # as a Unix tool stopped by SIGPIPE: quietly
        if os.environ.get(TRACEBACK_ENV, "").strip() == "1":  # for a bug report
            traceback.print_exception(e, file=sys.stderr)
        print("gluon-data: error: %s" % _said(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        if exits:
            ignore_late_interrupts()
        print("gluon-data: %s%s" % ("terminated" if isinstance(e, Terminated) else
                                    "interrupted", _resume_hint(e) if command == "convert"
                                    else ""), file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        if exits:
            ignore_late_interrupts()
        if old is not None:
            signal.signal(signal.SIGTERM, old)


