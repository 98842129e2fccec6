"""What every step of ``gluon-data bench`` (``benchmarks/bench.py``) shares: the VOC-like
dataset, the decode limit's forked processes, interleaved loader rounds, page-cache eviction,
CPU and memory readings, and the ratio table. Imported by the
harness as module ``bench_common`` (its folder is on ``sys.path``)."""
from __future__ import annotations

import multiprocessing
import os
import time
from typing import Optional, Tuple
from unittest import mock

import numpy as np

from gluon_data.storage.perprocess import reuse_freed_memory


def make_dataset(root: str, n: int, seed: int = 0) -> str:
    """VOC layout with ``n`` JPEG photos (300-500 px) and palette masks; every split lists
    every image (gluoncv's ``train`` reads ``trainval.txt``)."""
    from gluon_data.convert.sample import make_voc
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


def _jpeg_candidates():
    """Whole-image JPEG decoders the limit may use: OpenCV, and simplejpeg (the decoder of
    record, libjpeg-turbo's TurboJPEG API) where installed."""
    import cv2
    out = {"OpenCV": lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)}
    try:
        import simplejpeg
        out["simplejpeg"] = lambda b: simplejpeg.decode_jpeg(b, "RGB")
    except ImportError:  # pragma: no cover - a core install has it
        pass
    return out


def _mask_candidates():
    """Whole-mask PNG decoders the limit may use: OpenCV (palette expanded to colours) and
    Pillow (the palette indices, what a dataset needs)."""
    import io

    import cv2
    from PIL import Image
    return {"OpenCV": lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED),
            "Pillow": lambda b: np.asarray(Image.open(io.BytesIO(b)))}


_BEST: Optional[tuple] = None  # (jpeg decoder, mask decoder, their names, the pairs)


def _fastest(candidates: dict, items) -> Tuple[str, object]:
    """The candidate with the least CPU time over ``items`` (best of 3 passes each)."""
    def cpu(fn):
        best = float("inf")
        for _ in range(3):
            c0 = time.process_time()
            for b in items:
                fn(b)
            best = min(best, time.process_time() - c0)
        return best
    name = min(candidates, key=lambda k: cpu(candidates[k]))
    return name, candidates[name]


def decode_limit_decoders(pairs) -> str:
    """Choose, on the first pairs, the fastest JPEG and the fastest mask decoder available for
    the decode limit (measured at its best, so no ratio against it flatters us); later calls
    of :func:`_decode_pairs`, and processes forked after this, use them. Returns their names."""
    global _BEST
    import cv2
    cv2.setNumThreads(1)
    sample = pairs[:8]
    jn, jf = _fastest(_jpeg_candidates(), [img for img, _ in sample])
    mn, mf = _fastest(_mask_candidates(), [mask for _, mask in sample])
    _BEST = (jf, mf, "JPEG: %s, mask: %s" % (jn, mn), pairs)
    return _BEST[2]


def _decode_pairs(pairs):
    """Decode every image and mask of ``pairs`` whole, with the decoders the limit chose."""
    if _BEST is None:
        decode_limit_decoders(pairs)
    jpeg, mask = _BEST[0], _BEST[1]
    for img, m in pairs:
        jpeg(img)
        mask(m)
    return len(pairs)


def _decode_share(pairs, k, workers, barrier, done):  # pragma: no cover - forked child
    reuse_freed_memory()  # the allocator policy our workers run with: the limit at its best
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
    (a list) gets the CPU seconds the processes spent per item. The decoders are the fastest
    available on these pairs (:func:`decode_limit_decoders`, chosen before the fork)."""
    if _BEST is None or _BEST[3] is not pairs:
        decode_limit_decoders(pairs)
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
                  before=None, loader=None, cpu=None, batch_size: int = 16) -> dict:
    """Best items/s of each ``(name, dataset, batchify)`` through
    ``DataLoader(batch_size=batch_size, shuffle=True, num_workers=workers)``. Every loader first runs
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
        loaders[name] = make(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
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


def _environ(**values):
    """Environment variables set for the block (inherited by processes forked in it)."""
    return mock.patch.dict(os.environ, values)


def _say_rates(say, results: dict) -> None:
    say("")
    say("%-56s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-56s %12.0f" % (k, v))


def _say_cpu(say, cpu: dict) -> None:
    if cpu:
        say("")
        say("%-56s %12s" % ("CPU ms per item (all processes and threads)", "ms"))
        for k, v in cpu.items():
            say("%-56s %12.3f" % (k, v))


def _seg_train_kw() -> dict:
    """Segmentation ``train`` as every step reads it: base 400, crop 320, ``ToTensor`` +
    ``Normalize``."""
    from mxnet.gluon.data.vision import transforms
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    return dict(mode="train", base_size=400, crop_size=320, transform=tf)


class RatioTable(dict):
    """``{ratio name: value}`` of the rows printed, and ``targets``: ``{name: (target,
    lower)}`` (``target`` None: no target; ``lower``: the value must not exceed it), so a
    step's rows can be printed again in the full run's table with their targets."""

    def __init__(self):
        super().__init__()
        self.targets = {}

    def missed(self) -> list:
        """The names of the rows that have a target and miss it, in the order printed."""
        return [k for k, (target, lower) in self.targets.items()
                if target is not None and not _met(self[k], target, lower)]


def _met(value: float, target: float, lower: bool) -> bool:
    return value <= target if lower else value >= target


#: Where a ratio's target is a step on the way, the value the project aims at after it.
DIRECTIONS = {"ours .rec train / decode limit N": 1.0}


def _ratio_row(table: dict, say, name: str, value: float, target, lower=False) -> None:
    table[name] = value
    if isinstance(table, RatioTable):
        table.targets[name] = (target, lower)
    ok = target is not None and _met(value, target, lower)
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads; this process's own
    from ``time.process_time``, finer than the clock ticks of ``/proc``)."""
    if pid == os.getpid():
        return time.process_time()
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

