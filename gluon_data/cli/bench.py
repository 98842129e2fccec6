"""Loading the benchmark harness, ``benchmarks/bench.py`` of a source checkout."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from typing import TYPE_CHECKING, Optional, cast

if TYPE_CHECKING:  # annotations only
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec


BENCH_MODULE = "gluon_data_bench"


def load_bench():
    """The benchmark harness, ``benchmarks/bench.py`` of the source tree (a tool, not part of
    the package): the file ``$GLUON_DATA_BENCH`` names, else the one next to this package
    (a checkout or an editable install). Loaded once as module ``gluon_data_bench``, so
    forked workers can unpickle what it defines. None where neither exists (a wheel)."""
    if BENCH_MODULE in sys.modules:
        return sys.modules[BENCH_MODULE]
    path = bench_path()
    return None if path is None else _load(BENCH_MODULE, path)


def load_bench_part(name: str, folder: Optional[str] = None):
    """``<folder>/<name>.py``, a module the harness is split into (``folder``: the harness's
    own, by default), imported as module ``<name>`` with its folder on ``sys.path``, the way
    the harness imports its parts (so a forked or spawned worker unpickles what it defines).
    None where the file is absent."""
    if folder is None:
        path = bench_path()
        if path is None:
            return None
        folder = os.path.dirname(path)
    if not os.path.isfile(os.path.join(folder, name + ".py")):
        return None
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)


def _load(key: str, path: str):
    # bench_path names an existing file: spec and loader are not None (as before, an
    # unloadable file fails below with an AttributeError)
    spec = cast("ModuleSpec", importlib.util.spec_from_file_location(key, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        cast("Loader", spec.loader).exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def bench_path() -> Optional[str]:
    """Where load_bench finds the harness: ``$GLUON_DATA_BENCH``, else ``benchmarks/bench.py``
    next to this package; None where neither is a file (an installed wheel)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for path in (os.environ.get("GLUON_DATA_BENCH"),
                 os.path.join(here, "benchmarks", "bench.py")):
        if path and os.path.isfile(path):
            return path
    return None
