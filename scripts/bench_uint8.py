#!/usr/bin/env python
"""Segmentation ``train`` through ``DataLoader(num_workers=N)``: float32 samples vs
``output="uint8"`` samples + ``InputNormalize`` on each batch in the consumer, one run.

    python scripts/bench_uint8.py --num-images 200 --workers 2

Generates a VOC-like set (JPEG photos of 300-500 px, as ``gluon-data bench``), converts it
to a ``.rec`` and reads it in ``train`` mode (base 400, crop 320, seed 0) two ways, in
interleaved rounds (best of each): ``transform=ToTensor+Normalize`` (the numpy fast path,
float32 CxHxW in the workers) and ``output="uint8"`` with the batch normalised by
``InputNormalize`` (not hybridized: on CPU its table path) in the main process and waited
for; each batch is moved to the model's context (``as_in_context(mx.cpu())``: a copy out of
the shared segment) as a training loop does. The consumer's cost is counted: on a machine
without a GPU it runs on the same CPUs. A third line reads the uint8 samples without
normalising them: the workers' share alone, what a GPU consumer leaves to the device.
Prints items/s, CPU ms per item of every process (main process and workers)
and the ratios of the first two.
"""
import argparse
import os
import tempfile
import time

import mxnet as mx
from mxnet.gluon.data.vision import transforms

from gluon_data import DataLoader, InputNormalize, SegmentationBatchify, SegmentationRecordDataset
from gluon_data.cli import load_bench
from gluon_data.convert import convert

_bench = load_bench()
MEAN, STD = (.485, .456, .406), (.229, .224, .225)


def _epoch(loader, consume):
    """(items/s, CPU s per item of the main process and the workers) of one pass."""
    pids = [p.pid for p in loader._worker_pool._pool] if loader._num_workers else []
    w0 = [_bench._cpu_s(p) for p in pids]
    c0, t0, seen = time.process_time(), time.perf_counter(), 0
    for imgs, masks in loader:
        consume(imgs).wait_to_read()
        masks.wait_to_read()
        seen += imgs.shape[0]
    elapsed = time.perf_counter() - t0
    spent = time.process_time() - c0 + sum(_bench._cpu_s(p) - c for p, c in zip(pids, w0))
    return seen / elapsed, spent / seen


def run(workdir, n, workers, rounds, batch_size=16):
    voc = _bench.make_dataset(workdir, n)
    rec = os.path.join(workdir, "voc.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    kw = dict(seed=0, mode="train", base_size=400, crop_size=320)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    norm = InputNormalize(MEAN, STD)  # eager: a CPU batch takes the per-plane tables
    ctx = mx.cpu()
    ways = {
        "float32 samples (ToTensor+Normalize in the workers)":
            (SegmentationRecordDataset(rec, transform=tf, **kw),
             lambda b: b.as_in_context(ctx)),
        "uint8 samples + InputNormalize on the batch in the consumer":
            (SegmentationRecordDataset(rec, output="uint8", **kw),
             lambda b: norm(b.as_in_context(ctx))),
        "uint8 samples, not normalised (the workers' share alone)":
            (SegmentationRecordDataset(rec, output="uint8", **kw),
             lambda b: b.as_in_context(ctx)),
    }
    batchify = SegmentationBatchify(channels_first=True)
    loaders = {k: (DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                              batchify_fn=batchify, last_batch="keep"), consume)
               for k, (ds, consume) in ways.items()}
    for loader, consume in loaders.values():  # workers started, pools and plans warm
        _epoch(loader, consume)
    rate, cpu = {}, {}
    for _ in range(rounds):
        for k, (loader, consume) in loaders.items():
            r, c = _epoch(loader, consume)
            rate[k], cpu[k] = max(rate.get(k, 0.0), r), min(cpu.get(k, float("inf")), c * 1e3)
    print("%d images, train base 400 crop 320, batch %d, %d workers, best of %d rounds"
          % (n, batch_size, workers, rounds))
    print("%-62s %8s %8s" % ("measurement", "items/s", "CPU ms"))
    for k in ways:
        print("%-62s %8.0f %8.3f" % (k, rate[k], cpu[k]))
    f, u, _ = list(ways)
    print("%-62s %8.2f" % ("uint8 / float32 (items/s)", rate[u] / rate[f]))
    print("%-62s %8.2f" % ("uint8 / float32 (CPU per item, inverse)", cpu[f] / cpu[u]))
    return rate, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-images", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", help="keep the dataset here (default: a temporary folder)")
    a = ap.parse_args()
    if a.workdir:
        run(a.workdir, a.num_images, a.workers, a.rounds)
    else:
        with tempfile.TemporaryDirectory() as d:
            run(d, a.num_images, a.workers, a.rounds)


if __name__ == "__main__":
    main()
