#!/usr/bin/env python
"""Feeding a busy training loop, on the CPU: ``python benchmarks/bench_feed.py [--workers 2]``.

A torch ``DataLoader`` (batch 16, persistent workers, prefetch 2) feeds a consumer that stands
in for a GPU training loop: per batch it holds the GIL for ``--spin`` ms (a training step's
Python work: kernel launches, the optimizer's bookkeeping), copies the batch once (``--touch``,
what pinning and the host-to-device copy read) and sleeps ``--sleep`` ms (waiting on the
device, the GIL released). For each dataset it measures, on the same persistent workers and
interleaved round by round, the items/s standalone and under the consumer, and the share
delivered: under the consumer / min(standalone, what the consumer takes at most).

The datasets (``segmentation train``: ``base_size=520, crop_size=480``, uint8 CHW images):

* ``ours``: ``gluon_data.arrays.SegmentationDataset(mode='train', output='uint8')`` on a
  ``.rec``, as shipped (int32 masks; in a worker the dataset runs OpenCV sequentially);
* ``ours, uint8 masks`` / ``ours, OpenCV sequential`` / ``ours, both``: the two worker-side
  changes, emulated here (the mask cast in the worker; ``cv2.setNumThreads(0)`` in a
  ``worker_init_fn``);
* ``ours, mask_dtype='uint8'``: the dataset's own option, where this version has it;
* ``ours, uint8, workers niced``: the same with each worker at a lower CPU priority than the
  consumer (``os.nice(10)`` in a ``worker_init_fn``), so that where the cores are all busy
  the consumer is served first;
* ``ours, uint8, batch ring``: the same collated by ``gluon_data.arrays.BatchRing`` (each
  worker's batches in shared memory it reuses, not a new segment per batch), where this
  version has it; ``free, uint8, batch ring`` is its ceiling;
* ``files``: a PIL + numpy loader of the JPEG and PNG files, written as torchvision's
  segmentation reference does (random resize 0.5-2.0 of 520, pad, crop 480, flip; uint8 masks);
* ``burn``: a control that spins ours' in-process CPU per item and returns zeros of ours'
  shapes and types (``burn, uint8 masks``: the same with 1-byte masks);
* ``free`` / ``free, uint8 masks``: zeros of those shapes and types made at no cost: what
  the consumer takes at most of batches of that size, the main process's own share of each
  batch (receiving it, mapping its shared memory, the copy) included. A loader can deliver
  no more than this ceiling, whatever its speed; each row's ``of ceil.`` is its rate under
  the consumer over min(its standalone rate, the ceiling of batches of its size).

Beside the rates it reads, per dataset, what each candidate cause costs: the main process's
CPU per batch standalone (receiving, unpickling, mapping the shared memory), the workers' CPU
per item they read, split into the dataset's own ``__getitem__`` (the reading thread's CPU)
and the rest (the loader's part: collating the batch into shared memory, sending it, its
loop), their thread count, their read/write syscalls per item (``/proc/<pid>/io``), and
their involuntary context switches per item. Each measurement starts after as many batches
as the workers may have read ahead, taken the same way, and counts no more items than the
workers read in it (:func:`delivered`). ``--json`` writes every figure, under the consumer
too.

Needs torch: it is imported from ``sys.path``, else from ``$GLUON_DATA_TORCH_PATH``. On a
shared machine compare the shares of one run, never absolute numbers across runs.
"""
from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

from bench_common import _cpu_s, make_dataset

try:
    from gluon_data.arrays import BatchRing
except ImportError:  # a version without it: its rows are left out
    BatchRing = None

BATCH = 16
BASE, CROP = 520, 480


def import_torch():
    """torch, from ``sys.path`` or else from ``$GLUON_DATA_TORCH_PATH`` (a folder torch was
    installed into apart from the MXNet environment); ImportError where neither has it."""
    try:
        import torch
    except ImportError:
        path = os.environ.get("GLUON_DATA_TORCH_PATH")
        if not path or not os.path.isdir(path):
            raise
        sys.path.append(path)
        import torch
    return torch


