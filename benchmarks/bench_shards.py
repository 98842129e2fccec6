#!/usr/bin/env python
"""Sharded conversion and reading: Dask (1 and 2 workers) vs the local pool, sharded vs
single-file reads; same data, one run, ratios printed.

    python benchmarks/bench_shards.py                  # ~1 min on 2 busy cores
    python benchmarks/bench_shards.py --images 2000 --shards 16

Conversion: the same ``--shards`` plan run by ``--engine local`` with 1 and 2 processes and
by ``--engine dask`` on a LocalCluster of 1 and 2 single-threaded worker processes (started
before the clock, as a running cluster would be; its start-up is printed apart). Every
output is checked byte-identical to the first. Reading: every record of the sharded store
and of the single ``.rec`` (the same payloads), in a shuffled order and sequentially (scan),
and samples through ``ImageRecordDataset`` (CRC check + JPEG decode) opened on the manifest and
on the single file; rounds interleaved, best round of each.
"""
import argparse
import filecmp
import os
import random
import tempfile
import time


def _same(a, b):
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    return fa == fb and all(filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)
                            for f in fa)


def _read_rate(store, order, rounds):
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for i in order:
            store.view(i)
        best = min(best, time.perf_counter() - t)
    return len(order) / best


def _dataset_rate(ds, order, rounds):
    """Samples/s of a classification dataset (read, check the CRC, decode the image)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for i in order:
            ds[i]
        best = min(best, time.perf_counter() - t)
    return len(order) / best


def _scan_rate(store, rounds):
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        n = sum(1 for _ in store.scan())
        best = min(best, time.perf_counter() - t)
    return n / best


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5, help="read rounds (best of)")
    ap.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    a = ap.parse_args()
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
        run(a, a.workdir)
    else:
        with tempfile.TemporaryDirectory() as d:
            run(a, d)


def run(a, d):
    import dask.distributed as dd

    from gluon_data import ImageRecordDataset
    from gluon_data import convert
    from gluon_data.stores.recordio import RecordFile
    from gluon_data.convert.sample import make_imagefolder
    from gluon_data.stores.shardstore import ShardedStore
    from gluon_data.convert.sharded import convert_sharded

    root = make_imagefolder(os.path.join(d, "src"), per_class=max(1, a.images // 3),
                            size_range=(200, 280))
    n = 3 * max(1, a.images // 3)
    opts = dict(shards=a.shards, encoding="jpg", quality=90)  # decode + re-encode per item
    print("%d images, %d shards, re-encoded as JPEG" % (n, a.shards))
    times, outs = {}, {}
    for label, kw in (("local pool, 1 process", dict(engine="local", workers=1)),
                      ("local pool, 2 processes", dict(engine="local", workers=2))):
        out = os.path.join(d, label.replace(" ", "_").replace(",", ""))
        t = time.perf_counter()
        convert_sharded(root, os.path.join(out, "c.rec"), "imagefolder", **opts, **kw)
        times[label], outs[label] = time.perf_counter() - t, out
    for workers in (1, 2):
        label = "dask, %d worker%s" % (workers, "s" if workers > 1 else "")
        t = time.perf_counter()
        cluster = dd.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None)
        start = time.perf_counter() - t
        try:
            out = os.path.join(d, "dask%d" % workers)
            t = time.perf_counter()
            convert_sharded(root, os.path.join(out, "c.rec"), "imagefolder", engine="dask",
                            scheduler=cluster.scheduler_address, **opts)
            times[label], outs[label] = time.perf_counter() - t, out
        finally:
            cluster.close()
        print("  (LocalCluster of %d start-up: %.1f s, not counted)" % (workers, start))
    first = outs["local pool, 1 process"]
    base = times["local pool, 1 process"]
    print("\nconversion                 seconds   items/s   vs local pool (1 process)  identical")
    for label, s in times.items():
        print("%-26s %7.2f %9.0f %12.2fx %20s" % (label, s, n / s, base / s,
                                                  _same(first, outs[label])))
    print("dask 2 workers / dask 1 worker: %.2fx; dask 2 workers / local pool 2 processes: "
          "%.2fx" % (times["dask, 1 worker"] / times["dask, 2 workers"],
                     times["local pool, 2 processes"] / times["dask, 2 workers"]))

    single = os.path.join(d, "single.rec")
    convert(root, single, "imagefolder", encoding="jpg", quality=90)
    one = RecordFile(single)
    sharded = ShardedStore(os.path.join(first, "c.shards.json"))
    assert [sharded.read(i) for i in range(n)] == [one.read(i) for i in range(n)]
    order = list(range(n))
    random.Random(0).shuffle(order)
    datasets = {"single": ImageRecordDataset(single),
                "sharded": ImageRecordDataset(sharded.location)}
    rates = {"single": [0.0, 0.0, 0.0], "sharded": [0.0, 0.0, 0.0]}
    for _ in range(3):  # interleaved: both see the same machine load
        for name, store in (("single", one), ("sharded", sharded)):
            rates[name][0] = max(rates[name][0], _read_rate(store, order, a.rounds))
            rates[name][1] = max(rates[name][1], _scan_rate(store, a.rounds))
            rates[name][2] = max(rates[name][2], _dataset_rate(datasets[name], order[:400], 2))
    print("\nreading (records/s)        single .rec   %d shards   sharded / single" % a.shards)
    for k, what in enumerate(("shuffled view(i)", "sequential scan()",
                              "ImageRecordDataset[i]")):
        print("%-26s %11.0f %11.0f %14.2fx" % (what, rates["single"][k], rates["sharded"][k],
                                             rates["sharded"][k] / rates["single"][k]))


if __name__ == "__main__":
    main()
