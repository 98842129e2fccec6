"""``gluon-data bench``'s index and scale rows: the index's memory and load time against
stock ``MXIndexedRecordIO``, and a ten-million-record ``.rec`` (and manifest) opened by 8
DataLoader-like processes at once; ``--only scale`` runs the scale step alone. Imported by the
harness as module ``bench_scale`` (its folder is on ``sys.path``)."""
from __future__ import annotations

import multiprocessing
import os
import sys
import time

import numpy as np

from bench_common import _environ


def index_costs(workdir: str, n: int) -> dict:
    """Load time and memory of our index and stock MXIndexedRecordIO for ``n`` records,
    scaled to one million, and the private memory a forked child gains reading all of it."""
    import gc
    import tracemalloc

    import mxnet as mx

    from gluon_data.stores.recordio import RecordFile, RecordWriter, write_binary_index

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


def _tiny_rec(path: str, n: int) -> str:
    """``n`` 4-byte records (12 bytes framed) and their ``.idx`` + ``.idx.gdx``, written with
    numpy in chunks (10 M records in seconds); the framing is RecordIO's, payloads fake."""
    from gluon_data.stores.recordio import write_binary_index
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
    from gluon_data.format.meta import FORMAT_NAME, FORMAT_VERSION, dumps_meta, meta_path
    from gluon_data.stores.shards import (MANIFEST_FORMAT, MANIFEST_VERSION, _write_manifest,
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
    from gluon_data.stores.base import open_store
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
    from gluon_data.stores.recordio import RecordFile, index_cache_path, idx_path_for
    import gluon_data.stores  # noqa: F401  (every backend, before the workers fork: their open times are the opens)
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

