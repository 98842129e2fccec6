"""``gluon-data bench --only segmentation``: segmentation ``train`` against the decode limit,
with the CPU time per item of every process. Imported by the harness as module
``bench_seg`` (its folder is on ``sys.path``)."""
from __future__ import annotations

import os
import sys
import time

from bench_common import (
    _cpu_s, _decode_pairs, _forked_decode_rate, _forked_rate, _seg_train_kw, decode_limit_decoders,
    make_dataset)


def _pipeline_share(dataset, batchify, k, workers, barrier, done):  # pragma: no cover - child
    idx = list(range(k, len(dataset), workers))
    batchify([dataset[i] for i in idx[:16]])  # warm: pools, libraries, the staging plan
    barrier.wait()
    c0 = time.process_time()
    for s in range(0, len(idx), 16):
        batchify([dataset[i] for i in idx[s:s + 16]])
    done.put((len(idx), time.process_time() - c0))


def seg_bench(workdir: str, n: int = 400, workers: int = 2, rounds: int = 4,
              out=sys.stdout) -> dict:
    """Only segmentation ``train`` against the decode limit (``--only segmentation``), in interleaved
    rounds (best of each): the limit (1 and N forked processes), ours ``.rec`` ``train``
    through ``DataLoader(batch_size=16, num_workers=N)`` and ``num_workers=0``, and the same
    dataset + batchify in N forked processes without a DataLoader. Besides items/s it reports
    the CPU time per item of every process involved (the DataLoader's main process
    included): on a shared machine the rates move with the load, the CPU per item much less.
    Returns ``{"rates", "cpu_ms", "ratios"}``."""
    import mxnet as mx

    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.convert import convert
    from gluon_data.gluon.datasets import SegmentationRecordDataset

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    voc = make_dataset(workdir, n)
    rec = os.path.join(workdir, "voc.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = [(open(os.path.join(jpg_dir, f), "rb").read(),
              open(os.path.join(png_dir, f[:-4] + ".png"), "rb").read())
             for f in sorted(os.listdir(jpg_dir))]
    ds = SegmentationRecordDataset(rec, seed=0, **_seg_train_kw())
    batchify = SegmentationBatchify(channels_first=True)
    rates, cpu = {}, {}
    lim1, limn = "decode limit, 1 process", "decode limit, %d processes" % workers
    nodl = "ours .rec train, dataset + batchify, %d processes, no DataLoader" % workers
    ours, ours0 = "ours .rec train, DataLoader, %d workers" % workers, \
        "ours .rec train, DataLoader, 0 workers"

    def best(key, rate, cpu_per_item):
        rates[key] = max(rates.get(key, 0.0), rate)
        cpu[key] = min(cpu.get(key, float("inf")), cpu_per_item * 1e3)

    loaders = {k: mx.gluon.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=w,
                                           batchify_fn=batchify, last_batch="keep")
               for k, w in ((ours, workers), (ours0, 0))}
    for loader in loaders.values():
        for _ in loader:  # workers started, pools and plans warm
            pass
    say("decode limit: the fastest decoders on these files: %s" % decode_limit_decoders(pairs))
    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        seen = _decode_pairs(pairs)
        best(lim1, seen / (time.perf_counter() - t0), (time.process_time() - c0) / seen)
        t = []
        r = _forked_decode_rate(pairs, workers, t)
        best(limn, r, t[0])
        t = []
        r = _forked_rate(_pipeline_share, (ds, batchify), workers, t)
        best(nodl, r, t[0])
        for key, loader in loaders.items():
            pids = [p.pid for p in loader._worker_pool._pool] if loader._num_workers else []
            w0 = [_cpu_s(p) for p in pids]
            c0, t0, seen = time.process_time(), time.perf_counter(), 0
            for batch in loader:
                seen += batch[0].shape[0]
            elapsed = time.perf_counter() - t0
            spent = time.process_time() - c0 + sum(_cpu_s(p) - c for p, c in zip(pids, w0))
            best(key, seen / elapsed, spent / seen)
    say("%-64s %8s %8s" % ("measurement", "items/s", "CPU ms"))
    for k in (lim1, limn, nodl, ours, ours0):
        say("%-64s %8.0f %8.3f" % (k, rates[k], cpu[k]))
    ratios = {"ours .rec train / decode limit N (items/s)": rates[ours] / rates[limn],
              "ours .rec train / decode limit N (CPU per item, inverse)": cpu[limn] / cpu[ours],
              "DataLoader / no DataLoader (CPU per item, inverse)": cpu[nodl] / cpu[ours],
              "ours .rec train, 0 workers / decode limit 1 (CPU per item, inverse)":
                  cpu[lim1] / cpu[ours0]}
    say("")
    for k, v in ratios.items():
        say("%-64s %8.2f" % (k, v))
    return {"rates": rates, "cpu_ms": cpu, "ratios": ratios}