class FilePairs:
    """The plain loader: ``JPEGImages/<id>.jpg`` and ``SegmentationClass/<id>.png`` read with
    PIL per item, transformed as torchvision's segmentation reference does."""

    def __init__(self, voc: str, ids):
        self.voc, self.ids = voc, list(ids)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        from PIL import Image
        rng = np.random.default_rng(i)
        name = self.ids[i]
        img = Image.open(os.path.join(self.voc, "JPEGImages", name + ".jpg")).convert("RGB")
        mask = Image.open(os.path.join(self.voc, "SegmentationClass", name + ".png"))
        w, h = img.size
        r = int(BASE * rng.uniform(0.5, 2.0)) / max(w, h)
        size = (max(1, int(w * r)), max(1, int(h * r)))
        a = np.asarray(img.resize(size, Image.BILINEAR))
        b = np.asarray(mask.resize(size, Image.NEAREST))
        ph, pw = max(0, CROP - b.shape[0]), max(0, CROP - b.shape[1])
        if ph or pw:
            a = np.pad(a, ((0, ph), (0, pw), (0, 0)))
            b = np.pad(b, ((0, ph), (0, pw)), constant_values=255)
        y = rng.integers(0, a.shape[0] - CROP + 1)
        x = rng.integers(0, a.shape[1] - CROP + 1)
        a, b = a[y:y + CROP, x:x + CROP], b[y:y + CROP, x:x + CROP]
        if rng.random() < 0.5:
            a, b = a[:, ::-1], b[:, ::-1]
        return np.ascontiguousarray(a.transpose(2, 0, 1)), np.ascontiguousarray(b)


class Burn:
    """The control: ``ms`` of CPU per item in the worker, zeros of ours' shapes out."""

    def __init__(self, n: int, ms: float, mask_dtype=np.int32):
        self.n, self.ms, self.mask_dtype = n, ms, mask_dtype

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        end = time.process_time() + self.ms / 1000
        while time.process_time() < end:
            pass
        return (np.zeros((3, CROP, CROP), np.uint8),
                np.zeros((CROP, CROP), self.mask_dtype))


class Timed:
    """``dataset`` with what its workers spend in its ``__getitem__`` summed in shared memory:
    ``tally[0]`` the CPU seconds of the reading thread (``time.thread_time``: the loader's
    other threads, its queue feeder among them, are not counted), ``tally[1]`` the items
    read. A worker's CPU per item then splits into the dataset's and the rest, the loader's
    own (collate into shared memory, send, its loop): a dataset that read on threads of its
    own would have their CPU counted as the loader's (ours reads on the calling thread).
    ``ctx``: the loader's multiprocessing context (the tally's lock must be of the context
    that starts the workers)."""

    def __init__(self, dataset, ctx):
        self.dataset = dataset
        self.tally = ctx.Array("d", 2)

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        c0 = time.thread_time()
        out = self.dataset[i]
        spent = time.thread_time() - c0
        with self.tally.get_lock():
            self.tally[0] += spent
            self.tally[1] += 1
        return out


def delivered(taken: float, read: float, seconds: float) -> float:
    """Items/s a loader delivered in a window of ``seconds``: the items the consumer took,
    but no more than the items the workers read in the window (``read``, counted by
    :class:`Timed`). A window that begins on batches read before it (the loader's read-ahead,
    refilled whenever the consumer was slower than the workers) takes more than was read in
    it; counting what was taken would credit the loader with those batches. A loader faster
    than its consumer waits on a full queue, so there ``read`` follows ``taken``."""
    return min(taken, read) / seconds


class CastMasks:
    """Ours with the masks cast to ``dtype`` in the worker (1 byte per label for uint8)."""

    def __init__(self, dataset, dtype=np.uint8):
        self.dataset, self.dtype = dataset, dtype

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        img, mask = self.dataset[i]
        return img, mask.astype(self.dtype)


