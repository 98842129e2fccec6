#!/usr/bin/env python
"""Segmentation ``train`` through ``DataLoader(num_workers=N)``: float32 samples vs
``output="uint8"`` samples + ``InputNormalize`` on each batch in the consumer, one run.

    python benchmarks/bench_uint8.py --num-images 200 --workers 2

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
and the ratios of the first two. ``gluon-data bench`` runs :func:`rows` on its own ``.rec``.
"""
import argparse
import os
import sys
import tempfile
import time

import mxnet as mx
import numpy as np
from mxnet.gluon.data.vision import transforms

from gluon_data import DataLoader, InputNormalize, SegmentationBatchify, SegmentationRecordDataset
from gluon_data.convert import convert

from bench_common import _cpu_s, make_dataset

MEAN, STD = (.485, .456, .406), (.229, .224, .225)
FLOAT = "float32 samples (ToTensor+Normalize in the workers)"
UINT8 = "uint8 samples + InputNormalize on the batch in the consumer"
BARE = "uint8 samples, not normalised (the workers' share alone)"
#: (name, numerator row, denominator row, target) of the items/s rows, and of the CPU ms per
#: item rows (inverted: higher is cheaper). No target: without a GPU the consumer's
#: normalisation runs on the same CPUs, so the two paths come out about even.
RATIOS = (("uint8 + InputNormalize / float32 (items/s)", UINT8, FLOAT, None),)
CPU_RATIOS = (("uint8 + InputNormalize / float32 (CPU per item, inverse)", FLOAT, UINT8, None),)


class _Subset:
    """A sampler: ``limit`` of ``n`` positions (fixed), in a new random order every epoch."""

    def __init__(self, n: int, limit: int, seed: int = 0):
        self._rng = np.random.default_rng(seed)
        self._keep = self._rng.permutation(n)[:limit]

    def __len__(self):
        return len(self._keep)

    def __iter__(self):
        return iter(int(i) for i in self._rng.permutation(self._keep))


def _epoch(loader, consume):
    """(items/s, CPU s per item of the main process and the workers) of one pass."""
    pids = [p.pid for p in loader._worker_pool._pool] if loader._num_workers else []
    w0 = [_cpu_s(p) for p in pids]
    c0, t0, seen = time.process_time(), time.perf_counter(), 0
    for imgs, masks in loader:
        consume(imgs).wait_to_read()
        masks.wait_to_read()
        seen += imgs.shape[0]
    elapsed = time.perf_counter() - t0
    spent = time.process_time() - c0 + sum(_cpu_s(p) - c for p, c in zip(pids, w0))
    return seen / elapsed, spent / seen


def rows(rec: str, workers: int, rounds: int, limit: int = 0, batch_size: int = 16,
         out=sys.stdout):
    """``(items/s, CPU ms per item)`` dicts of the three ways of reading ``rec`` (a VOC
    ``.rec``), best of ``rounds`` interleaved rounds after a warm-up epoch each; ``limit``
    > 0 reads that many records per epoch (a fixed random subset, reshuffled every epoch)."""
    kw = dict(seed=0, mode="train", base_size=400, crop_size=320)
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    norm = InputNormalize(MEAN, STD)  # eager: a CPU batch takes the per-plane tables
    ctx = mx.cpu()
    ways = {FLOAT: (SegmentationRecordDataset(rec, transform=tf, **kw),
                    lambda b: b.as_in_context(ctx)),
            UINT8: (SegmentationRecordDataset(rec, output="uint8", **kw),
                    lambda b: norm(b.as_in_context(ctx))),
            BARE: (SegmentationRecordDataset(rec, output="uint8", **kw),
                   lambda b: b.as_in_context(ctx))}
    batchify = SegmentationBatchify(channels_first=True)
    loaders = {}
    for k, (ds, consume) in ways.items():
        order = dict(sampler=_Subset(len(ds), limit)) if 0 < limit < len(ds) else \
            dict(shuffle=True)
        loaders[k] = (DataLoader(ds, batch_size=batch_size, num_workers=workers,
                                 batchify_fn=batchify, last_batch="keep", **order), consume)
    for loader, consume in loaders.values():  # workers started, pools and plans warm
        _epoch(loader, consume)
    rate, cpu = {}, {}
    for _ in range(rounds):
        for k, (loader, consume) in loaders.items():
            r, c = _epoch(loader, consume)
            rate[k], cpu[k] = max(rate.get(k, 0.0), r), min(cpu.get(k, float("inf")), c * 1e3)
    print("%-62s %8s %8s" % ("measurement", "items/s", "CPU ms"), file=out)
    for k in ways:
        print("%-62s %8.0f %8.3f" % (k, rate[k], cpu[k]), file=out)
    return rate, cpu


def run(workdir, n, workers, rounds, batch_size=16, out=sys.stdout):
    """The dataset made (or reused) in ``workdir`` and packed, then :func:`rows` and the
    ratios printed."""
    voc = make_dataset(workdir, n)
    rec = os.path.join(workdir, "voc.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    print("%d images, train base 400 crop 320, batch %d, %d workers, best of %d rounds"
          % (n, batch_size, workers, rounds), file=out)
    rate, cpu = rows(rec, workers, rounds, batch_size=batch_size, out=out)
    for (name, a, b, _), values in ((RATIOS[0], rate), (CPU_RATIOS[0], cpu)):
        print("%-62s %8.2f" % (name, values[a] / values[b]), file=out)
    return rate, cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-images", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", help="keep the dataset here (default: a temporary folder)")
    a = ap.parse_args(argv)
    if a.workdir:
        run(a.workdir, a.num_images, a.workers, a.rounds)
    else:
        with tempfile.TemporaryDirectory() as d:
            run(d, a.num_images, a.workers, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
