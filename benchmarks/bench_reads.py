"""``gluon-data bench``'s read rows: raw record reads (sequential and random, warm and cold,
against ``cat`` and stock ``read_idx``), cold LMDB value reads, and the cold and warm
``train`` loaders of the same records; ``--only reads`` runs them alone. Imported by the
harness as module ``bench_reads`` (its folder is on ``sys.path``)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Tuple

import numpy as np

from bench_common import (
    _evict, _loader_rates, _rate, _ratio_table, _seg_train_kw, make_dataset)


_LMDB_COLD = r"""
import os, sys, time
import lmdb, numpy as np
from gluon_data.stores.lmdb_env import close_envs
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.gluon.loader import HintedBatches, SAME_PROCESS_AHEAD  # (imports MXNet: untimed)
path, rounds, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
n = LMDBFile(path, "train").__len__()

def close_all():  # py-lmdb opens an environment once per process; its map holds pages
    close_envs()

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
    (:class:`gluon_data.gluon.loader.HintedBatches`), then its records are read one at a time."""
    from gluon_data.gluon.loader import SAME_PROCESS_AHEAD, HintedBatches
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

    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.gluon.datasets import SegmentationLMDBDataset, SegmentationRecordDataset
    from gluon_data.gluon.loader import DataLoader
    from gluon_data.stores.recordio import RecordFile

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