def opencv_sequential(_worker_id=None):
    """A ``worker_init_fn``: OpenCV single-threaded in the worker. ``setNumThreads(0)`` (run
    sequentially, no pool): ``setNumThreads(1)`` rebuilds the pool, and in a process forked
    after the parent's pool ran and went idle it waits forever on the copied pool's state."""
    import cv2
    cv2.setNumThreads(0)


def niced(_worker_id=None):
    """A ``worker_init_fn``: the worker at 10 steps of niceness below the process that
    started it (a process cannot take that back)."""
    os.nice(10)


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def _proc(pid: int, name: str, keys) -> dict:
    try:
        with open("/proc/%d/%s" % (pid, name)) as f:
            rows = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:  # /proc/<pid>/io needs the same user; absent on some kernels
        return {}
    return {k: int(rows[k].split()[0]) for k in keys if k in rows}


def _worker_counters(pids) -> dict:
    """Summed over the worker processes: CPU seconds, read+write syscalls, involuntary
    context switches; and their thread count."""
    out = {"cpu": 0.0, "syscalls": 0, "preempted": 0, "threads": 0}
    for pid in pids:
        out["cpu"] += _cpu_s(pid)
        io = _proc(pid, "io", ("syscr", "syscw"))
        out["syscalls"] += io.get("syscr", 0) + io.get("syscw", 0)
        st = _proc(pid, "status", ("nonvoluntary_ctxt_switches", "Threads"))
        out["preempted"] += st.get("nonvoluntary_ctxt_switches", 0)
        out["threads"] += st.get("Threads", 0)
    return out


class Feed:
    """One dataset in a persistent torch DataLoader, measured standalone and under the
    consumer as often as asked, on the same workers."""

    def __init__(self, torch, dataset, workers: int, init=None, collate=None):
        ctx = multiprocessing.get_context()
        self.timed = Timed(dataset, ctx)
        self.loader = torch.utils.data.DataLoader(
            self.timed, batch_size=BATCH, shuffle=True, num_workers=workers, drop_last=True,
            persistent_workers=workers > 0, prefetch_factor=2 if workers else None,
            worker_init_fn=init, multiprocessing_context=ctx if workers else None,
            collate_fn=collate)
        self.ahead = 2 * workers  # the batches the workers may have read ahead
        self._it = self._forever()
        for _ in range(self.ahead + 2):  # start-up and the batches queued ahead
            next(self._it)
        workers_of = getattr(self.loader._iterator, "_workers", [])
        self.pids = [w.pid for w in workers_of]

    def _forever(self):
        while True:
            yield from self.loader

    def _step(self, spin_ms: float, sleep_ms: float, touch: bool) -> tuple:
        """One batch through the consumer: ``(items, its CPU seconds spun, batch bytes)``."""
        img, mask = next(self._it)
        if touch:  # a stand-in for pinning: every byte of the batch read and written once
            img.clone(), mask.clone()
        s0 = time.process_time()
        _spin(spin_ms)
        spun = time.process_time() - s0
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        return img.shape[0], spun, img.nbytes + mask.nbytes

    def rate(self, batches: int, spin_ms=0.0, sleep_ms=0.0, touch=False) -> dict:
        """Items/s delivered over ``batches`` batches (:func:`delivered`: what the consumer
        took, at most what the workers read in the window), after as many batches as the
        workers read ahead taken the same way; the main process's CPU ms per batch (its own
        work, the consumer's spin taken out) and the workers' counters per item they read in
        the window."""
        for _ in range(self.ahead):
            self._step(spin_ms, sleep_ms, touch)
        w0, c0, t0, n = _worker_counters(self.pids), time.process_time(), time.perf_counter(), 0
        d0, r0 = self.timed.tally[0], self.timed.tally[1]
        spun = 0.0
        for _ in range(batches):
            items, s, nbytes = self._step(spin_ms, sleep_ms, touch)
            n, spun = n + items, spun + s
        seconds = time.perf_counter() - t0
        read = self.timed.tally[1] - r0  # items the workers read in the window
        main_cpu = time.process_time() - c0 - spun
        w1 = _worker_counters(self.pids)
        per = (lambda v: v / read) if read and self.pids else (lambda v: float("nan"))
        worker, dataset = per(w1["cpu"] - w0["cpu"]), per(self.timed.tally[0] - d0)
        return {"items/s": delivered(n, read, seconds), "seconds": seconds,
                "items taken": n, "main ms/batch": 1000 * main_cpu / batches,
                "items read": read, "worker ms/item": 1000 * worker,
                "dataset ms/item": 1000 * dataset, "loader ms/item": 1000 * (worker - dataset),
                "syscalls/item": per(w1["syscalls"] - w0["syscalls"]),
                "preempted/item": per(w1["preempted"] - w0["preempted"]),
                "threads": w1["threads"], "batch bytes": nbytes}


