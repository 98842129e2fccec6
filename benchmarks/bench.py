"""``gluon-data bench`` (``python benchmarks/bench.py``): our loaders and the baselines side by side, in one run, as ratios.

Makes (or reuses) a VOC-like dataset of photographic-looking JPEGs (300-500 px, tens of KB)
with palette masks, packs it, and measures in one run:

* conversion: ours (pass-through and re-encode, 1 and N workers) against ``im2rec`` and a raw
  copy of the same files;
* the decode limit: image + mask bytes from memory with OpenCV, 1 and N processes (forked
  after loading the bytes, timed from a barrier: no start-up or transfer counted), and the
  old measurement that sent the bytes through a spawn ``Pool.map`` inside the timing;
* segmentation ``train`` (``base_size=400, crop_size=320``, ``ToTensor`` + ``Normalize``,
  ``DataLoader(batch_size=16, num_workers=N)``): gluoncv's ``VOCSegmentation``, ours from
  ``.rec`` and from LMDB, and DALI's CPU pipeline when ``--dali-python`` names an
  interpreter that has DALI (it needs numpy 2, so it cannot share MXNet's environment);
* classification on a stock im2rec ``.rec``: stock ``ImageRecordDataset`` and
  ``ImageRecordIter`` against ours;
* raw record reads, sequential and random, warm and cold (page cache evicted with
  ``posix_fadvise(DONTNEED)``), against ``cat`` and stock ``read_idx``, and the small files;
* index memory and load time per million records, and the private memory a forked worker
  gains reading every index entry;
* per-worker RSS after each of 3 epochs.

A shared machine is noisy: compare ratios from one run, never absolute numbers from
different runs.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Optional, Tuple

import numpy as np

__all__ = ["run_bench", "run_classification", "classification_rates", "index_costs",
           "main"]


def make_dataset(root: str, n: int, seed: int = 0) -> str:
    """VOC layout with ``n`` JPEG photos (300-500 px) and palette masks; every split lists
    every image (gluoncv's ``train`` reads ``trainval.txt``)."""
    from gluon_data.sample import make_voc
    voc = os.path.join(root, "VOC2012")
    sets = os.path.join(voc, "ImageSets", "Segmentation")
    if os.path.exists(os.path.join(sets, "train.txt")):
        return voc
    make_voc(voc, n, size_range=(300, 500), seed=seed, photo=True, prefix="2012")
    names = sorted(f[:-4] for f in os.listdir(os.path.join(voc, "JPEGImages")))
    for split in ("train", "val", "trainval"):
        with open(os.path.join(sets, split + ".txt"), "w") as f:
            f.write("".join(x + "\n" for x in names))
    return voc


def _decode_pairs(pairs):
    import cv2
    cv2.setNumThreads(1)
    for img, mask in pairs:
        cv2.imdecode(np.frombuffer(img, np.uint8), cv2.IMREAD_COLOR)
        cv2.imdecode(np.frombuffer(mask, np.uint8), cv2.IMREAD_UNCHANGED)
    return len(pairs)


def _decode_share(pairs, k, workers, barrier, done):  # pragma: no cover - forked child
    chunk = pairs[k::workers]
    _decode_pairs(chunk[:1])  # libraries loaded, threads set, before the start signal
    barrier.wait()
    c0 = time.process_time()
    count = _decode_pairs(chunk)
    done.put((count, time.process_time() - c0))


def _forked_decode_rate(pairs, workers: int, cpu: Optional[list] = None) -> float:
    """Items/s of ``workers`` processes decoding their shares of ``pairs``: forked after the
    bytes are loaded (each holds them already), timed from a barrier that releases them all
    to the last one's result, so neither start-up nor moving the bytes is counted. ``cpu``
    (a list) gets the CPU seconds the processes spent per item."""
    return _forked_rate(_decode_share, (pairs,), workers, cpu)


def _forked_rate(target, args, workers: int, cpu: Optional[list] = None) -> float:
    """Run ``target(*args, k, workers, barrier, done)`` in ``workers`` forked processes, each
    putting ``(items, cpu seconds)`` after the barrier; items/s from the barrier to the last."""
    ctx = multiprocessing.get_context("fork")
    barrier, done = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=target, args=tuple(args) + (k, workers, barrier, done),
                         daemon=True) for k in range(workers)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=300)
        t0 = time.perf_counter()
        got = [done.get(timeout=600) for _ in procs]
        elapsed = time.perf_counter() - t0
        count = sum(c for c, _ in got)
        if cpu is not None:
            cpu.append(sum(t for _, t in got) / count)
        return count / elapsed
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


def _rate(fn, n):
    t0 = time.perf_counter()
    done = fn()
    return (done if isinstance(done, int) and done else n) / (time.perf_counter() - t0)


def _rss_mb(pid: int) -> Tuple[float, float]:
    """(private RSS, shared-memory RSS) of a process in MB: anonymous + file pages, and the
    pages of shared segments (our reusable batch segments, Gluon's cpu_shared arrays)."""
    fields = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                fields[key] = int(rest.split()[0]) / 1024.0
    return fields.get("RssAnon", 0) + fields.get("RssFile", 0), fields.get("RssShmem", 0)


def _loader_rates(pipelines, workers: int, epochs: int, rss=None, between=None,
                  before=None, loader=None, cpu=None) -> dict:
    """Best items/s of each ``(name, dataset, batchify)`` through
    ``DataLoader(batch_size=16, shuffle=True, num_workers=workers)``. Every loader first runs
    one whole epoch (workers started, caches warm, nothing left unread), then each round runs
    one epoch of every loader in turn, so a change of load on this shared machine hits them
    all alike. ``rss`` collects the first loader's per-worker RSS after every round;
    ``between`` runs after every round, ``before(name)`` before every timed epoch;
    ``loader`` is the DataLoader class (Gluon's by default), or a pipeline's fourth item;
    ``cpu`` collects each loader's least CPU milliseconds per item (the main process and its
    workers, all threads) over its timed epochs: unlike items/s, hardly moved by other
    jobs on the machine."""
    import mxnet as mx
    loaders = {}
    for name, dataset, batchify, *cls in pipelines:
        make = cls[0] if cls else loader or mx.gluon.data.DataLoader
        loaders[name] = make(dataset, batch_size=16, shuffle=True, num_workers=workers,
                             batchify_fn=batchify, last_batch="keep")
        for _ in loaders[name]:
            pass
    best = dict.fromkeys(loaders, 0.0)
    for _ in range(epochs):
        for k, (name, loader) in enumerate(loaders.items()):
            if before is not None:
                before(name)
            pool = getattr(getattr(loader, "_worker_pool", None), "_pool", None) or []
            pids = [os.getpid()] + ([p.pid for p in pool] if cpu is not None else [])
            c0 = sum(map(_cpu_s, pids)) if cpu is not None else 0.0
            t0, seen = time.perf_counter(), 0
            for batch in loader:
                seen += batch[0].shape[0]
            best[name] = max(best[name], seen / (time.perf_counter() - t0))
            if cpu is not None and seen:
                ms = (sum(map(_cpu_s, pids)) - c0) * 1e3 / seen
                cpu[name] = min(cpu.get(name, ms), ms)
            if k == 0 and rss is not None and workers:
                rss.append([_rss_mb(p.pid) for p in loader._worker_pool._pool])
        if between is not None:
            between()
    return best


class _CountBatchify:
    """Batchify for variable-size classification images: forces decode, returns counts."""

    def __call__(self, samples):
        import mxnet as mx
        return (mx.nd.array([s[0].shape[0] for s in samples]),)


def _evict(paths) -> bool:
    """Drop files from the page cache (no root needed); False where the OS cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


_LMDB_COLD = r"""
import os, sys, time
import lmdb, numpy as np
from gluon_data import lmdbio
from gluon_data.lmdbio import LMDBFile
from gluon_data.loader import HintedBatches, SAME_PROCESS_AHEAD  # (imports MXNet: untimed)
path, rounds, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
n = LMDBFile(path, "train").__len__()

def close_all():  # py-lmdb opens an environment once per process; its map holds pages
    for k in list(lmdbio._ENVS):
        e = lmdbio._ENVS.pop(k)[1]
        lmdbio._forget_guard(e)
        e.close()

