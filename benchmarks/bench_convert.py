#!/usr/bin/env python
"""How conversion scales, in one run: ``python benchmarks/bench_convert.py [--images N]``.

On the same VOC-like pairs (``bench_common.make_dataset``): ``convert`` pass-through and re-encode
with 1 and N workers, their fixed cost (10 pairs), the N-process decode floor of the same
files (the bytes in memory, forked processes timed from a barrier), the parent process's own
CPU per item with N workers, where it only orders and writes (``resource.getrusage`` of this
process, children excluded, the whole ``convert`` call: planning, pool start, publish) and
from it the workers it can serve, im2rec re-encoding at N
threads, and a sharded ``convert`` on a Dask ``LocalCluster`` of 1 and 2 single-threaded worker
processes (each cluster started before its clock, its start-up printed apart). Prints the
rates and the ratio rows with their targets; the machine may be shared, so compare ratios
of one run.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from typing import Optional

from gluon_data.convert import convert

import bench_cls
import bench_common

__all__ = ["run_convert_bench"]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _self_cpu() -> float:
    """CPU seconds of this process (all its threads), its children excluded."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _dask_rate(voc: str, out: str, n: int, workers: int, shards: int) -> tuple:
    """(items/s of a sharded conversion on a running LocalCluster, its start-up seconds)."""
    import dask.distributed as dd
    t0 = time.perf_counter()
    with dd.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                         dashboard_address=None) as cluster, dd.Client(cluster):
        started = time.perf_counter() - t0
        seconds = _timed(lambda: convert(
            voc, out, "voc", split="train", shards=shards, engine="dask",
            scheduler=cluster.scheduler_address, overwrite=True))
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    return n / seconds, started


_FLOOR = """
import os, sys
sys.path.insert(0, sys.argv[3])
from bench_common import _forked_decode_rate
voc, w = sys.argv[1], int(sys.argv[2])
jpgs = sorted(os.listdir(os.path.join(voc, "JPEGImages")))
pairs = [(open(os.path.join(voc, "JPEGImages", f), "rb").read(),
          open(os.path.join(voc, "SegmentationClass", f[:-4] + ".png"), "rb").read())
         for f in jpgs]
print(_forked_decode_rate(pairs, w))
"""


def _decode_floor(voc: str, workers: int) -> float:
    """``bench_common._forked_decode_rate`` of the dataset's pairs, run from a fresh process: one
    forked from this one after OpenCV ran its threads here can deadlock."""
    res = subprocess.run([sys.executable, "-c", _FLOOR, voc, str(workers),
                          os.path.dirname(os.path.abspath(__file__))], check=True,
                         capture_output=True, text=True, timeout=900)
    return float(res.stdout.split()[-1])


def run_convert_bench(workdir: str, n: int = 2400, workers: int = 2, out=sys.stdout,
                      dask_items: int = -1, shards: int = 16, repeat: int = 1) -> dict:
    """Measure and print (see the module's doc); returns ``{"rates", "ratios", "seconds"}``.
    ``dask_items``: images of the Dask rows (-1: ``n``; 0: no Dask rows). ``repeat``: the
    floor and conversion rows are measured that many times, interleaved, and the best of each
    kept (on a shared machine the best is the least disturbed)."""

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    voc = bench_common.make_dataset(workdir, n)
    small = bench_common.make_dataset(os.path.join(workdir, "small"), 10, seed=1)
    rec = os.path.join(workdir, "conv.rec")
    rates, seconds = {}, {}
    say("conversion scaling: %d VOC-like pairs, 1 and %d workers%s"
        % (n, workers, ", best of %d" % repeat if repeat > 1 else ""))

    def best(table, key, value, low=False):
        table[key] = value if key not in table else (min if low else max)(table[key], value)

    for _ in range(max(1, repeat)):
        for w in (1, workers):
            best(rates, "decode floor, %d processes" % w, _decode_floor(voc, w))
        for mode, kw in (("pass-through", {}), ("re-encode", dict(encoding="jpg", quality=90))):
            for w in (1, workers):
                c0 = _self_cpu()
                best(rates, "convert %s, %d workers" % (mode, w), n / _timed(lambda: convert(
                    voc, rec, "voc", split="train", workers=w, overwrite=True, **kw)))
                if w > 1 and not kw:
                    best(seconds, MAIN_CPU % w, (_self_cpu() - c0) / n * 1e3, low=True)
        for w in (1, workers):
            best(seconds, "convert 10 pairs, %d workers (s)" % w, _timed(lambda: convert(
                small, rec, "voc", split="train", workers=w, overwrite=True)), low=True)
    jpgs = sorted(os.listdir(os.path.join(voc, "JPEGImages")))
    prefix = os.path.join(workdir, "im2rec", "reenc")
    shutil.copy(bench_cls._stock_lst(os.path.dirname(prefix),
                                 [os.path.join(voc, "JPEGImages", f) for f in jpgs]),
                prefix + ".lst")
    rates["im2rec re-encode, %d threads" % workers] = n / _timed(
        lambda: bench_cls._im2rec(voc, prefix, "re-encode", workers))
    dask_n = n if dask_items < 0 else dask_items
    if dask_n:
        dvoc = voc if dask_n == n else bench_common.make_dataset(os.path.join(workdir, "dask"),
                                                          dask_n)
        for w in (1, 2):
            rates["dask convert_sharded, %d worker processes" % w], \
                seconds["dask LocalCluster start-up, %d workers (s)" % w] = _dask_rate(
                    dvoc, os.path.join(workdir, "dask-out", "d.rec"), dask_n, w, shards)
    return _report(say, rates, seconds, workers, n)