def in_process_ms(dataset, n: int = 24) -> float:
    """CPU ms per item of ``dataset`` read in this process (after one warm-up item)."""
    dataset[0]
    c0 = time.process_time()
    for i in range(n):
        dataset[i % len(dataset)]
    return 1000 * (time.process_time() - c0) / n


def datasets(workdir: str, n: int, which=None) -> dict:
    """name -> (dataset, worker_init_fn) for every dataset this bench compares (``which``:
    only those names)."""
    from gluon_data.arrays import SegmentationDataset
    from gluon_data.convert import convert
    voc = make_dataset(workdir, n)
    rec = os.path.join(workdir, "voc.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    with open(os.path.join(voc, "ImageSets", "Segmentation", "train.txt")) as f:
        ids = [line.strip() for line in f if line.strip()]
    ours = SegmentationDataset(rec, mode="train", base_size=BASE, crop_size=CROP, seed=0,
                               output="uint8")
    burn_ms = 0.0
    if which is None or any(name.startswith("burn") for name in which):
        # read in a forked child: OpenCV's pool started in this process would make a worker
        # forked from it hang in cv2.setNumThreads (the pool's state copied, its threads not)
        with multiprocessing.get_context("fork").Pool(1) as pool:
            burn_ms = pool.apply(in_process_ms, (ours,))
    sets = {"ours": (ours, None),
            "ours, uint8 masks": (CastMasks(ours), None),
            "ours, OpenCV sequential": (ours, opencv_sequential),
            "ours, both": (CastMasks(ours), opencv_sequential),
            "files": (FilePairs(voc, ids), None),
            "burn": (Burn(len(ids), burn_ms), None),
            "burn, uint8 masks": (Burn(len(ids), burn_ms, np.uint8), None),
            "free": (Burn(len(ids), 0.0), None),
            "free, uint8 masks": (Burn(len(ids), 0.0, np.uint8), None)}
    if "mask_dtype" in inspect.signature(SegmentationDataset).parameters:  # the real option
        uint8 = SegmentationDataset(rec, mode="train", base_size=BASE, crop_size=CROP, seed=0,
                                    output="uint8", mask_dtype="uint8",
                                    ignore_value=255)  # (uint8 cannot hold -1)
        sets["ours, mask_dtype='uint8'"] = (uint8, None)
        sets["ours, uint8, workers niced"] = (uint8, niced)
        if BatchRing is not None:  # (a version with it has the option too)
            sets["ours, uint8, batch ring"] = (uint8, None)
            sets["free, uint8, batch ring"] = (Burn(len(ids), 0.0, np.uint8), None)
    return {k: v for k, v in sets.items() if which is None or k in which}


def collate_for(name: str):
    """The ``collate_fn`` of the dataset ``name``: :class:`BatchRing` for the rows that say
    so, else the default."""
    return BatchRing() if name.endswith("batch ring") else None


def run_feed(workdir: str, n: int = 240, workers: int = 2, rounds: int = 3, batches: int = 30,
             spin_ms: float = 3.0, sleep_ms: float = 27.0, touch: bool = True, which=None,
             out=sys.stdout) -> dict:
    """Every dataset standalone and under the consumer, ``rounds`` times interleaved; the
    medians, and each one's share: under the consumer / min(standalone, consumer's cap)."""
    torch = import_torch()
    torch.set_num_threads(1)  # the consumer's own copies: one thread, as a training loop's
    sets = datasets(workdir, n, which)
    feeds = {name: Feed(torch, ds, workers, init, collate_for(name))
             for name, (ds, init) in sets.items()}
    cap = 1000.0 * BATCH / (spin_ms + sleep_ms) if spin_ms + sleep_ms else float("inf")
    got = {name: {"alone": [], "busy": []} for name in feeds}
    for _ in range(rounds):
        for name, feed in feeds.items():
            got[name]["alone"].append(feed.rate(batches, touch=touch))
            got[name]["busy"].append(feed.rate(batches, spin_ms, sleep_ms, touch))
    res = {"workers": workers, "spin ms": spin_ms, "sleep ms": sleep_ms, "touch": touch,
           "consumer cap items/s": cap, "cpus": os.cpu_count(), "rows": {}}
    print("consumer: %.1f ms holding the GIL + %.1f ms asleep per batch of %d%s (takes at "
          "most %.0f items/s); %d workers, %d rounds, medians" % (
              spin_ms, sleep_ms, BATCH, ", the batch copied once" if touch else "", cap,
              workers, rounds), file=out)
    print("%-26s %9s %9s %6s %8s %9s %9s %9s %9s %9s %7s %9s %8s" % (
        "dataset", "alone/s", "busy/s", "share", "of ceil.", "main ms/b", "wkr ms/it",
        "dataset", "loader",
        "busy wkr", "threads", "sysc/item", "preempt"), file=out)
    # (batch bytes, collated by the ring) -> the free control's rate under the consumer, per
    # round
    ceilings = {}
    for name, runs in got.items():
        if name.startswith("free"):
            ceilings[runs["busy"][0]["batch bytes"], name.endswith("batch ring")] = [
                b["items/s"] for b in runs["busy"]]
    for name, runs in got.items():
        row = {key: statistics.median(r[key] for r in runs["alone"]) for key in runs["alone"][0]}
        row["busy"] = {key: statistics.median(r[key] for r in runs["busy"])
                       for key in runs["busy"][0]}
        row["busy items/s"] = row["busy"]["items/s"]
        row["busy preempted/item"] = row["busy"]["preempted/item"]
        row["share"] = statistics.median(b["items/s"] / min(a["items/s"], cap)
                                         for a, b in zip(runs["alone"], runs["busy"]))
        ceiling = ceilings.get((runs["busy"][0]["batch bytes"], name.endswith("batch ring")))
        row["share of ceiling"] = float("nan") if ceiling is None else statistics.median(
            b["items/s"] / min(a["items/s"], c)
            for a, b, c in zip(runs["alone"], runs["busy"], ceiling))
        res["rows"][name] = row
        print("%-26s %9.0f %9.0f %6.2f %8.2f %9.2f %9.2f %9.2f %9.2f %9.2f %7d %9.1f %8.2f" % (
            name, row["items/s"], row["busy items/s"], row["share"], row["share of ceiling"],
            row["main ms/batch"],
            row["worker ms/item"], row["dataset ms/item"], row["loader ms/item"],
            row["busy"]["worker ms/item"], row["threads"], row["syscalls/item"],
            row["busy preempted/item"]), file=out, flush=True)
    del feeds
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=240)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--spin", type=float, default=3.0, help="ms holding the GIL per batch")
    ap.add_argument("--sleep", type=float, default=27.0, help="ms asleep per batch")
    ap.add_argument("--no-touch", action="store_true", help="do not copy each batch once")
    ap.add_argument("--only", action="append", help="a dataset's name (repeatable)")
    ap.add_argument("--workdir", default=os.path.join("bench-data", "feed"))
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    res = run_feed(a.workdir, a.images, a.workers, a.rounds, a.batches, a.spin, a.sleep,
                   not a.no_touch, a.only)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
