"""``gluon-data bench``: our loaders and the baselines side by side, in one run, as ratios.

Makes (or reuses) a VOC-like dataset of photographic-looking JPEGs (300-500 px, tens of KB)
with palette masks, packs it, and measures items/s of: the decode limit (image + mask bytes
from memory with OpenCV, 1 and N processes), gluoncv's ``VOCSegmentation`` in ``train`` mode,
our segmentation ``train`` pipeline from ``.rec`` and LMDB, stock ``ImageRecordDataset`` /
``ImageRecordIter`` and ours on a stock im2rec ``.rec``, raw record reads against ``cat``, and
conversion against ``im2rec``. This machine is shared and noisy: compare ratios from one run,
never absolute numbers from different runs.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np

__all__ = ["run_bench", "main"]


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


def _loader_rate(dataset, batch_size, workers, batchify, epochs=1):
    import mxnet as mx
    loader = mx.gluon.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                      num_workers=workers, batchify_fn=batchify,
                                      last_batch="keep")
    next(iter(loader))  # warm-up: workers started, caches hot
    best = 0.0
    for _ in range(epochs):
        t0, seen = time.perf_counter(), 0
        for batch in loader:
            seen += batch[0].shape[0]
        best = max(best, seen / (time.perf_counter() - t0))
    return best


class _CountBatchify:
    """Batchify for variable-size classification images: forces decode, returns counts."""

    def __call__(self, samples):
        import mxnet as mx
        return (mx.nd.array([s[0].shape[0] for s in samples]),)


def run_bench(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout) -> dict:
    import mxnet as mx
    from mxnet.gluon.data.vision import transforms

    from .batchify import SegmentationBatchify
    from .convert import convert
    from .datasets import ImageRecordDataset, SegmentationLMDBDataset, SegmentationRecordDataset
    from .recordio import RecordFile

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) + palette masks in %s" % (n, workdir))
    voc = make_dataset(workdir, n)
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    results = {}
    t0 = time.perf_counter()
    convert(voc, rec, "voc", split="train", workers=workers, overwrite=True)
    results["convert pass-through, %d workers" % workers] = n / (time.perf_counter() - t0)
    if not os.path.exists(lm):
        convert(rec, lm)
    jpgs = [open(os.path.join(voc, "JPEGImages", f), "rb").read()
            for f in sorted(os.listdir(os.path.join(voc, "JPEGImages")))]
    pngs = [open(os.path.join(voc, "SegmentationClass", f), "rb").read()
            for f in sorted(os.listdir(os.path.join(voc, "SegmentationClass")))]
    say("mean JPEG size %.1f KB" % (np.mean([len(b) for b in jpgs]) / 1024))
    pairs = list(zip(jpgs, pngs))

    # decode limit
    results["decode limit, OpenCV, 1 process"] = _rate(lambda: _decode_pairs(pairs), n)
    chunks = [pairs[i::workers] for i in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_decode_pairs, [pairs[:2]] * workers)  # start-up outside the timing
        results["decode limit, OpenCV, %d processes" % workers] = _rate(
            lambda: sum(pool.map(_decode_pairs, chunks)), n)

    # segmentation train pipelines, same sizes and transform
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    kw = dict(mode="train", base_size=400, crop_size=320, transform=tf)
    from gluoncv.data import VOCSegmentation
    gcv = VOCSegmentation(root=workdir, split="train", **kw)
    results["gluoncv VOCSegmentation train"] = _loader_rate(gcv, 16, workers, None)
    batchify = SegmentationBatchify(channels_first=True)
    results["ours .rec train"] = _loader_rate(SegmentationRecordDataset(rec, seed=0, **kw), 16,
                                              workers, batchify)
    results["ours LMDB train"] = _loader_rate(SegmentationLMDBDataset(lm, "train", seed=0, **kw),
                                              16, workers, batchify)

    # classification on a stock im2rec .rec
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    cls_root = os.path.join(workdir, "cls")
    os.makedirs(cls_root, exist_ok=True)
    lst = os.path.join(cls_root, "stock.lst")
    with open(lst, "w") as f:
        f.write("".join("%d\t%d\tJPEGImages/%s\n" % (i, i % 20, name) for i, name in
                        enumerate(sorted(os.listdir(os.path.join(voc, "JPEGImages"))))))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, im2rec, "--pass-through", "--num-thread", str(workers),
                    os.path.join(cls_root, "stock"), voc], check=True, capture_output=True)
    results["im2rec pass-through, %d threads" % workers] = n / (time.perf_counter() - t0)
    stock_rec = os.path.join(cls_root, "stock.rec")
    cb = _CountBatchify()
    results["stock ImageRecordDataset"] = _loader_rate(
        mx.gluon.data.vision.ImageRecordDataset(stock_rec), 16, workers, cb)
    results["ours ImageRecordDataset"] = _loader_rate(ImageRecordDataset(stock_rec), 16,
                                                      workers, cb)
    it = mx.io.ImageRecordIter(path_imgrec=stock_rec, data_shape=(3, 224, 224), batch_size=16,
                               preprocess_threads=workers, rand_crop=True)
    t0, seen = time.perf_counter(), 0
    for b in it:
        seen += 16 - b.pad
    results["stock ImageRecordIter (crop 224)"] = seen / (time.perf_counter() - t0)

    # raw reads
    f = RecordFile(rec)
    t0 = time.perf_counter()
    subprocess.run(["cat", rec], stdout=subprocess.DEVNULL, check=True)
    results["cat .rec (warm), records/s"] = len(f) / (time.perf_counter() - t0)
    results["ours sequential reads"] = _rate(lambda: sum(1 for _ in f), len(f))
    order = np.random.default_rng(0).permutation(len(f))
    results["ours random reads"] = _rate(lambda: [f.read(int(i)) for i in order], len(f))
    stock = mx.recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r")
    results["stock read_idx random reads"] = _rate(lambda: [stock.read_idx(int(i))
                                                            for i in order], len(f))

    dl = results["decode limit, OpenCV, %d processes" % workers]
    ratios = [
        ("ours .rec train / gluoncv train", "ours .rec train", "gluoncv VOCSegmentation train",
         3.0),
        ("ours .rec train / decode limit N", "ours .rec train", None, 1.0),
        ("ours LMDB train / ours .rec train", "ours LMDB train", "ours .rec train", 0.9),
        ("ours cls / stock ImageRecordDataset", "ours ImageRecordDataset",
         "stock ImageRecordDataset", 1.5),
        ("ours cls / stock ImageRecordIter", "ours ImageRecordDataset",
         "stock ImageRecordIter (crop 224)", 1.5),
        ("sequential reads / cat", "ours sequential reads", "cat .rec (warm), records/s", 0.8),
        ("random reads / stock read_idx", "ours random reads", "stock read_idx random reads",
         1.0),
    ]
    say("")
    say("%-42s %12s" % ("measurement (items/s)", "rate"))
    for k, v in results.items():
        say("%-42s %12.0f" % (k, v))
    say("")
    say("%-42s %8s %8s  %s" % ("ratio (same run)", "value", "target", ""))
    table = {}
    for name, a, b, target in ratios:
        value = results[a] / (results[b] if b else dl)
        table[name] = value
        say("%-42s %8.2f %8.2f  %s" % (name, value, target, "met" if value >= target
                                       else "MISSED"))
    return {"rates": results, "ratios": table}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gluon-data bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="bench-data", help="dataset and outputs (reused)")
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="200 images: a smoke run under a minute")
    a = p.parse_args(argv)
    n = 200 if a.quick else a.num_images
    workdir = a.workdir + ("-quick" if a.quick else "")
    run_bench(workdir, n, a.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
