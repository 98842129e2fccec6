"""LMDB against RecordIO, cold, on a slow device: the same records read by the same loader
(``gluon_data.DataLoader``, which hints every batch; payloads not decoded, so the reads are
what is timed) from a ``.rec`` and from an LMDB on an ext4 loop device that serves at most
``iops`` read requests a second (the kernel's blkio throttle: at 200, each request costs the
device 5 ms) and merges no requests (``nomerges=2``, as a bio-based device such as dm-delay),
page cache evicted before each epoch. It reports items/s, device reads per record
(``/sys/block/loopN/stat``) and the ratio LMDB / RecordIO of one run.

Needs root, ``losetup``, ``mkfs.ext4`` and the cgroup-v1 blkio throttle; elsewhere
:func:`slow_device_rows` returns ``{}``. Run alone::

    python benchmarks/bench_lmdb.py [--images 240] [--iops 200] [--epochs 2]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from gluon_data.stores.lmdb_env import close_envs

_THROTTLE = "/sys/fs/cgroup/blkio/blkio.throttle.read_iops_device"


def can_run() -> bool:
    """Whether this machine can make the throttled loop device (root and the tools)."""
    return skip_reason() is None


def skip_reason():
    """Why this machine cannot make the throttled loop device, or None where it can."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return "needs root"
    missing = [t for t in ("losetup", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        return "needs %s" % " and ".join(missing)
    if not os.path.exists(_THROTTLE):
        return "needs the cgroup-v1 blkio throttle (%s)" % _THROTTLE
    return None


@contextlib.contextmanager
def slow_device(workdir: str, size_mb: int, iops: int):
    """An ext4 filesystem on a loop device (128 KB readahead, direct I/O to its backing
    file, reads throttled to ``iops`` a second); yields ``(mount point, device name)`` and
    removes the throttle, the mount and the device on the way out."""
    img, mnt = os.path.join(workdir, "disk.img"), os.path.join(workdir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    with open(img, "wb") as fh:
        fh.truncate(size_mb << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True, capture_output=True)
    dev = subprocess.run(["losetup", "--find", "--show", img], check=True,
                         capture_output=True, text=True).stdout.strip()
    name = os.path.basename(dev)
    with open("/sys/block/%s/dev" % name) as fh:
        majmin = fh.read().strip()
    mounted = False
    try:
        subprocess.run(["mount", dev, mnt], check=True, capture_output=True)
        mounted = True
        with open("/sys/block/%s/queue/read_ahead_kb" % name, "w") as fh:
            fh.write("128")
        with open("/sys/block/%s/queue/nomerges" % name, "w") as fh:
            fh.write("2")  # as a bio-based device (dm-delay): each request stays one read
        subprocess.run(["losetup", "--direct-io=on", dev], capture_output=True)
        with open(_THROTTLE, "w") as fh:
            fh.write("%s %d" % (majmin, iops))
        yield mnt, name
    finally:
        with contextlib.suppress(OSError):
            with open(_THROTTLE, "w") as fh:
                fh.write("%s 0" % majmin)
        if mounted and subprocess.run(["umount", mnt], capture_output=True).returncode:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def device_reads(name: str) -> int:
    """Read requests the block device ``name`` completed so far."""
    with open("/sys/block/%s/stat" % name) as fh:
        return int(fh.read().split()[0])


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class _Payloads:
    """The records of a store as a loader reads them, without decoding (on a slow device the
    reads are what is measured): item ``i`` is the size of record ``i``, and the loader's
    batch hints go to the store's ``will_need``."""

    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        return len(self.store.read(int(i)))

    def will_need(self, indices):
        self.store.will_need(indices)


def _count(samples):
    """Batchify: the batch size."""
    return np.array([len(samples)])


def _epoch(loader) -> int:
    seen = 0
    for batch in loader:
        seen += int(batch[0])
    return seen


def _drop_lmdb_envs() -> None:
    """Close this process's LMDB environments (their maps keep pages from eviction)."""
    close_envs()


def _best_epochs(rec: str, lm: str, name: str, workers: int, epochs: int, fresh: bool,
                 say) -> dict:
    """``{kind: (best items/s, device reads per record of that epoch)}`` of the loaders of
    the ``.rec`` and the LMDB taken in turn, each epoch after evicting the file; ``fresh``:
    stores and loaders made anew every epoch (every location learnt again), else made once
    and run one untimed epoch first."""
    from gluon_data.stores.lmdbio import LMDBFile
    from gluon_data.gluon.loader import DataLoader
    from gluon_data.stores.recordio import RecordFile

    paths = {"RecordIO": rec, "LMDB": os.path.join(lm, "data.mdb")}
    opens = {"RecordIO": lambda: RecordFile(rec), "LMDB": lambda: LMDBFile(lm, "train")}
    loaders, best = {}, {k: (0.0, 0.0) for k in paths}
    for epoch in range(epochs + (not fresh)):
        for kind, path in paths.items():
            if fresh or kind not in loaders:
                _drop_lmdb_envs()
                loaders[kind] = DataLoader(_Payloads(opens[kind]()), batch_size=16,
                                           shuffle=True, num_workers=workers,
                                           batchify_fn=_count, last_batch="keep")
            _evict(path)
            r0, t0 = device_reads(name), time.perf_counter()
            seen = _epoch(loaders[kind])
            rate = seen / (time.perf_counter() - t0)
            per = (device_reads(name) - r0) / seen
            say("  %s epoch %d: %.1f items/s, %.3f device reads per record"
                % (kind, epoch, rate, per))
            if (fresh or epoch) and rate > best[kind][0]:
                best[kind] = (rate, per)
    loaders.clear()
    _drop_lmdb_envs()
    return best


def slow_device_rows(images: int = 240, iops: int = 200, epochs: int = 2, workers: int = 2,
                     say=print) -> dict:
    """Cold loaders (``gluon_data.DataLoader``, batches of 16, hinted) of a ``.rec`` and an
    LMDB holding the same ~65 KB records on a device serving ``iops`` reads/s, in their
    first epoch (stores just opened) and in later ones: the best items/s of ``epochs``
    epochs each, device reads per record, and the LMDB / RecordIO ratio of items/s (one
    run); ``{}`` where :func:`can_run` is false."""
    if not can_run():
        return {}
    from gluon_data import convert
    from gluon_data.convert.sample import make_voc

    rows = {}
    with tempfile.TemporaryDirectory() as work:
        voc = make_voc(os.path.join(work, "VOC2012"), num_images=images, size_range=(380, 420),
                       val_fraction=0.01, seed=4, quality=98)
        size_mb = 64 + 3 * sum(os.path.getsize(os.path.join(voc, "JPEGImages", p))
                               for p in os.listdir(os.path.join(voc, "JPEGImages"))) // 2**20
        with slow_device(work, size_mb, iops) as (mnt, name):
            rec, lm = os.path.join(mnt, "v.rec"), os.path.join(mnt, "v.lmdb")
            convert(voc, rec, "voc", split="train")
            convert(rec, lm)
            os.sync()
            for fresh, how in ((True, "first epoch"), (False, "later epochs")):
                best = _best_epochs(rec, lm, name, workers, epochs, fresh, say)
                for kind, (rate, per) in best.items():
                    rows["%s loader, %d reads/s device (cold, %s)" % (kind, iops, how)] = rate
                    rows["%s device reads/record, %d reads/s device (cold, %s)"
                         % (kind, iops, how)] = per
                rows["LMDB / RecordIO loaders, %d reads/s device (cold, %s)" % (iops, how)] = (
                    best["LMDB"][0] / best["RecordIO"][0])
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=240)
    p.add_argument("--iops", type=int, default=200)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    if not can_run():
        print("needs root, losetup, mkfs.ext4 and the blkio throttle", file=sys.stderr)
        return 2
    for k, v in slow_device_rows(a.images, a.iops, a.epochs, a.workers).items():
        print("%-72s %10.3f" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