def _dataset_share(ds, k, workers, barrier, done):  # pragma: no cover - forked child
    idx = list(range(k, len(ds), workers))
    for i in idx[:4]:  # warm: libraries, threads
        ds[i]
    barrier.wait()
    c0 = time.process_time()
    for i in idx:
        ds[i]
    done.put((len(idx), time.process_time() - c0))


def budget_bench(workdir: str, n: int = 200, workers: int = 2, rounds: int = 3, large=False,
                 out=sys.stdout, **options) -> dict:
    """The reading budget of framework-free segmentation ``train`` (no DataLoader, no MXNet):
    ``arrays.SegmentationDataset(mode='train', output='uint8', **options)`` at VOC size
    (``base_size=520, crop_size=480``) or, with ``large``, on 2048x1024 frames
    (``base_size=1024, crop_size=768``), against the decode limit of the same items (JPEG +
    PNG mask, the fastest decoders on the files), in interleaved rounds (best of each), each
    in forked worker processes (the dataset's worker set-up on, the same allocator policy
    for the limit's): the CPU per item of 1 worker, and items/s of ``workers``. Returns
    ``{"rates", "cpu_ms", "ratios"}``."""
    from gluon_data.arrays import SegmentationDataset
    from gluon_data.convert import convert

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    if large:
        from bench_large import large_root, make_large  # (the large set's maker, on demand)
        voc, kw = make_large(large_root(workdir, n), n), dict(base_size=1024, crop_size=768)
    else:
        voc, kw = make_dataset(workdir, n), dict(base_size=520, crop_size=480)
    rec = os.path.join(os.path.dirname(voc), "budget.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = [(open(os.path.join(jpg_dir, f), "rb").read(),
              open(os.path.join(png_dir, f[:-4] + ".png"), "rb").read())
             for f in sorted(os.listdir(jpg_dir))]
    ds = SegmentationDataset(rec, mode="train", seed=0, output="uint8", **kw, **options)
    say("decode limit: the fastest decoders on these files: %s" % decode_limit_decoders(pairs))
    rates, cpu = {}, {}

    def best(key, rate, cpu_per_item):
        rates[key] = max(rates.get(key, 0.0), rate)
        cpu[key] = min(cpu.get(key, float("inf")), cpu_per_item * 1e3)

    for i in range(min(8, len(ds))):
        ds[i]
    for _ in range(rounds):  # each in worker processes (forked), as a loader reads
        for n, tag in ((1, "1"), (workers, "N")):
            t = []
            best("limit " + tag, _forked_decode_rate(pairs, n, t), t[0])
            t = []
            best("ours " + tag, _forked_rate(_dataset_share, (ds,), n, t), t[0])
    for k in ("limit 1", "ours 1", "limit N", "ours N"):
        say("%-10s %8.0f items/s %8.3f CPU ms/item" % (k, rates[k], cpu[k]))
    ratios = {"1 worker: limit CPU / ours CPU per item": cpu["limit 1"] / cpu["ours 1"],
              "%d processes: ours / limit items/s" % workers: rates["ours N"] / rates["limit N"]}
    for k, v in ratios.items():
        say("%-44s %6.2f" % (k, v))
    return {"rates": rates, "cpu_ms": cpu, "ratios": ratios}


if __name__ == "__main__":  # python benchmarks/bench_seg.py [--large] [--mask-dtype uint8]
    # (the reading budget alone; the full comparison is gluon-data bench --only segmentation)
    import argparse
    ap = argparse.ArgumentParser(description=budget_bench.__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--large", action="store_true")
    ap.add_argument("--mask-dtype", default=None)
    a = ap.parse_args()
    options = {"mask_dtype": a.mask_dtype} if a.mask_dtype else {}
    if a.mask_dtype == "uint8":
        options["ignore_value"] = 255  # uint8 cannot hold -1
    budget_bench(a.workdir, a.images, a.workers, a.rounds, a.large, **options)
