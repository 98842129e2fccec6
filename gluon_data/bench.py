"""``gluon-data bench``: our loaders and the baselines side by side, in one run, as ratios.

Makes (or reuses) a VOC-like dataset of photographic-looking JPEGs (300-500 px, tens of KB)
with palette masks, packs it, and measures in one run:

* conversion: ours (pass-through and re-encode, 1 and N workers) against ``im2rec`` and a raw
  copy of the same files;
* the decode limit: image + mask bytes from memory with OpenCV, 1 and N processes;
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

This machine is shared and noisy: compare ratios from one run, never absolute numbers from
different runs.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from typing import Optional, Tuple

import numpy as np

__all__ = ["run_bench", "index_costs", "main"]


def _photo(rng, h, w):
    """A smooth random 'photo' that compresses like one (tens of KB at q=90)."""
    import cv2
    small = rng.integers(0, 255, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    noise = rng.normal(0, 12, (h, w, 3))
    return np.clip(img + noise, 0, 255).astype(np.uint8)


def make_dataset(root: str, n: int, seed: int = 0) -> str:
    """VOC layout with ``n`` JPEG photos (300-500 px) and palette masks."""
    from PIL import Image

    from .sample import _save_palette_png, synthetic_pair
    voc = os.path.join(root, "VOC2012")
    if os.path.exists(os.path.join(voc, "ImageSets", "Segmentation", "train.txt")):
        return voc
    rng = np.random.default_rng(seed)
    for d in ("JPEGImages", "SegmentationClass", os.path.join("ImageSets", "Segmentation")):
        os.makedirs(os.path.join(voc, d), exist_ok=True)
    names = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(300, 501, size=2))
        _, mask = synthetic_pair(rng, h, w)
        name = "2012_%06d" % i
        Image.fromarray(_photo(rng, h, w)).save(os.path.join(voc, "JPEGImages", name + ".jpg"),
                                                quality=90)
        _save_palette_png(mask, os.path.join(voc, "SegmentationClass", name + ".png"))
        names.append(name)
    for split in ("train", "val", "trainval"):  # gluoncv's split 'train' reads trainval.txt
        with open(os.path.join(voc, "ImageSets", "Segmentation", split + ".txt"), "w") as f:
            f.write("".join(x + "\n" for x in names))
    return voc


def _decode_pairs(pairs):
    import cv2
    cv2.setNumThreads(1)
    for img, mask in pairs:
        cv2.imdecode(np.frombuffer(img, np.uint8), cv2.IMREAD_COLOR)
        cv2.imdecode(np.frombuffer(mask, np.uint8), cv2.IMREAD_UNCHANGED)
    return len(pairs)


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


def _loader_rates(pipelines, workers: int, epochs: int, rss=None, between=None) -> dict:
    """Best items/s of each ``(name, dataset, batchify)`` through
    ``DataLoader(batch_size=16, shuffle=True, num_workers=workers)``. Every loader first runs
    one whole epoch (workers started, caches warm, nothing left unread), then each round runs
    one epoch of every loader in turn, so a change of load on this shared machine hits them
    all alike. ``rss`` collects the first loader's per-worker RSS after every round;
    ``between`` runs after every round."""
    import mxnet as mx
    loaders = {}
    for name, dataset, batchify in pipelines:
        loaders[name] = mx.gluon.data.DataLoader(dataset, batch_size=16, shuffle=True,
                                                 num_workers=workers, batchify_fn=batchify,
                                                 last_batch="keep")
        for _ in loaders[name]:
            pass
    best = dict.fromkeys(loaders, 0.0)
    for _ in range(epochs):
        for k, (name, loader) in enumerate(loaders.items()):
            t0, seen = time.perf_counter(), 0
            for batch in loader:
                seen += batch[0].shape[0]
            best[name] = max(best[name], seen / (time.perf_counter() - t0))
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


def _consume(read, order) -> None:
    """Read records one at a time, as a loader does (not hoarding them all in memory)."""
    total = 0
    for i in order:
        total += len(read(i))


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

    from .recordio import RecordFile, RecordWriter, write_binary_index

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
    openers = {"ours": lambda: RecordFile(rec),
               "ours (text .idx)": lambda: RecordFile(text_rec),
               "stock": lambda: mx.recordio.MXIndexedRecordIO(idx, rec, "r")}
    readers = {"ours": lambda f: int(f._offsets.sum()) + int(f._ends.sum()),
               "ours (text .idx)": lambda f: int(f._offsets.sum()) + int(f._ends.sum()),
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


def _dali_rate(python: str, rec: str, workers: int, n: int, recipe: str) -> float:
    """DALI's CPU pipeline on ``rec``, run by an interpreter that has DALI; items/s.
    ``recipe`` ``crop320``: decode, random 320 crop, mirror, normalize to float CHW;
    ``rrc224``: DALI's ImageNet recipe (decode a random area/aspect region, resize to 224,
    mirror, normalize) — what ``RandomResizedCrop(224)`` + flip + ``ToTensor`` +
    ``Normalize`` do."""
    code = r"""
