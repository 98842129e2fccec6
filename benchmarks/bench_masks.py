"""Mask decoding: what the mask costs a segmentation ``train`` sample, and each mask encoding's
decode, at VOC size (500x375) and Cityscapes size (2048x1024).

Rows (one process, CPU time per call, the best of several rounds, so hardly moved by other jobs):

* ``decode_mask`` of the same masks stored as PNG (OpenCV), ``zraw`` (one zlib stream) and
  ``rle`` (run-length row blocks: the C expansion, and numpy's without it), whole and for the
  rows a ``train`` crop covers;
* a ``train`` sample (``SegmentationDataset(mode="train")``, VOC ``base_size=520,
  crop_size=480``, Cityscapes ``1024/768``) from a ``.rec`` converted with PNG masks, and
  the share of it the PNG mask decode takes;
* each encoding's size in bytes.

Masks are like real ones: VOC's a few filled shapes with 255 outlines (``synthetic_pair``),
Cityscapes' a street scene (sky over an irregular skyline, buildings, road, tens of cars,
people and poles as polygons, an ego-vehicle hood). Alone::

    python benchmarks/bench_masks.py [--images 8]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import cv2
import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gluon_data.arrays import SegmentationDataset  # noqa: E402
from gluon_data.convert import convert  # noqa: E402
from gluon_data.convert.sample import synthetic_pair, synthetic_photo  # noqa: E402
from gluon_data.format import codec, masks  # noqa: E402

SIZES = {"VOC 500x375": ((375, 500), 520, 480), "Cityscapes 2048x1024": ((1024, 2048), 1024,
                                                                         768)}


def street_mask(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A Cityscapes-like label-id mask: large regions, a few tens of objects, 0..33."""
    m = np.full((h, w), 7, np.uint8)  # road
    xs = np.arange(w)
    sky = (h * 0.3 + h * 0.06 * np.sin(xs / (w / 21.0)) + h * 0.03 * np.sin(xs / (w / 157.0)))
    rows = np.arange(h)[:, None]
    m[rows < sky.astype(int)[None, :]] = 23  # sky
    m[(rows >= sky.astype(int)[None, :]) & (rows < h // 2)] = 11  # building
    m[h // 2:h // 2 + h // 40] = 8  # sidewalk
    for _ in range(int(rng.integers(30, 60))):
        cls = int(rng.choice([24, 25, 26, 17, 20, 21, 8, 33, 0, 4, 12, 13]))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(h // 3, h))
        sx, sy = int(rng.integers(w // 60, w // 12)), int(rng.integers(h // 40, h // 8))
        poly = np.stack([cx + rng.integers(-sx, sx, 8), cy + rng.integers(-sy, sy, 8)], 1)
        cv2.fillPoly(m, [cv2.convexHull(poly.astype(np.int32))], cls)
    cv2.ellipse(m, (w // 2, h), (w // 2, h // 7), 0, 180, 360, 1, -1)  # ego vehicle
    return m


def masks_for(name: str, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    (h, w), _, _ = SIZES[name]
    if name.startswith("VOC"):
        return [synthetic_pair(rng, h, w)[1] for _ in range(n)]
    return [street_mask(rng, h, w) for _ in range(n)]


def cpu_ms(fn, args, rounds: int = 5, min_s: float = 0.05) -> float:
    """Best CPU ms per call of ``fn(a)`` over ``args``, of ``rounds`` rounds."""
    for a in args:
        fn(a)
    reps = 1
    while True:
        t0 = time.process_time()
        for _ in range(reps):
            for a in args:
                fn(a)
        if time.process_time() - t0 >= min_s:
            break
        reps *= 2
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(reps):
            for a in args:
                fn(a)
        best = min(best, (time.process_time() - t0) / (reps * len(args)))
    return best * 1e3


def decode_rows(name: str, ms):
    (h, w), base, crop = SIZES[name]
    kinds = {"png": [codec.encode_mask(m) for m in ms],
             "zraw": [codec.encode_raw(m, compress=1) for m in ms],
             "rle": [masks.encode_rle(m) for m in ms]}
    for m, b in zip(ms, kinds["rle"]):
        assert np.array_equal(codec.decode_mask(b), m)
    out = {"%s bytes" % k: float(np.mean([len(b) for b in v])) for k, v in kinds.items()}
    band = (h // 4, h // 4 + min(h, crop * h // base) // 2)  # rows a typical crop keeps
    for k, v in kinds.items():
        out["%s ms" % k] = cpu_ms(codec.decode_mask, v)
    out["rle rows %d:%d ms" % band] = cpu_ms(lambda b: codec.decode_mask(b, rows=band),
                                             kinds["rle"])
    ext, masks._ext = masks._ext, None
    try:
        out["rle (numpy) ms"] = cpu_ms(codec.decode_mask, kinds["rle"])
        out["rle (numpy) rows %d:%d ms" % band] = cpu_ms(
            lambda b: codec.decode_mask(b, rows=band), kinds["rle"])
    finally:
        masks._ext = ext
    out["encode png ms"] = cpu_ms(codec.encode_mask, ms, rounds=2)
    out["encode rle ms"] = cpu_ms(masks.encode_rle, ms, rounds=2)
    return out


def sample_rows(name: str, ms, root: str):
    """CPU ms of a ``train`` sample from a .rec with PNG masks."""
    (h, w), base, crop = SIZES[name]
    rng = np.random.default_rng(1)
    src = os.path.join(root, name.split()[0])
    for d in ("images", "masks"):
        os.makedirs(os.path.join(src, d), exist_ok=True)
    for i, m in enumerate(ms):
        Image.fromarray(synthetic_photo(rng, h, w)).save(
            os.path.join(src, "images", "%03d.jpg" % i), quality=90)
        Image.fromarray(m, mode="L").save(os.path.join(src, "masks", "%03d.png" % i))
    rec = os.path.join(root, name.split()[0] + ".rec")
    convert(src, rec, layout="pairs", mask_encoding="png", num_classes=255, ignore_label=255)
    ds = SegmentationDataset(rec, mode="train", base_size=base, crop_size=crop, seed=0)
    return {"train sample ms (png masks)": cpu_ms(ds.__getitem__, range(len(ds)), rounds=3)}


#: ``gluon-data bench``'s rows over :func:`rows` (higher is better: PNG's CPU over the other's)
RATIOS = tuple(
    (title % name, "%s: png ms" % name, "%s: %s ms" % (name, kind), target)
    for name in SIZES
    for title, kind, target in (("mask decode, %s: PNG / rle", "rle", 4.0),
                                ("mask decode, %s: PNG / rle without the C routine",
                                 "rle (numpy)", None),
                                ("mask decode, %s: PNG / zraw", "zraw", None)))


def rows(images: int = 8) -> dict:
    """The decode rows of both sizes, each key prefixed with its size (``gluon-data bench``)."""
    out = {}
    for name in SIZES:
        ms = masks_for(name, images)
        out.update(("%s: %s" % (name, k), v) for k, v in decode_rows(name, ms).items())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=8)
    a = p.parse_args(argv)
    print("C expansion:", "built" if masks._ext is not None else "absent (numpy)",
          "| numpy", np.__version__)
    with tempfile.TemporaryDirectory() as root:
        for name in SIZES:
            ms = masks_for(name, a.images)
            r = decode_rows(name, ms)
            r.update(sample_rows(name, ms, root))
            print("\n" + name)
            for k, v in r.items():
                print("  %-34s %10.3f" % (k, v))
            png = r["png ms"]
            print("  %-34s %9.1f%%" % ("PNG mask share of a train sample",
                                        100 * png / r["train sample ms (png masks)"]))
            for k in [k for k in r if k.startswith(("zraw ms", "rle")) and "bytes" not in k]:
                print("  %-34s %9.1fx" % ("png / " + k.replace(" ms", ""), png / r[k]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
