"""Loading the benchmark harness, ``benchmarks/bench.py`` of a source checkout."""
from __future__ import annotations

import os
import sys

from typing import Optional


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
    own, by default), loaded once as module ``gluon_data_<name>`` so forked workers can
    unpickle what it defines (and ``from gluon_data_<name> import ...`` works once it is
    loaded). None where the file is absent."""
    key = "gluon_data_" + name
    if key in sys.modules:
        return sys.modules[key]
    if folder is None:
        path = bench_path()
        if path is None:
            return None
        folder = os.path.dirname(path)
    path = os.path.join(folder, name + ".py")
    return _load(key, path) if os.path.isfile(path) else None


def _load(key: str, path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
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
