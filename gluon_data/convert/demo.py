"""``gluon-data demo`` without MXNet: generate a VOC-like sample, pack it, and read it back as
numpy arrays (:class:`gluon_data.arrays.SegmentationDataset`) in the converter's pool of
worker processes.

The Gluon demo (:mod:`gluon_data.gluon.demo`) reads the same file through Gluon's
``DataLoader``; the command line runs that one where MXNet is importable, this one elsewhere.
It lives at the converters' layer because it converts (the layers import downwards only).
Each worker opens the dataset itself (its own file handle, reads by ``pread``) and sends the
decoded samples back, as a data loader's workers do.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple, cast

import numpy as np

from ..arrays import SegmentationDataset
from .driver import convert
from .engines import worker_pool
from .sample import make_voc

__all__ = ["run_demo"]

#: the datasets a worker process has opened, by path (each worker opens its own)
_OPEN: Dict[str, SegmentationDataset] = {}


def _dataset(path: str) -> SegmentationDataset:
    ds = _OPEN.get(path)
    if ds is None:
        ds = _OPEN[path] = SegmentationDataset(path)
    return ds


def _read_batch(job: Tuple[str, Sequence[int]]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The samples ``indices`` of the dataset at ``path``, read in this (worker) process."""
    path, indices = job
    ds = _dataset(path)
    return [ds[int(i)] for i in indices]


def _describe_reader(workers: int) -> str:
    return ("%d worker processes" % workers if workers > 0 else "this process")


def pack_sample(workdir: str, num_images: int, workers: int, say) -> str:
    """Steps 1 and 2 of both demos: generate a VOC-like sample in ``workdir`` and pack it
    (train and val); returns the train ``.rec``."""
    voc = os.path.join(workdir, "VOCsample")
    say("1. generating a VOC-style sample of %d images in %s" % (num_images, voc))
    make_voc(voc, num_images=num_images, size_range=(96, 192))
    rec = os.path.join(workdir, "voc.rec")
    say("2. packing it: gluon-data convert %s %s --layout voc --split train,val --workers %d"
        % (voc, rec, workers))
    report = convert(voc, rec, "voc", split="train,val", workers=workers, overwrite=True)
    say("   " + str(report).replace("\n", "\n   "))
    return report.outputs["train"]


def run_demo(workdir: str, num_images: int = 96, workers: int = 2, batch_size: int = 8,
             epochs: int = 2, out=sys.stdout) -> dict:
    """Generate a VOC-like sample, pack it, and read it back through ``workers`` worker
    processes (in this process where ``workers`` is 0), ``epochs`` times in a random order.

    Returns ``{"records": N, "epochs": [{"samples": n, "seconds": s}, ...], "ok": bool}``:
    ``ok`` when every epoch read every record once, as in :mod:`gluon_data.gluon.demo`."""
    def say(*args):
        print(*args, file=out, flush=True)

    if batch_size < 1:
        raise ValueError("--batch-size must be at least 1, got %d" % batch_size)
    path = pack_sample(workdir, num_images, workers, say)
    ds = SegmentationDataset(path)
    say("3. reading %r (numpy arrays, no MXNet) in %s" % (ds, _describe_reader(workers)))
    result: Dict[str, Any] = {"records": len(ds), "epochs": []}
    rng = np.random.default_rng()
    with (worker_pool(workers, preload=_read_batch) if workers > 0
          else contextlib.nullcontext()) as pool:
        for epoch in range(epochs):
            order = rng.permutation(len(ds))
            jobs = [(path, order[i:i + batch_size].tolist())
                    for i in range(0, len(order), batch_size)]
            batches = (t.get() for t in [pool.submit(_read_batch, j) for j in jobs]) \
                if pool is not None else map(_read_batch, jobs)
            t0, seen, pixels = time.perf_counter(), 0, 0
            for batch in batches:
                seen += len(batch)
                pixels += sum(int((mask >= 0).sum()) for _, mask in batch)
            dt = time.perf_counter() - t0
            result["epochs"].append({"samples": seen, "seconds": dt})
            say("   epoch %d: %d samples in %d batches, %.0f samples/s, %d labelled pixels"
                % (epoch + 1, seen, len(jobs), seen / dt if dt > 0 else float("inf"), pixels))
    img, mask = ds[0]
    present = sorted(set(mask.ravel().tolist()) - {-1})
    classes = cast(List[str], ds.classes)  # the sample's (VOC's) classes
    say("4. sample 0: image %s %s, mask %s %s, classes %s"
        % (img.shape, img.dtype.name, mask.shape, mask.dtype.name,
           [classes[i] for i in present]))
    ok = all(e["samples"] == len(ds) for e in result["epochs"])
    say("%s: %d records read %d times through gluon_data.arrays in %s"
        % ("OK" if ok else "MISMATCH", len(ds), epochs, _describe_reader(workers)))
    result["ok"] = ok
    return result