def measure(how, frac):
    order = [int(i) for i in np.random.default_rng(1).permutation(n)][:max(1, n // frac)]
    close_all()
    if how.startswith("ours"):
        f = LMDBFile(path, "train")
        read = f.read
    else:
        env = lmdb.open(path, readonly=True, lock=False, readahead=how != "readahead=False",
                        max_dbs=64, subdir=True)
        db = env.open_db(b"train", create=False)
        def read(i):
            with env.begin(db=db) as txn:
                return txn.get(b"%010d" % i)
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    if how == "ours, DataLoader hints":  # as gluon_data.DataLoader(num_workers=0) reads
        for batch in HintedBatches([order[k:k + 16] for k in range(0, len(order), 16)], f,
                                   SAME_PROCESS_AHEAD):
            for i in batch:
                read(i)
    else:
        for i in order:
            read(i)
    rate = len(order) / (time.perf_counter() - t0)
    if not how.startswith("ours"):
        env.close()
    return rate

for _ in range(rounds):
    for spec in specs:
        how, frac = spec.rsplit("/", 1)
        print("%s/%s %r" % (how, frac, measure(how, int(frac))))
"""


def _lmdb_cold_rates(path: str, specs, rounds: int) -> dict:
    """``{(how, frac): best values/s}`` reading 1/``frac`` of an LMDB split in random order,
    page cache evicted, every environment of the process closed before each read (its map
    would keep pages from eviction), ``rounds`` rounds of every ``(how, frac)`` of ``specs``
    in turn in one fresh process: ``how`` is ``ours`` (LMDBFile), ``ours, DataLoader hints``
    (LMDBFile read as ``gluon_data.DataLoader(num_workers=0)`` reads it: batches of 16, each
    handed to ``will_need`` two batches before it is read), ``py-lmdb default`` (readahead
    on) or ``readahead=False`` (``txn.get``). A fraction emulates a dataset bigger than the
    page cache: readahead's neighbours are mostly never read."""
    res = subprocess.run([sys.executable, "-c", _LMDB_COLD, path, str(rounds)]
                         + ["%s/%d" % spec for spec in specs],
                         capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise RuntimeError("LMDB cold read run failed: %s" % res.stderr.strip()[-500:])
    best: dict = {}
    for line in res.stdout.strip().splitlines():
        spec, rate = line.rsplit(" ", 1)
        how, frac = spec.rsplit("/", 1)
        best[how, int(frac)] = max(best.get((how, int(frac)), 0.0), float(rate))
    return best


def _consume(read, order) -> None:
    """Read records one at a time, as a loader does (not hoarding them all in memory)."""
    total = 0
    for i in order:
        total += len(read(i))


def _hinted_consume(store, order, batch: int = 16) -> None:
    """Read records as ``gluon_data.DataLoader(batch_size=16, num_workers=0)`` does: each
    batch's indices go to the store's ``will_need`` two batches before the batch is read
    (:class:`gluon_data.loader.HintedBatches`), then its records are read one at a time."""
    from gluon_data.loader import SAME_PROCESS_AHEAD, HintedBatches
    total = 0
    for b in HintedBatches([order[k:k + batch] for k in range(0, len(order), batch)], store,
                           SAME_PROCESS_AHEAD):
        for i in b:
            total += len(store.read(i))


def read_rates(rec: str, lm: str, jpg_files, workers: int, quick: bool, kw: dict,
               say=print) -> Tuple[dict, dict]:
    """The raw-read rows (warm and cold), cold LMDB value reads and the cold ``train``
    loaders of the ``.rec`` at ``rec`` and the LMDB at ``lm`` holding the same records;
    returns ``(rates, notes)``. ``kw`` are the segmentation ``train`` options."""
    import mxnet as mx

    from gluon_data.batchify import SegmentationBatchify
    from gluon_data.datasets import SegmentationLMDBDataset, SegmentationRecordDataset
    from gluon_data.loader import DataLoader
    from gluon_data.recordio import RecordFile

    results, notes = {}, {}
    # -- raw reads, warm and cold ------------------------------------------------------------
    say("raw reads ...")
    f = RecordFile(rec)
    stock = mx.recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r")
    order = [int(i) for i in np.random.default_rng(0).permutation(len(f))]
    eighth = order[:max(1, len(order) // 8)]  # a dataset 8x the page cache, as seen by readahead

    def scan():
        total = 0
        for payload in f.scan():
            total += len(payload)

    def cat():
        subprocess.run(["cat", rec], stdout=subprocess.DEVNULL, check=True)

    cold_ok = True
    readers = [("cat .rec", cat, len(f)), ("ours sequential reads", scan, len(f)),
               ("ours random reads", lambda: _consume(f.read, order), len(f)),
               ("ours random reads, DataLoader hints", lambda: _hinted_consume(f, order),
                len(f)),
               ("stock read_idx random reads", lambda: _consume(stock.read_idx, order), len(f))]
    cold_only = [
        ("ours random reads, 1/8 of the records", lambda: _consume(f.read, eighth), len(eighth)),
        ("ours random reads, DataLoader hints, 1/8 of the records",
         lambda: _hinted_consume(f, eighth), len(eighth)),
        ("stock read_idx random reads, 1/8 of the records",
         lambda: _consume(stock.read_idx, eighth), len(eighth))]
    for state, rounds in (("warm", 5), ("cold", 3)):
        for _ in range(rounds):  # rounds of every reader in turn; each keeps its best
            for name, fn, count in readers + (cold_only if state == "cold" else []):
                if state == "cold":
                    cold_ok = _evict([rec]) and cold_ok
                else:
                    fn()  # the page cache holds the file
                key = "%s (%s)" % (name, state)
                results[key] = max(results.get(key, 0.0), _rate(fn, count))
    if cold_ok:
        _evict(jpg_files)
        results["small files, read each (cold)"] = _rate(
            lambda: [open(p, "rb").read() and None for p in jpg_files], len(jpg_files))
    else:
        notes["cold"] = "posix_fadvise unavailable: cold rows measured warm"

    # -- LMDB, cold -------------------------------------------------------------------------
    say("LMDB cold reads ...")
    lm_data = os.path.join(lm, "data.mdb")
    if cold_ok:
        specs = [(how, frac) for how in ("ours", "ours, DataLoader hints", "py-lmdb default",
                                         "readahead=False") for frac in (1, 8)]
        for (how, frac), rate in _lmdb_cold_rates(lm, specs, 1 if quick else 3).items():
            results["LMDB %s random reads, %s of the records (cold)"
                    % (how, "all" if frac == 1 else "1/%d" % frac)] = rate
        # gluon_data.DataLoader: what the README tells users to train with (it hints batches)
        cold_files = {"ours .rec train (cold)": [rec], "ours LMDB train (cold)": [lm_data]}
        batchify = SegmentationBatchify(channels_first=True)
        results.update(_loader_rates([
            ("ours .rec train (cold)", SegmentationRecordDataset(rec, seed=0, **kw), batchify),
            ("ours LMDB train (cold)", SegmentationLMDBDataset(lm, split="train", seed=0, **kw),
             batchify),
        ], workers, 1 if quick else 3, before=lambda name: _evict(cold_files[name]),
            loader=DataLoader))
    # the hints' cost when the page cache holds everything: the same loader, warm, through
    # Gluon's DataLoader (no hints) and ours (a will_need per batch in the main process)
    ds = SegmentationRecordDataset(rec, seed=0, **kw)
    batchify = SegmentationBatchify(channels_first=True)
    results.update(_loader_rates([
        ("ours .rec train, Gluon's DataLoader (warm)", ds, batchify, mx.gluon.data.DataLoader),
        ("ours .rec train, gluon_data.DataLoader (warm)", ds, batchify, DataLoader),
    ], workers, 1 if quick else 2))

    return results, notes


#: The ratios of :func:`read_rates`' rows: (name, numerator row, denominator row, target).
#: "hinted" rows read as ``gluon_data.DataLoader`` does (``will_need`` per batch of 16, two
#: batches ahead); "unhinted" rows read one record at a time with nothing said in advance.
READ_RATIOS = [
    ("ours LMDB train / ours .rec train (cold)", "ours LMDB train (cold)",
     "ours .rec train (cold)", 0.9),
    ("LMDB cold random reads: ours hinted / py-lmdb default",
     "LMDB ours, DataLoader hints random reads, all of the records (cold)",
     "LMDB py-lmdb default random reads, all of the records (cold)", 1.0),
    ("LMDB cold random reads, 1/8: ours hinted / py-lmdb default",
     "LMDB ours, DataLoader hints random reads, 1/8 of the records (cold)",
     "LMDB py-lmdb default random reads, 1/8 of the records (cold)", 1.0),
    ("LMDB cold random reads: ours unhinted / py-lmdb default",
     "LMDB ours random reads, all of the records (cold)",
     "LMDB py-lmdb default random reads, all of the records (cold)", None),
    ("LMDB cold random reads, 1/8: ours unhinted / py-lmdb default",
     "LMDB ours random reads, 1/8 of the records (cold)",
     "LMDB py-lmdb default random reads, 1/8 of the records (cold)", None),
    ("LMDB cold random reads: ours / readahead=False",
     "LMDB ours random reads, all of the records (cold)",
     "LMDB readahead=False random reads, all of the records (cold)", None),
    ("sequential reads / cat (warm)", "ours sequential reads (warm)", "cat .rec (warm)",
     0.8),
    ("sequential reads / cat (cold)", "ours sequential reads (cold)", "cat .rec (cold)",
     0.8),
    ("random reads / stock read_idx (warm)", "ours random reads (warm)",
     "stock read_idx random reads (warm)", 1.0),
    ("random reads hinted / stock read_idx (cold)",
     "ours random reads, DataLoader hints (cold)", "stock read_idx random reads (cold)",
     1.0),
    ("random reads hinted / stock read_idx, 1/8 (cold)",
     "ours random reads, DataLoader hints, 1/8 of the records (cold)",
     "stock read_idx random reads, 1/8 of the records (cold)", 1.0),
    ("random reads unhinted / stock read_idx (cold)", "ours random reads (cold)",
     "stock read_idx random reads (cold)", None),
    ("random reads unhinted / stock read_idx, 1/8 (cold)",
     "ours random reads, 1/8 of the records (cold)",
     "stock read_idx random reads, 1/8 of the records (cold)", None),
    ("random reads hinted / unhinted (warm)", "ours random reads, DataLoader hints (warm)",
     "ours random reads (warm)", None),
    ("ours .rec train warm: gluon_data.DataLoader / Gluon's",
     "ours .rec train, gluon_data.DataLoader (warm)", "ours .rec train, Gluon's DataLoader (warm)",
     None),
    ("cold .rec scan / cold small files", "ours sequential reads (cold)",
     "small files, read each (cold)", None),
]


def _raw_copy(files, out_path) -> None:
    with open(out_path, "wb") as out:
        for p in files:
            with open(p, "rb") as f:
                out.write(f.read())


def index_costs(workdir: str, n: int) -> dict:
    """Load time and memory of our index and stock MXIndexedRecordIO for ``n`` records,
    scaled to one million, and the private memory a forked child gains reading all of it."""
    import gc
    import tracemalloc

    import mxnet as mx

    from gluon_data.recordio import RecordFile, RecordWriter, write_binary_index

    rec = os.path.join(workdir, "index-%d.rec" % n)
    idx = rec[:-4] + ".idx"
    if not os.path.exists(rec):
        with RecordWriter(rec, overwrite=True) as w:
            for i in range(n):
                w.write(i, b"abcd")
            w.finish()
            w.publish()
    write_binary_index(idx)
    text_only = os.path.join(workdir, "index-%d-text" % n)
    os.makedirs(text_only, exist_ok=True)
    for src in (rec, idx):  # the same index without its binary copy, as im2rec leaves it
        dst = os.path.join(text_only, os.path.basename(src))
        if not os.path.exists(dst):
            os.symlink(os.path.abspath(src), dst)
    text_rec = os.path.join(text_only, os.path.basename(rec))
    def parsed(path):  # the text parsed in this process, as without a cache
        with _environ(GLUON_DATA_INDEX_CACHE="0"):
            return RecordFile(path)

    openers = {"ours": lambda: RecordFile(rec),
               "ours (text .idx)": lambda: parsed(text_rec),
               "stock": lambda: mx.recordio.MXIndexedRecordIO(idx, rec, "r")}
    readers = {"ours": lambda f: int(f._offsets.sum()) + int(f.extent_sizes().sum()),
               "ours (text .idx)": lambda f: int(f._offsets.sum()) + int(f.extent_sizes().sum()),
               "stock": lambda f: sum(f.idx.values())}
    out = {}
    for name, opener in openers.items():
        times = []
        for _ in range(3):
            gc.collect()
            t0 = time.perf_counter()
            obj = opener()
            times.append(time.perf_counter() - t0)
            del obj
        gc.collect()
        tracemalloc.start()
        obj = opener()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out[name + " load s per 1M"] = min(times) * 1e6 / n
        out[name + " bytes/record"] = held / n
        out[name + " forked private MB per 1M"] = _forked_private(obj, readers[name]) * 1e6 / n
        del obj
    return out


@contextlib.contextmanager
def _environ(**values):
    """Environment variables set for the block (inherited by processes forked in it)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tiny_rec(path: str, n: int) -> str:
    """``n`` 4-byte records (12 bytes framed) and their ``.idx`` + ``.idx.gdx``, written with
    numpy in chunks (10 M records in seconds); the framing is RecordIO's, payloads fake."""
    from gluon_data.recordio import write_binary_index
    idx = path[:-4] + ".idx"
    if os.path.exists(idx + ".gdx"):
        return path
    frame = np.array([0xCED7230A, 4, int.from_bytes(b"abcd", "little")], "<u4")
    chunk = 1_000_000
    with open(path + ".partial", "wb") as rec, open(idx + ".partial", "wb") as out:
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            np.broadcast_to(frame, (m, 3)).tofile(rec)
            keys = np.arange(lo, lo + m)
            lines = np.char.add(np.char.add(keys.astype("U10"), "\t"),
                                np.char.add((keys * 12).astype("U12"), "\n"))
            out.write("".join(lines.tolist()).encode())
    os.replace(path + ".partial", path)
    os.replace(idx + ".partial", idx)
    write_binary_index(idx)
    return path


def _tiny_shards(workdir: str, n: int, shards: int) -> str:
    """A sharded dataset of ``n`` tiny records in ``shards`` shards (:func:`_tiny_rec`, each
    with its metadata) behind a manifest written by the manifest writer from
    ``shard_summary`` entries, as a sharded conversion writes it; returns the manifest."""
    from gluon_data.meta import FORMAT_NAME, FORMAT_VERSION, dumps_meta, meta_path
    from gluon_data.shards import (MANIFEST_FORMAT, MANIFEST_VERSION, _write_manifest,
                                   manifest_path, read_manifest, shard_name, shard_summary)
    folder = os.path.join(workdir, "scale-%d-shards" % n)
    prefix = os.path.join(folder, "tiny")
    manifest = manifest_path(prefix)
    if os.path.exists(manifest):
        return manifest
    os.makedirs(folder, exist_ok=True)
    entries = []
    for s in range(shards):
        m = n // shards + (s < n % shards)
        path = _tiny_rec(shard_name(prefix, s, shards), m)
        with open(meta_path(path), "wb") as f:
            f.write(dumps_meta({"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                                "task": "classification", "num_records": m}))
        entry = shard_summary(path, "rec", "train")
        entries.append({k: entry[k] for k in ("name", "records", "bytes", "idx_sha256",
                                              "meta_sha256")})
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
            "task": "classification", "num_records": n}
    _write_manifest(manifest, {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
                               "container": "rec", "split": "train", "task": "classification",
                               "num_records": n, "shards": entries, "meta": meta})
    read_manifest(manifest)  # the counts add up
    return manifest


def _scale_worker(path, opened, order, barrier, done):  # pragma: no cover - forked child
    from gluon_data.store import open_store
    pid = os.getpid()
    before, anon = _private_mb(pid), _smaps_mb(pid, "Anonymous")
    barrier.wait()
    t0 = time.perf_counter()
    f = opened if opened is not None else open_store(path)
    opened_s = time.perf_counter() - t0
    f.read(int(order[0]))
    barrier.wait()  # every worker reads at once, whatever its open cost
    rate = 0.0
    for _ in range(3):  # best of 3 passes: this machine is shared and noisy
        t1 = time.perf_counter()
        for i in order:
            f.read(int(i))
        rate = max(rate, len(order) / (time.perf_counter() - t1))
    barrier.wait()  # memory measured while every worker still maps what it mapped
    done.put((opened_s, _private_mb(pid) - before, rate, _smaps_mb(pid, "Anonymous") - anon))


def _scale_run(path, workers, order, opened=None):
    """Per-worker (open s, private MB gained, random reads/s) of ``workers`` forked processes
    that each open ``path`` (or use ``opened``, the parent's reader) together after a barrier,
    then read ``order``."""
    ctx = multiprocessing.get_context("fork")
    barrier, done = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_scale_worker, args=(path, opened, order, barrier, done),
                         daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        return [done.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


def _scale_label(n: int) -> str:
    return "%gM" % (n / 1e6) if n >= 1_000_000 else str(n)


def scale_costs(workdir: str, n: int = 10_000_000, workers: int = 8, reads: int = 10000,
                shards: int = 100) -> dict:
    """A ``n``-record ``.rec`` opened by ``workers`` DataLoader-like processes at once:
    each opening it itself (with its binary index; with the text ``.idx`` only, the first
    time and once the user cache holds its parsed copy; and a ``shards``-shard manifest of
    as many records) and forked after the parent opened it (Gluon's default); the worst
    worker's open time, private memory (``Private_*`` of ``smaps``: anonymous memory and
    mapped pages no other process maps, measured while every worker still runs) and anonymous
    memory gained, and random-read rates (the best of 3 passes over ``reads`` random
    positions, all workers reading together) against the same reads from a 2,000-record
    file. The index cache goes to ``workdir/cache`` for the run."""
    from gluon_data.recordio import RecordFile, index_cache_path, idx_path_for
    from gluon_data.store import _load_builtins
    _load_builtins()  # imported before the workers fork: their open times are the opens
    big = _tiny_rec(os.path.join(workdir, "scale-%d.rec" % n), n)
    small = _tiny_rec(os.path.join(workdir, "scale-2000.rec"), 2000)
    sharded = _tiny_shards(workdir, n, shards)
    text_dir = os.path.join(workdir, "scale-%d-text" % n)
    os.makedirs(text_dir, exist_ok=True)
    for src in (big, big[:-4] + ".idx"):
        dst = os.path.join(text_dir, os.path.basename(src))
        if not os.path.exists(dst):
            os.symlink(os.path.abspath(src), dst)
    text = os.path.join(text_dir, os.path.basename(big))
    rng = np.random.default_rng(0)
    order_big, order_small = rng.integers(0, n, reads), rng.integers(0, 2000, reads)
    out, m = {}, _scale_label(n)
    with _environ(GLUON_DATA_CACHE_DIR=os.path.join(workdir, "cache")):
        cached = index_cache_path(idx_path_for(text))
        if os.path.exists(cached):
            os.remove(cached)  # the first open parses the text: measure it
        for name, path, order in (
                ("2,000 records", small, order_small),
                ("%s, binary index" % m, big, order_big),
                ("%s, text .idx only, first open" % m, text, order_big),
                ("%s, text .idx only, later opens" % m, text, order_big),
                ("%s, %d-shard manifest" % (m, shards), sharded, order_big)):
            res = _scale_run(path, workers, order)
            out[name + ": worst open s"] = max(r[0] for r in res)
            out[name + ": worst private MB"] = max(r[1] for r in res)
            out[name + ": random reads/s per worker"] = float(np.mean([r[2] for r in res]))
            out[name + ": worst anonymous MB"] = max(r[3] for r in res)
    for name, path, order in (("2,000 records", small, order_small), (m, big, order_big)):
        out["%s: raw os.pread random reads/s, 1 process" % name] = _pread_rate(path, order)
    parent = RecordFile(big)
    res = _scale_run(big, workers, order_big, opened=parent)
    key = "%s, forked after the parent opened" % m
    out[key + ": worst private MB"] = max(r[1] for r in res)
    out[key + ": random reads/s per worker"] = float(np.mean([r[2] for r in res]))
    out[key + ": worst anonymous MB"] = max(r[3] for r in res)
    return out


def _pread_rate(path: str, order) -> float:
    """The OS's own cost of the same random reads (``os.pread`` of each 12-byte record, no
    index), best of 3 passes: what a bigger file costs before any index is involved."""
    fd = os.open(path, os.O_RDONLY)
    try:
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            for i in order:
                os.pread(fd, 12, 12 * int(i))
            best = max(best, len(order) / (time.perf_counter() - t0))
        return best
    finally:
        os.close(fd)


def _scale_rows(scaled: dict, n: int):
    """The scale step's rows against their targets: ``(name, value, target, lower)``."""
    m = _scale_label(n)
    small = scaled["2,000 records: random reads/s per worker"]
    cases = [k[len(m) + 2:-len(": worst open s")] for k in scaled
             if k.startswith(m + ", ") and k.endswith(": worst open s")]
    for what in cases:
        yield ("%s records, %s: worst worker open s" % (m, what),
               scaled["%s, %s: worst open s" % (m, what)], 1.0, True)
        yield ("%s records, %s: worst worker private MB" % (m, what),
               scaled["%s, %s: worst private MB" % (m, what)], 100.0, True)
        yield ("%s records, %s: random reads / 2,000 records" % (m, what),
               scaled["%s, %s: random reads/s per worker" % (m, what)] / small, 1.0, False)
        yield ("%s records, %s: worst worker anonymous MB" % (m, what),
               scaled["%s, %s: worst anonymous MB" % (m, what)], None, True)
    yield ("%s records, raw os.pread random reads / 2,000 records (the file's own cost)" % m,
           scaled["%s: raw os.pread random reads/s, 1 process" % m]
           / scaled["2,000 records: raw os.pread random reads/s, 1 process"], None, False)
    key = "%s, forked after the parent opened" % m
    yield ("%s records, forked after open: worst private MB" % m,
           scaled[key + ": worst private MB"], 100.0, True)
    yield ("%s records, forked after open: random reads / 2,000 records" % m,
           scaled[key + ": random reads/s per worker"] / small, 1.0, False)
    yield ("%s records, forked after open: worst worker anonymous MB" % m,
           scaled[key + ": worst anonymous MB"], None, True)


def _say_scale(say, scaled: dict, n: int) -> None:
    say("%-64s %10s" % ("%d records, 8 workers opening at once" % n, "value"))
    for k, v in scaled.items():
        say("%-64s %10.3f" % (k, v))
    say("")


def run_scale(workdir: str, n: int, out=sys.stdout) -> dict:
    """Only the scale step (``--only scale``): its table and its rows against the targets."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("%d records in 8 workers ..." % n)
    t0 = time.perf_counter()
    scaled = scale_costs(workdir, n)
    say("(%.0f s, files included)" % (time.perf_counter() - t0))
    _say_scale(say, scaled, n)
    say("%-56s %8s %8s  %s" % ("ratio (same run)", "value", "target", ""))
    for name, value, target, lower in _scale_rows(scaled, n):
        ok = target is not None and (value <= target if lower else value >= target)
        say("%-56s %8.2f %8s  %s" % (name, value, "-" if target is None else
                                      ("<=%.2f" if lower else "%.2f") % target,
                                      "" if target is None else "met" if ok else "MISSED"))
    return scaled


def _smaps_mb(pid: int, field: str) -> float:
    """One field of ``/proc/PID/smaps_rollup`` in MB (``Anonymous``: memory no file backs)."""
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _private_mb(pid: int) -> float:
    with open("/proc/%d/smaps_rollup" % pid) as f:
        total = 0
        for line in f:
            if line.startswith(("Private_Dirty:", "Private_Clean:")):
                total += int(line.split()[1])
    return total / 1024.0


def _forked_private(obj, read_all) -> float:
    """Private memory (MB) a forked child gains by reading every index entry once."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            before = _private_mb(os.getpid())
            read_all(obj)
            os.write(w, ("%f" % (_private_mb(os.getpid()) - before)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return float(data or "nan")


_DALI = r"""
import sys, time
from nvidia.dali import pipeline_def, fn, types
paths, idx, threads, n, recipe, warmup = (sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]),
                                          int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
@pipeline_def(batch_size=16, num_threads=threads, device_id=None)
def pipe():
    jpegs, labels = fn.readers.mxnet(path=paths, index_path=[idx], random_shuffle=True,
                                     name="r")
    norm = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip())
    if recipe.startswith("rrc224"):
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[0.75, 4.0 / 3])
        if recipe == "rrc224-antialias":  # DALI's default resize: linear + antialiasing
            images = fn.resize(images, resize_x=224, resize_y=224)
        else:  # what RandomResizedCrop(224) does: cv2.resize INTER_LINEAR, no antialiasing
            images = fn.resize(images, resize_x=224, resize_y=224,
                               interp_type=types.INTERP_LINEAR, antialias=False)
        images = fn.crop_mirror_normalize(images, **norm)
    else:
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.crop_mirror_normalize(
            images, crop=(320, 320), crop_pos_x=fn.random.uniform(range=(0, 1)),
            crop_pos_y=fn.random.uniform(range=(0, 1)), out_of_bounds_policy="pad", **norm)
    return images, labels
p = pipe()
p.build()
for _ in range(warmup):  # the reader's shuffle buffer filled, every buffer allocated
    p.run()
t0, c0, seen = time.perf_counter(), time.process_time(), 0
while seen < n:
    images, _ = p.run()
    seen += len(images)
print(seen / (time.perf_counter() - t0), (time.process_time() - c0) * 1e3 / seen)
"""


def _dali_rate(python: str, rec, workers: int, n: int, recipe: str, warmup: int = 8,
               index: Optional[str] = None) -> float:
    """Items/s of :func:`_dali_run`."""
    return _dali_run(python, rec, workers, n, recipe, warmup, index)[0]


def _dali_run(python: str, rec, workers: int, n: int, recipe: str, warmup: int = 8,
              index: Optional[str] = None) -> Tuple[float, float]:
    """(items/s, CPU ms per item of the whole process, all threads) of DALI's CPU pipeline
    (``device_id=None``: no GPU, ``num_threads=workers``, batch 16) over ``rec``, run by
    ``python``, an interpreter that has DALI. ``rec`` is a ``.rec`` path, or the list of a
    dataset's shards with ``index`` their combined ``.idx``
    (:func:`gluon_data.shards.write_combined_index`: ``fn.readers.mxnet`` takes several
    ``.rec`` files but one index, offsets counted as if the files were concatenated).
    Measured at its best: the pipeline is built and run ``warmup`` batches (the reader's
    shuffle buffer filled, every buffer allocated) before ``n`` images are timed, so
    neither start-up nor the first allocations count.

    ``recipe`` ``rrc224``: DALI's ImageNet recipe, ``fn.decoders.image_random_crop``
    (decodes only the random area/aspect region), ``fn.resize`` to 224x224 with linear
    interpolation and no antialiasing (what ``RandomResizedCrop(224)``'s
    ``cv2.resize(INTER_LINEAR)`` computes, and DALI's fastest resize), then
    ``fn.crop_mirror_normalize`` with a random mirror to float CHW — what
    ``RandomResizedCrop(224)`` + ``RandomFlipLeftRight`` + ``ToTensor`` + ``Normalize`` do;
    ``rrc224-antialias``: the same with DALI's default (antialiased) resize;
    ``crop320``: decode, random 320 crop, mirror, normalize."""
    paths = [rec] if isinstance(rec, str) else list(rec)
    index = index or paths[0][:-4] + ".idx"
    res = subprocess.run([python, "-c", _DALI, ",".join(paths), index, str(workers), str(n),
                          recipe, str(warmup)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError("DALI run failed: %s" % res.stderr.strip()[-500:])
    rate, cpu_ms = res.stdout.strip().splitlines()[-1].split()
    return float(rate), float(cpu_ms)


def _stock_lst(cls_root: str, jpg_files) -> str:
    """im2rec's ``.lst`` of the images (labels ``i % 20``), ``cls_root/stock.lst``."""
    os.makedirs(cls_root, exist_ok=True)
    lst = os.path.join(cls_root, "stock.lst")
    with open(lst, "w") as f:
        f.write("".join("%d\t%d\tJPEGImages/%s\n" % (i, i % 20, os.path.basename(p))
                        for i, p in enumerate(jpg_files)))
    return lst


def _im2rec(voc: str, prefix: str, mode: str, threads: int) -> None:
    """MXNet's ``tools/im2rec.py`` packing ``prefix.lst`` into ``prefix.rec`` (``mode``
    ``pass-through`` keeps the JPEG bytes, ``re-encode`` re-encodes at quality 90)."""
    import mxnet as mx
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    args = ["--pass-through"] if mode == "pass-through" else ["--quality", "90"]
    subprocess.run([sys.executable, im2rec, *args, "--num-thread", str(threads), prefix, voc],
                   check=True, capture_output=True)


def _stock_shards(stock_rec: str, shards: int = 4) -> str:
    """The records of ``stock_rec`` copied into ``shards`` ``.rec`` shards + manifest (kept
    if already there); returns the manifest."""
    from gluon_data.recordio import RecordFile
    from gluon_data.shards import ShardedStore, convert_sharded
    out = os.path.join(os.path.dirname(stock_rec), "shards", "stock.rec")
    manifest = os.path.join(os.path.dirname(out), "stock.shards.json")
    if not os.path.exists(manifest) or len(ShardedStore(manifest)) != len(
            RecordFile(stock_rec)):  # absent, or left by a dataset of another size
        os.makedirs(os.path.dirname(out), exist_ok=True)
        convert_sharded(stock_rec, out, shards=shards, overwrite=True)
    return manifest


_CLS_RECIPE = "RandomResizedCrop 224 recipe"
_DALI_RECIPES = (("DALI CPU %s" % _CLS_RECIPE, "rrc224"),
                 ("DALI CPU %s, antialiased resize" % _CLS_RECIPE, "rrc224-antialias"))


_CLS_RATIOS = (  # (name, numerator row, denominator row, target)
    ("ours cls / stock ImageRecordDataset", "ours ImageRecordDataset",
     "stock ImageRecordDataset", 1.5),
    ("ours cls / stock ImageRecordIter", "ours ImageRecordDataset",
     "stock ImageRecordIter (crop 224)", 1.5),
    ("ours cls recipe / stock cls recipe", "ours ImageRecordDataset + " + _CLS_RECIPE,
     "stock ImageRecordDataset + " + _CLS_RECIPE, 3.0),
    ("ours cls recipe / DALI same recipe", "ours ImageRecordDataset + " + _CLS_RECIPE,
     _DALI_RECIPES[0][0], 1.8),
    ("ours cls recipe / DALI, antialiased resize", "ours ImageRecordDataset + " + _CLS_RECIPE,
     _DALI_RECIPES[1][0], None),
    ("ours sharded cls recipe / DALI sharded", "ours sharded + " + _CLS_RECIPE,
     "DALI CPU sharded %s" % _CLS_RECIPE, None),
    ("ours cls recipe: sharded / one .rec", "ours sharded + " + _CLS_RECIPE,
     "ours ImageRecordDataset + " + _CLS_RECIPE, None),
)


_CLS_CPU_RATIOS = (  # CPU ms per item: DALI's / ours (higher: ours cheaper)
    ("ours cls recipe / DALI, CPU per item", _DALI_RECIPES[0][0],
     "ours ImageRecordDataset + " + _CLS_RECIPE, None),
    ("ours sharded / DALI sharded, CPU per item", "DALI CPU sharded %s" % _CLS_RECIPE,
     "ours sharded + " + _CLS_RECIPE, None),
)


def _cls_recipe():
    """The ImageNet training recipe: ``RandomResizedCrop(224)`` + flip + ``ToTensor`` +
    ``Normalize``, as Gluon transforms."""
    from mxnet.gluon.data.vision import transforms
    return transforms.Compose([transforms.RandomResizedCrop(224),
                               transforms.RandomFlipLeftRight(), transforms.ToTensor(),
                               transforms.Normalize([.485, .456, .406], [.229, .224, .225])])


def classification_rates(stock_rec: str, n: int, workers: int, epochs: int,
                         dali_python: Optional[str] = None, notes: Optional[dict] = None,
                         shards: Optional[str] = None, cpu: Optional[dict] = None) -> dict:
    """Items/s of classification on a stock im2rec ``.rec``: decode only (stock and ours),
    the ImageNet recipe (stock ``ImageRecordDataset`` + Gluon's transforms, ours with the same
    transforms), ``ImageRecordIter``, and — with ``dali_python`` — DALI's CPU pipeline of the
    same recipe on the same file with ``num_threads=workers`` (and ``shards``, a
    ``.shards.json`` of the same records: ours and DALI reading its ``.rec`` shards). The
    loaders run in interleaved rounds (see :func:`_loader_rates`); one DALI pass of every
    DALI row runs after every round, each keeping its best, so a change of load on the
    machine hits DALI and ours alike. ``cpu`` collects the least CPU ms per item of the
    recipe loaders and the DALI rows (every process and thread each one runs)."""
    import mxnet as mx

    from gluon_data.batchify import StackBatchify
    from gluon_data.datasets import ClassificationDataset, ImageRecordDataset
    from gluon_data.shards import ShardedStore, write_combined_index

    notes = {} if notes is None else notes
    cb, recipe = _CountBatchify(), _cls_recipe()
    stock_ds = mx.gluon.data.vision.ImageRecordDataset
    loaders = [
        ("stock ImageRecordDataset", stock_ds(stock_rec), cb),
        ("ours ImageRecordDataset", ImageRecordDataset(stock_rec), cb),
        ("stock ImageRecordDataset + " + _CLS_RECIPE,
         stock_ds(stock_rec).transform_first(recipe), None),
        ("ours ImageRecordDataset + " + _CLS_RECIPE,
         ImageRecordDataset(stock_rec).transform_first(recipe), StackBatchify()),
    ]
    dali_runs = [(name, stock_rec, None, how) for name, how in _DALI_RECIPES]
    if shards:
        combined = shards[:-len(".shards.json")] + ".all.idx"
        paths = write_combined_index(shards, combined)
        loaders.append(("ours sharded + " + _CLS_RECIPE,
                        ClassificationDataset(ShardedStore(shards)).transform_first(recipe),
                        StackBatchify()))
        dali_runs.append(("DALI CPU sharded %s" % _CLS_RECIPE, paths, combined, "rrc224"))
    dali_best: dict = {}
    cpu = {} if cpu is None else cpu

    def dali_round():
        for name, path, index, how in dali_runs if dali_python and "DALI" not in notes else ():
            try:
                rate, ms = _dali_run(dali_python, path, workers, n, how, index=index)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                notes["DALI"] = str(e)
                return
            dali_best[name] = max(dali_best.get(name, 0.0), rate)
            cpu[name] = min(cpu.get(name, ms), ms)

    loader_cpu: dict = {}
    results = _loader_rates(loaders, workers, epochs, between=dali_round, cpu=loader_cpu)
    cpu.update((k, v) for k, v in loader_cpu.items() if _CLS_RECIPE in k)
    results.update(dali_best)
    it = mx.io.ImageRecordIter(path_imgrec=stock_rec, data_shape=(3, 224, 224), batch_size=16,
                               preprocess_threads=workers, rand_crop=True)
    t0, seen = time.perf_counter(), 0
    for b in it:
        seen += 16 - b.pad
    results["stock ImageRecordIter (crop 224)"] = seen / (time.perf_counter() - t0)
    return results


def run_classification(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
                       dali_python: Optional[str] = None, epochs: int = 3) -> dict:
    """Only the classification rows of :func:`run_bench` (``--only classification``): the
    stock im2rec ``.rec`` of the same dataset, 4 shards of it, the loaders and DALI in
    interleaved rounds, and their ratios; returns ``{"rates", "ratios", "cpu"}`` (CPU ms per
    item of the recipe loaders and DALI)."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) in %s" % (n, workdir))
    voc = make_dataset(workdir, n)
    jpg_dir = os.path.join(voc, "JPEGImages")
    cls_root = os.path.join(workdir, "cls")
    stock_rec = os.path.join(cls_root, "stock.rec")
    if not os.path.exists(stock_rec[:-4] + ".idx"):
        _stock_lst(cls_root, [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))])
        _im2rec(voc, stock_rec[:-4], "pass-through", workers)
    shards = _stock_shards(stock_rec)
    say("classification ...")
    notes: dict = {}
    cpu: dict = {}
    results = classification_rates(stock_rec, n, workers, epochs, dali_python, notes,
                                   shards=shards, cpu=cpu)
    say("")
    say("%-56s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-56s %12.0f" % (k, v))
    _say_cpu(say, cpu)
    say("")
    table = _ratio_table(_CLS_RATIOS, results, say)
    _ratio_table(_CLS_CPU_RATIOS, cpu, say, table)
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    return {"rates": results, "ratios": table, "cpu": cpu}


def _say_cpu(say, cpu: dict) -> None:
    if cpu:
        say("")
        say("%-56s %12s" % ("CPU ms per item (all processes and threads)", "ms"))
        for k, v in cpu.items():
            say("%-56s %12.3f" % (k, v))


def _sibling(name: str):
    """``benchmarks/<name>.py`` beside this file, loaded once as module ``gluon_data_<name>``
    (so forked workers can unpickle what it defines); None where the file is absent."""
    key = "gluon_data_" + name
    if key in sys.modules:
        return sys.modules[key]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location(key, path)
    module = sys.modules[key] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


@contextlib.contextmanager
def _step(seconds: dict, name: str, say):
    """Announce a step, time it into ``seconds[name]`` and print its time."""
    say("%s ..." % name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = time.perf_counter() - t0
        say("  (%s: %.0f s)" % (name, seconds[name]))


def _timed_rate(n: int, fn) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def conversion_rates(workdir: str, voc: str, n: int, workers: int, quick: bool,
                     out=sys.stdout) -> Tuple[dict, dict]:
    """The conversion rows; writes what later steps read: ``voc.rec`` (ours, pass-through,
    ``workers`` workers), ``voc.lmdb`` (the same records) and im2rec's ``cls/stock.rec``.
    ``quick``: ours pass-through and re-encode and im2rec pass-through at N only; otherwise
    also ``benchmarks/bench_convert.py`` on the same pairs (1 vs N workers, the N-process
    decode floor, im2rec re-encoding at N threads, Dask 1 vs 2 worker processes on all ``n``
    images). Returns ``(rates, bench_convert's ratio table)`` (empty when ``quick``)."""
    from gluon_data.convert import convert
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    png_files = [os.path.join(png_dir, f) for f in sorted(os.listdir(png_dir))]
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    results = {"raw copy of the files, 1 process": _rate(
        lambda: _raw_copy(jpg_files + png_files, os.path.join(workdir, "copy.bin")), n)}
    results["ours convert pass-through, %d workers" % workers] = _timed_rate(n, lambda: convert(
        voc, rec, "voc", split="train", workers=workers, overwrite=True))
    if quick:
        results["ours convert re-encode, %d workers" % workers] = _timed_rate(
            n, lambda: convert(voc, os.path.join(workdir, "reenc.rec"), "voc", split="train",
                               workers=workers, overwrite=True, encoding="jpg", quality=90))
    convert(rec, lm, overwrite=True)  # the same records as the .rec just written
    cls_root = os.path.join(workdir, "cls")
    _stock_lst(cls_root, jpg_files)
    results["im2rec pass-through, %d threads" % workers] = _timed_rate(
        n, lambda: _im2rec(voc, os.path.join(cls_root, "stock"), "pass-through", workers))
    if quick:
        return results, RatioTable()
    conv = _sibling("bench_convert").run_convert_bench(workdir, n, workers, out=out,
                                                       shards=max(1, min(16, n // 4)))
    results.update(conv["rates"])
    return results, conv["ratios"]


def segmentation_rates(workdir: str, voc: str, n: int, workers: int, epochs: int,
                       dali_python: Optional[str], notes: dict, say) -> Tuple[dict, list]:
    """The decode limit (1 process; N forked processes, the best of the rounds run between
    the loaders; the old figure, bytes sent by ``Pool.map``) and segmentation ``train``
    (:data:`SEG_TRAIN`) from gluoncv, ours ``.rec`` and LMDB and ours with Gluon's batchify,
    in interleaved rounds, and DALI's crop 320 with ``dali_python``. Returns ``(rates, the
    first loader's per-worker RSS after every round)``."""
    from gluoncv.data import VOCSegmentation

    from gluon_data.batchify import SegmentationBatchify
    from gluon_data.datasets import SegmentationLMDBDataset, SegmentationRecordDataset

    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = [(open(os.path.join(jpg_dir, f), "rb").read(),
              open(os.path.join(png_dir, f[:-4] + ".png"), "rb").read())
             for f in sorted(os.listdir(jpg_dir))]
    say("mean JPEG size %.1f KB" % (np.mean([len(a) for a, _ in pairs]) / 1024))
    results = {"decode limit, OpenCV, 1 process": _rate(lambda: _decode_pairs(pairs), n)}
    dl_key = "decode limit, OpenCV, %d processes" % workers

    def decode_limit():  # best of the rounds run between the loaders (the machine is noisy)
        results[dl_key] = max(results.get(dl_key, 0.0), _forked_decode_rate(pairs, workers))

    chunks = [pairs[i::workers] for i in range(workers)]
    # the old measurement (a spawn pool then; fork here, so this file need not be importable
    # by name): every image's bytes pickled and piped to the workers inside the timing
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_pairs, [pairs[:2]] * workers)
        results["decode, %d processes, bytes sent by Pool.map (old limit)" % workers] = _rate(
            lambda: sum(pool.map(_decode_pairs, chunks)), n)
    decode_limit()
    kw = _seg_train_kw()
    batchify = SegmentationBatchify(channels_first=True)
    rss = []
    results.update(_loader_rates([
        ("ours .rec train", SegmentationRecordDataset(rec, seed=0, **kw), batchify),
        ("ours LMDB train", SegmentationLMDBDataset(lm, split="train", seed=0, **kw), batchify),
        ("ours .rec train, Gluon's default batchify",
         SegmentationRecordDataset(rec, seed=0, **kw), None),
        ("gluoncv VOCSegmentation train",
         VOCSegmentation(root=workdir, split="train", **kw), None),
    ], workers, max(epochs, 3), rss=rss, between=decode_limit))
    if dali_python:  # optional: only with --dali-python
        try:
            results["DALI CPU crop 320+normalize, image only"] = _dali_rate(
                dali_python, rec, workers, n, "crop320")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            notes["DALI"] = str(e)
    return results, rss


def _seg_train_kw() -> dict:
    """Segmentation ``train`` as every step reads it: base 400, crop 320, ``ToTensor`` +
    ``Normalize``."""
    from mxnet.gluon.data.vision import transforms
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    return dict(mode="train", base_size=400, crop_size=320, transform=tf)


def slow_device_rates(quick: bool, epochs: int, notes: dict, say) -> dict:
    """``benchmarks/bench_lmdb.py``'s rows (LMDB and RecordIO loaders on a throttled loop
    device), or ``{}`` and a note saying why they were skipped (they need root)."""
    bench_lmdb = _sibling("bench_lmdb")
    why = bench_lmdb.skip_reason()
    if why:
        notes["LMDB on a slow device"] = "skipped: " + why
        return {}
    return bench_lmdb.slow_device_rows(48 if quick else 240, epochs=1 if quick else epochs,
                                       say=say)


def after_decode_rates(rec: str, workers: int, quick: bool, out=sys.stdout) -> Tuple[dict, dict]:
    """``benchmarks/bench_uint8.py`` on ``rec``: float32 samples against uint8 samples +
    ``InputNormalize`` in the consumer, ``(items/s, CPU ms per item)`` (600 records a round
    in the full run, two rounds)."""
    return _sibling("bench_uint8").rows(rec, workers, 1 if quick else 2,
                                        limit=0 if quick else 600, out=out)


def _gpu_note() -> str:
    import mxnet as mx
    gpus = mx.context.num_gpus()
    if not gpus:
        return "skipped: no GPU (MXNet sees none), so the GPU comparison was not run"
    return "skipped: %d GPU(s) present, but this harness has no GPU comparison yet" % gpus


def run_bench(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
              quick: bool = False, dali_python: Optional[str] = None,
              index_records: Optional[int] = None, epochs: int = 3,
              scale: int = 0) -> dict:
    """Run every measurement once (each loader: the best of ``epochs`` epochs) and print the
    tables and every ratio against its target; returns ``{"rates", "ratios", "index", "rss",
    "scale", "cpu", "seconds"}`` (``seconds``: each step's wall time). ``scale`` > 0 adds
    :func:`scale_costs` for that many records."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) + palette masks in %s" % (n, workdir))
    seconds: dict = {}
    with _step(seconds, "dataset", say):
        voc = make_dataset(workdir, n)
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    jpg_dir = os.path.join(voc, "JPEGImages")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    notes: dict = {}
    cpu: dict = {}
    with _step(seconds, "conversion", say):
        results, conv_table = conversion_rates(workdir, voc, n, workers, quick, out)
    stock_rec = os.path.join(workdir, "cls", "stock.rec")
    stock_shards = _stock_shards(stock_rec)
    with _step(seconds, "decode limit and segmentation train", say):
        seg, rss = segmentation_rates(workdir, voc, n, workers, epochs, dali_python, notes,
                                      say)
    results.update(seg)
    with _step(seconds, "after decode: uint8 batches", say):
        rate8, cpu8 = after_decode_rates(rec, workers, quick, out)
    results.update(rate8)
    cpu.update(cpu8)
    with _step(seconds, "classification", say):
        results.update(classification_rates(stock_rec, n, workers, epochs, dali_python, notes,
                                            shards=stock_shards, cpu=cpu))
    with _step(seconds, "reads", say):  # raw reads, warm and cold; cold LMDB; cold loaders
        cold_results, cold_notes = read_rates(rec, lm, jpg_files, workers, quick,
                                              _seg_train_kw(), say)
    results.update(cold_results)
    notes.update(cold_notes)
    with _step(seconds, "LMDB on a slow device", say):
        slow = slow_device_rates(quick, 2, notes, say)
    with _step(seconds, "index", say):
        index = index_costs(workdir, index_records or (100_000 if quick else 1_000_000))
    scaled = {}
    if scale:
        with _step(seconds, "scale: %d records in 8 workers" % scale, say):
            scaled = scale_costs(workdir, scale)
    notes["GPU"] = _gpu_note()
    table = _report(say, workers, results, cpu, index, rss, scaled, scale,
                    (conv_table, slow, notes, seconds))
    return {"rates": results, "ratios": table, "index": index, "rss": rss, "scale": scaled,
            "cpu": cpu, "seconds": seconds}


def _ratios(workers: int) -> list:
    """The full run's ratio rows over its rates: (name, numerator, denominator, target)."""
    dl = "decode limit, OpenCV, %d processes" % workers
    return [
        ("ours .rec train / gluoncv train", "ours .rec train", "gluoncv VOCSegmentation train",
         4.0),
        ("ours .rec train / decode limit N", "ours .rec train", dl, 0.7),
        ("ours .rec train / old limit (bytes sent by Pool.map)", "ours .rec train",
         "decode, %d processes, bytes sent by Pool.map (old limit)" % workers, None),
        ("ours LMDB train / ours .rec train", "ours LMDB train", "ours .rec train", 0.9),
        ("ours .rec train: our batchify / Gluon's", "ours .rec train",
         "ours .rec train, Gluon's default batchify", None),
        *_CLS_RATIOS,
        ("ours .rec train / DALI crop 320 (image only)", "ours .rec train",
         "DALI CPU crop 320+normalize, image only", None),
        *READ_RATIOS,
        # validation decodes every image and mask: the target is the decode floor's (below)
        ("convert pass-through / raw copy", "ours convert pass-through, %d workers" % workers,
         "raw copy of the files, 1 process", None),
    ]


def _report(say, workers, results, cpu, index, rss, scaled, scale, more) -> dict:
    """Print the rates, CPU, index, scale and RSS tables, then every ratio against its
    target, the notes and each step's time; returns the ratio table."""
    conv_table, slow, notes, seconds = more
    say("")
    say("%-56s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-56s %12.0f" % (k, v))
    _say_cpu(say, cpu)
    say("")
    say("%-56s %12s" % ("index (scaled to 1M records)", "value"))
    for k, v in index.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    if scaled:
        _say_scale(say, scaled, scale)
    if rss:
        say("per-worker RSS after epochs 1..3, MB, private (+ shared batch segments): %s"
            % "; ".join("worker %d: %s" % (k, " ".join("%.0f (+%.0f)" % e[k] for e in rss))
                        for k in range(len(rss[0]))))
    say("")
    table = _ratio_table(_ratios(workers), results, say)
    uint8 = _sibling("bench_uint8")
    _ratio_table(uint8.RATIOS, results, say, table)
    _ratio_table(_CLS_CPU_RATIOS + uint8.CPU_RATIOS, cpu, say, table)

    def row(name, value, target, lower=False):
        _ratio_row(table, say, name, value, target, lower)

    for name, value in conv_table.items():  # bench_convert.py's rows, with its targets
        row(name, value, *conv_table.targets.get(name, (None, False)))
    row("index bytes/record", index["ours bytes/record"], 16.5, lower=True)
    row("index load s per 1M records", index["ours load s per 1M"], 0.1, lower=True)
    row("index load s per 1M, text .idx only", index["ours (text .idx) load s per 1M"], None)
    row("index: forked worker's private MB per 1M", index["ours forked private MB per 1M"],
        None)
    if rss and len(rss) >= 3:
        for k, what in ((0, "private"), (1, "shared")):
            change = max(abs(e3[k] / e1[k] - 1) if e1[k] else 0.0
                         for e1, e3 in zip(rss[0], rss[-1]))
            row("worker RSS change, epoch 1->3, %s" % what, change, 0.05 if k == 0 else None,
                lower=True)
    for args in _scale_rows(scaled, scale) if scaled else ():
        row(*args)
    for k, v in slow.items():
        row(k, v, 0.9 if k.startswith("LMDB / RecordIO") else None)
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    say("")
    say("%-56s %12s" % ("step (wall s)", "s"))
    for k, v in seconds.items():
        say("%-56s %12.0f" % (k, v))
    return table


class RatioTable(dict):
    """``{ratio name: value}`` of the rows printed, and ``targets``: ``{name: (target,
    lower)}`` (``target`` None: no target; ``lower``: the value must not exceed it), so a
    step's rows can be printed again in the full run's table with their targets."""

    def __init__(self):
        super().__init__()
        self.targets = {}


#: Where a ratio's target is a step on the way, the value the project aims at after it.
DIRECTIONS = {"ours .rec train / decode limit N": 1.0}


def _ratio_row(table: dict, say, name: str, value: float, target, lower=False) -> None:
    table[name] = value
    if isinstance(table, RatioTable):
        table.targets[name] = (target, lower)
    ok = target is not None and (value <= target if lower else value >= target)
    verdict = "" if target is None else ("met" if ok else "MISSED")
    if name in DIRECTIONS:
        verdict += " (direction %.2f)" % DIRECTIONS[name]
    say("%-56s %8.2f %8s  %s" % (name, value, "-" if target is None else
                                  ("<=%.2f" if lower else "%.2f") % target, verdict))


def _ratio_table(ratios, results: dict, say, table: Optional[dict] = None) -> dict:
    """Print the header and every ratio whose rows were measured; returns a
    :class:`RatioTable`. Given ``table`` (the rows printed so far), add to it without a
    second header."""
    if table is None:
        say("%-56s %8s %8s  %s" % ("ratio (same run)", "value", "target", ""))
        table = RatioTable()
    for name, a, b, target in ratios:
        if a not in results or (isinstance(b, str) and b not in results):
            continue
        _ratio_row(table, say, name, results[a] / (b if not isinstance(b, str) else results[b]),
                   target)
    return table


def run_read_bench(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
                   quick: bool = False) -> dict:
    """Only :func:`read_rates` (``--reads-only``): the dataset made (or reused) and packed
    into a ``.rec`` and an LMDB, then the raw, cold LMDB and cold loader rows and their
    ratios; returns ``{"rates", "ratios"}``."""
    from gluon_data.convert import convert

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    voc = make_dataset(workdir, n)
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    convert(voc, rec, "voc", split="train", workers=workers, overwrite=True)
    convert(rec, lm, overwrite=True)
    jpg_dir = os.path.join(voc, "JPEGImages")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    results, notes = read_rates(rec, lm, jpg_files, workers, quick, _seg_train_kw(), say)
    say("")
    say("%-56s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-56s %12.0f" % (k, v))
    say("")
    table = _ratio_table(READ_RATIOS, results, say)
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    return {"rates": results, "ratios": table}


def _pipeline_share(dataset, batchify, k, workers, barrier, done):  # pragma: no cover - child
    idx = list(range(k, len(dataset), workers))
    batchify([dataset[i] for i in idx[:16]])  # warm: pools, libraries, the staging plan
    barrier.wait()
    c0 = time.process_time()
    for s in range(0, len(idx), 16):
        batchify([dataset[i] for i in idx[s:s + 16]])
    done.put((len(idx), time.process_time() - c0))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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

    from gluon_data.batchify import SegmentationBatchify
    from gluon_data.convert import convert
    from gluon_data.datasets import SegmentationRecordDataset

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
    lim1, limn = "decode limit, OpenCV, 1 process", "decode limit, OpenCV, %d processes" % workers
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gluon-data bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="bench-data", help="dataset and outputs (reused)")
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help="200 images, fewer conversions, a 100k-record index: a smoke run "
                        "under a minute")
    p.add_argument("--dali-python", default=os.environ.get("GLUON_DATA_DALI_PYTHON"),
                   help="a Python that has nvidia-dali (e.g. a separate venv with "
                        "`pip install nvidia-dali-cuda120`) to measure DALI's CPU pipeline")
    p.add_argument("--scale", type=int, default=10_000_000,
                   help="records of the scale step (a tiny-record .rec opened by 8 workers at "
                        "once; not run by --quick; 0 skips it)")
    p.add_argument("--only", choices=("all", "scale", "segmentation", "reads",
                                      "classification"), default="all",
                   help="run only some rows: 'scale' is the scale step (--scale records); "
                        "'segmentation' is train against the decode limit, with CPU per item "
                        "(400 images unless --num-images is given; ~1-2 min); 'reads' is the "
                        "raw, cold LMDB and cold loader read rows and their ratios (a few "
                        "minutes); 'classification' is the stock im2rec .rec, its 4 shards, the "
                        "decode-only and ImageNet-recipe loaders, ImageRecordIter and (with "
                        "--dali-python) DALI's CPU pipeline")
    p.add_argument("--reads-only", action="store_const", dest="only", const="reads",
                   help="the same as --only reads")
    a = p.parse_args(argv)
    if a.only == "scale":
        run_scale(a.workdir, a.scale)
        return 0
    if a.only == "segmentation":
        n = a.num_images if any(x.startswith("--num-images") for x in (argv or sys.argv)) \
            else 400
        seg_bench(a.workdir + "-seg%d" % n, n, a.workers, out=sys.stdout)
        return 0
    n = 200 if a.quick else a.num_images
    workdir = a.workdir + ("-quick" if a.quick else "")
    if a.only == "reads":
        run_read_bench(workdir, n, a.workers, quick=a.quick)
        return 0
    if a.only == "classification":
        run_classification(workdir, n, a.workers, dali_python=a.dali_python,
                           epochs=1 if a.quick else 3)
        return 0
    run_bench(workdir, n, a.workers, quick=a.quick, dali_python=a.dali_python,
              scale=0 if a.quick else a.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
