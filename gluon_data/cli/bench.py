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
    import importlib.util
    path = bench_path()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(BENCH_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[BENCH_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[BENCH_MODULE]
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