import sys, time
from nvidia.dali import pipeline_def, fn, types
rec, idx, threads, n, recipe = (sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                sys.argv[5])
@pipeline_def(batch_size=16, num_threads=threads, device_id=None)
def pipe():
    jpegs, labels = fn.readers.mxnet(path=[rec], index_path=[idx], random_shuffle=True,
                                     name="r")
    norm = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip())
    if recipe == "rrc224":
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[0.75, 4.0 / 3])
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, **norm)
    else:
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.crop_mirror_normalize(
            images, crop=(320, 320), crop_pos_x=fn.random.uniform(range=(0, 1)),
            crop_pos_y=fn.random.uniform(range=(0, 1)), out_of_bounds_policy="pad", **norm)
    return images, labels
p = pipe()
p.build()
p.run()
t0, seen = time.perf_counter(), 0
while seen < n:
    p.run()
    seen += 16
print(seen / (time.perf_counter() - t0))
"""
    res = subprocess.run([python, "-c", code, rec, rec[:-4] + ".idx", str(workers), str(n),
                          recipe],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError("DALI run failed: %s" % res.stderr.strip()[-500:])
    return float(res.stdout.strip().splitlines()[-1])


def run_bench(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
              quick: bool = False, dali_python: Optional[str] = None,
              index_records: Optional[int] = None, epochs: int = 3) -> dict:
    """Run every measurement once (each loader: the best of ``epochs`` epochs) and print the
    table; returns ``{"rates", "ratios", "index", "rss"}``."""
    import mxnet as mx
    from mxnet.gluon.data.vision import transforms

    from .batchify import SegmentationBatchify, StackBatchify
    from .convert import convert
    from .datasets import ImageRecordDataset, SegmentationLMDBDataset, SegmentationRecordDataset
    from .recordio import RecordFile

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) + palette masks in %s" % (n, workdir))
    voc = make_dataset(workdir, n)
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    png_files = [os.path.join(png_dir, f) for f in sorted(os.listdir(png_dir))]
    results, notes = {}, {}
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")

    # -- conversion ------------------------------------------------------------------
    say("conversion ...")
    results["raw copy of the files, 1 process"] = _rate(
        lambda: _raw_copy(jpg_files + png_files, os.path.join(workdir, "copy.bin")), n)
    for w in ([1, workers] if not quick and workers > 1 else [workers]):
        t0 = time.perf_counter()
        convert(voc, rec, "voc", split="train", workers=w, overwrite=True)
        results["ours convert pass-through, %d workers" % w] = n / (time.perf_counter() - t0)
    for w in ([1, workers] if not quick and workers > 1 else [workers]):
        t0 = time.perf_counter()
        convert(voc, os.path.join(workdir, "reenc.rec"), "voc", split="train", workers=w,
                overwrite=True, encoding="jpg", quality=90)
        results["ours convert re-encode, %d workers" % w] = n / (time.perf_counter() - t0)
    convert(rec, lm, overwrite=True)  # the same records as the .rec just written
    cls_root = os.path.join(workdir, "cls")
    os.makedirs(cls_root, exist_ok=True)
    lst = os.path.join(cls_root, "stock.lst")
    with open(lst, "w") as f:
        f.write("".join("%d\t%d\tJPEGImages/%s\n" % (i, i % 20, os.path.basename(p))
                        for i, p in enumerate(jpg_files)))
    for mode, threads in [("pass-through", workers)] + (
            [("re-encode", 1), ("re-encode", workers)] if not quick else []):
        prefix = os.path.join(cls_root, "stock" if mode == "pass-through" else "reenc")
        if mode != "pass-through":
            shutil.copy(lst, prefix + ".lst")
        args = ["--pass-through"] if mode == "pass-through" else ["--quality", "90"]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, im2rec, *args, "--num-thread", str(threads), prefix,
                        voc], check=True, capture_output=True)
        results["im2rec %s, %d threads" % (mode, threads)] = n / (time.perf_counter() - t0)
    stock_rec = os.path.join(cls_root, "stock.rec")

    # -- decode limit ------------------------------------------------------------------
    say("decode limit ...")
    pairs = [(open(a, "rb").read(), open(b, "rb").read()) for a, b in zip(jpg_files, png_files)]
    say("mean JPEG size %.1f KB" % (np.mean([len(a) for a, _ in pairs]) / 1024))
    results["decode limit, OpenCV, 1 process"] = _rate(lambda: _decode_pairs(pairs), n)
    chunks = [pairs[i::workers] for i in range(workers)]
    dl_key = "decode limit, OpenCV, %d processes" % workers

    def decode_limit():  # best of the rounds run between the loaders (the machine is noisy)
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            pool.map(_decode_pairs, [pairs[:2]] * workers)  # start-up outside the timing
            rate = _rate(lambda: sum(pool.map(_decode_pairs, chunks)), n)
        results[dl_key] = max(results.get(dl_key, 0.0), rate)

    decode_limit()

    # -- segmentation train pipelines, same sizes and transform ---------------------------
    say("segmentation train pipelines ...")
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    kw = dict(mode="train", base_size=400, crop_size=320, transform=tf)
    from gluoncv.data import VOCSegmentation
    gcv = VOCSegmentation(root=workdir, split="train", **kw)
    batchify = SegmentationBatchify(channels_first=True)
    rss = []
    results.update(_loader_rates([
        ("ours .rec train", SegmentationRecordDataset(rec, seed=0, **kw), batchify),
        ("ours LMDB train", SegmentationLMDBDataset(lm, split="train", seed=0, **kw), batchify),
        ("ours .rec train, Gluon's default batchify",
         SegmentationRecordDataset(rec, seed=0, **kw), None),
        ("gluoncv VOCSegmentation train", gcv, None),
    ], workers, max(epochs, 3), rss=rss, between=decode_limit))

    def dali(name, path, recipe):  # optional: only with --dali-python
        if dali_python:
            try:
                results[name] = _dali_rate(dali_python, path, workers, n, recipe)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                notes["DALI"] = str(e)

    dali("DALI CPU crop 320+normalize, image only", rec, "crop320")

    # -- classification on a stock im2rec .rec -------------------------------------------
    say("classification ...")
    cb = _CountBatchify()
    recipe = transforms.Compose([transforms.RandomResizedCrop(224),
                                 transforms.RandomFlipLeftRight(), transforms.ToTensor(),
                                 transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    stock_ds = mx.gluon.data.vision.ImageRecordDataset
    results.update(_loader_rates([
        ("stock ImageRecordDataset", stock_ds(stock_rec), cb),
        ("ours ImageRecordDataset", ImageRecordDataset(stock_rec), cb),
        ("stock ImageRecordDataset + RandomResizedCrop 224 recipe",
         stock_ds(stock_rec).transform_first(recipe), None),
        ("ours ImageRecordDataset + RandomResizedCrop 224 recipe",
         ImageRecordDataset(stock_rec).transform_first(recipe), StackBatchify()),
    ], workers, epochs))
    dali("DALI CPU RandomResizedCrop 224 recipe", stock_rec, "rrc224")
    it = mx.io.ImageRecordIter(path_imgrec=stock_rec, data_shape=(3, 224, 224), batch_size=16,
                               preprocess_threads=workers, rand_crop=True)
    t0, seen = time.perf_counter(), 0
    for b in it:
        seen += 16 - b.pad
    results["stock ImageRecordIter (crop 224)"] = seen / (time.perf_counter() - t0)

    # -- raw reads, warm and cold ------------------------------------------------------------
    say("raw reads ...")
    f = RecordFile(rec)
    stock = mx.recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r")
    order = [int(i) for i in np.random.default_rng(0).permutation(len(f))]

    def scan():
        total = 0
        for payload in f.scan():
            total += len(payload)

    def cat():
        subprocess.run(["cat", rec], stdout=subprocess.DEVNULL, check=True)

    cold_ok = True
    readers = [("cat .rec", cat), ("ours sequential reads", scan),
               ("ours random reads", lambda: _consume(f.read, order)),
               ("stock read_idx random reads", lambda: _consume(stock.read_idx, order))]
    for state, rounds in (("warm", 5), ("cold", 3)):
        for _ in range(rounds):  # rounds of every reader in turn; each keeps its best
            for name, fn in readers:
                if state == "cold":
                    cold_ok = _evict([rec]) and cold_ok
                else:
                    fn()  # the page cache holds the file
                key = "%s (%s)" % (name, state)
                results[key] = max(results.get(key, 0.0), _rate(fn, len(f)))
    if cold_ok:
        _evict(jpg_files + png_files)
        results["small files, read each (cold)"] = _rate(
            lambda: [open(p, "rb").read() and None for p in jpg_files], n)
    else:
        notes["cold"] = "posix_fadvise unavailable: cold rows measured warm"

    # -- index -------------------------------------------------------------------------
    say("index ...")
    index = index_costs(workdir, index_records or (100_000 if quick else 1_000_000))

    # -- report ------------------------------------------------------------------------
    dl = results["decode limit, OpenCV, %d processes" % workers]
    raw_copy = results["raw copy of the files, 1 process"]
    conv = "ours convert pass-through, %d workers" % workers
    ratios = [
        ("ours .rec train / gluoncv train", "ours .rec train", "gluoncv VOCSegmentation train",
         3.0),
        ("ours .rec train / decode limit N", "ours .rec train", dl, 1.0),
        ("ours LMDB train / ours .rec train", "ours LMDB train", "ours .rec train", 0.9),
        ("ours .rec train: our batchify / Gluon's", "ours .rec train",
         "ours .rec train, Gluon's default batchify", None),
        ("ours cls / stock ImageRecordDataset", "ours ImageRecordDataset",
         "stock ImageRecordDataset", 1.5),
        ("ours cls / stock ImageRecordIter", "ours ImageRecordDataset",
         "stock ImageRecordIter (crop 224)", 1.5),
        ("ours cls recipe / stock cls recipe", "ours ImageRecordDataset + RandomResizedCrop "
         "224 recipe", "stock ImageRecordDataset + RandomResizedCrop 224 recipe", None),
        ("ours cls recipe / DALI same recipe", "ours ImageRecordDataset + RandomResizedCrop "
         "224 recipe", "DALI CPU RandomResizedCrop 224 recipe", 1.0),
        ("ours .rec train / DALI crop 320 (image only)", "ours .rec train",
         "DALI CPU crop 320+normalize, image only", None),
        ("sequential reads / cat (warm)", "ours sequential reads (warm)", "cat .rec (warm)",
         0.8),
        ("sequential reads / cat (cold)", "ours sequential reads (cold)", "cat .rec (cold)",
         0.8),
        ("random reads / stock read_idx (warm)", "ours random reads (warm)",
         "stock read_idx random reads (warm)", 1.0),
        ("random reads / stock read_idx (cold)", "ours random reads (cold)",
         "stock read_idx random reads (cold)", 1.0),
        ("cold .rec scan / cold small files", "ours sequential reads (cold)",
         "small files, read each (cold)", None),
        ("convert pass-through / raw copy", conv, raw_copy, 0.8),
        ("convert re-encode: N / 1 workers", "ours convert re-encode, %d workers" % workers,
         "ours convert re-encode, 1 workers", 1.5 if workers > 1 else None),
    ]
    say("")
    say("%-56s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-56s %12.0f" % (k, v))
    say("")
    say("%-56s %12s" % ("index (scaled to 1M records)", "value"))
    for k, v in index.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    if rss:
        say("per-worker RSS after epochs 1..3, MB, private (+ shared batch segments): %s"
            % "; ".join("worker %d: %s" % (k, " ".join("%.0f (+%.0f)" % e[k] for e in rss))
                        for k in range(len(rss[0]))))
    say("")
    say("%-56s %8s %8s  %s" % ("ratio (same run)", "value", "target", ""))
    table = {}

    def row(name, value, target, lower=False):
        table[name] = value
        ok = target is not None and (value <= target if lower else value >= target)
        verdict = "" if target is None else ("met" if ok else "MISSED")
        say("%-56s %8.2f %8s  %s" % (name, value, "-" if target is None else
                                      ("<=%.2f" if lower else "%.2f") % target, verdict))

    for name, a, b, target in ratios:
        if a not in results or (isinstance(b, str) and b not in results):
            continue
        row(name, results[a] / (b if not isinstance(b, str) else results[b]), target)
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
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    return {"rates": results, "ratios": table, "index": index, "rss": rss}


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
    a = p.parse_args(argv)
    n = 200 if a.quick else a.num_images
    workdir = a.workdir + ("-quick" if a.quick else "")
    run_bench(workdir, n, a.workers, quick=a.quick, dali_python=a.dali_python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