#: The row of the parent's CPU per item (milliseconds) with N workers.
MAIN_CPU = "parent CPU per item, pass-through, %d workers (ms)"


def _scaled(rates: dict, n: int):
    """The 1-worker conversion rate times the floor's own N/1 scaling (what the N-worker rate
    is divided by in the scaling row), or the missing row's name when one is missing."""
    need = ("convert pass-through, 1 workers", "decode floor, 1 processes",
            "decode floor, %d processes" % n)
    for k in need:
        if k not in rates:
            return k
    return rates[need[0]] * rates[need[2]] / rates[need[1]]


def _marginal_scaling(rates: dict, seconds: dict, n: int, items: int) -> Optional[float]:
    """The 1 -> ``n`` worker scaling of the pass-through conversion of ``items`` pairs with
    each run's fixed cost (its 10-pair run's seconds) subtracted from its time, over the
    floor's own scaling. ``None`` when a row is missing, for fewer than 200 pairs (the
    10-pair run is then too large a part of the run to subtract), or when a fixed cost is
    not below its run's time.

    >>> rates = {"convert pass-through, 1 workers": 400.0,
    ...          "convert pass-through, 2 workers": 600.0,
    ...          "decode floor, 1 processes": 1000.0, "decode floor, 2 processes": 2000.0}
    >>> seconds = {"convert 10 pairs, 1 workers (s)": 0.0,
    ...            "convert 10 pairs, 2 workers (s)": 0.5}
    >>> _marginal_scaling(rates, seconds, 2, 1200)   # 3 s / (2 s - 0.5 s), over 2
    1.0
    """
    keys = ("convert pass-through, 1 workers", "convert pass-through, %d workers" % n,
            "decode floor, 1 processes", "decode floor, %d processes" % n)
    fixed = ("convert 10 pairs, 1 workers (s)", "convert 10 pairs, %d workers (s)" % n)
    if (n < 2 or items < 200 or any(k not in rates for k in keys)
            or any(k not in seconds for k in fixed)):
        return None
    t1, tn = (items / rates[keys[0]] - seconds[fixed[0]],
              items / rates[keys[1]] - seconds[fixed[1]])
    if t1 <= 0 or tn <= 0:
        return None
    return (t1 / tn) / (rates[keys[3]] / rates[keys[2]])


def _report(say, rates: dict, seconds: dict, workers: int, items: int) -> dict:
    say("")
    say("%-56s %12s" % ("measurement (items/s; seconds where marked)", "value"))
    for k, v in list(rates.items()) + list(seconds.items()):
        say("%-56s %12.2f" % (k, v))
    say("")
    n = workers
    ratios = [
        ("convert pass-through: %d / 1 workers" % n, "convert pass-through, %d workers" % n,
         "convert pass-through, 1 workers", 0.9 * n if n > 1 else None),
        ("convert pass-through %d workers / decode floor %d" % (n, n),
         "convert pass-through, %d workers" % n, "decode floor, %d processes" % n, 0.8),
        ("convert pass-through 1 worker / decode floor 1", "convert pass-through, 1 workers",
         "decode floor, 1 processes", 0.5),
        # the rows: per item at least half the floor's rate, and scaling from 1 to
        # N workers at least 0.9 of the floor's own scaling from 1 to N processes
        ("convert pass-through %d workers / decode floor %d (>= 0.5)" % (n, n),
         "convert pass-through, %d workers" % n, "decode floor, %d processes" % n, 0.5),
        ("convert %d/1 scaling / decode floor %d/1 scaling" % (n, n),
         "convert pass-through, %d workers" % n, _scaled(rates, n), 0.9 if n > 1 else None),
        ("convert re-encode: %d / 1 workers" % n, "convert re-encode, %d workers" % n,
         "convert re-encode, 1 workers", 0.9 * n if n > 1 else None),
        ("convert re-encode %d workers / im2rec %d threads" % (n, n),
         "convert re-encode, %d workers" % n, "im2rec re-encode, %d threads" % n, 1.0),
        ("dask convert_sharded: 2 / 1 worker processes",
         "dask convert_sharded, 2 worker processes", "dask convert_sharded, 1 worker processes",
         1.7),
    ]
    table = bench_common._ratio_table(ratios, rates, say)
    marginal = _marginal_scaling(rates, seconds, n, items)
    if marginal is not None:
        # what a long conversion approaches: each run's fixed cost (the 10-pair run: the pool
        # started, the output published) taken out of its time; no target, beside the above
        bench_common._ratio_row(table, say, "convert %d/1 scaling without the fixed cost / "
                                "floor's" % n, marginal, None)
    ms = seconds.get(MAIN_CPU % n)
    if ms and "convert pass-through, 1 workers" in rates:
        # the row: the parent is not the bottleneck below 64 workers
        bench_common._ratio_row(table, say, "parent CPU per converted item (ms)", ms, 0.1,
                         lower=True)
        # one worker spends 1 / rate per item; the parent keeps up with that many of them
        bench_common._ratio_row(table, say, "workers the parent can serve (1-worker time / its CPU)",
                         1e3 / rates["convert pass-through, 1 workers"] / ms, None)
    return {"rates": rates, "ratios": table, "seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="bench-data-convert", help="dataset and outputs")
    p.add_argument("--images", type=int, default=2400)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dask-images", type=int, default=-1,
                   help="images of the Dask rows (-1: --images; 0: none)")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure the floor and conversion rows this many times, interleaved, "
                        "and keep the best of each (a shared machine)")
    a = p.parse_args(argv)
    run_convert_bench(a.workdir, a.images, a.workers, dask_items=a.dask_images,
                      repeat=a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
