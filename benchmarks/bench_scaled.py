"""Scaled decoding (``GLUON_DATA_DECODE_SCALED=1``): what it saves and how far its pixels are
from the exact path, on the crops segmentation ``train`` draws.

For each set (Cityscapes size 2048x1024 at ``base_size=1024, crop_size=768``; VOC size
500x375 at ``base_size=400, crop_size=320``), the crops of ``RandomScaleCrop`` are drawn with
fixed seeds; each crop's box is decoded and brought to the size the transform resizes it to:

* exact: ``decode_region`` (the exact region decoder) then ``cv2.resize`` (bilinear), what
  ``train`` computes by default;
* scaled: ``decode_region(..., shrink_to=size)`` with scaled decoding on, then the same
  resize (a copy where the box already has the size).

Rows: the share of crops shrunk 2x or more (the only ones scaled decoding changes), CPU ms
per crop of both paths over all crops (one process, CPU time: hardly moved by other jobs),
their ratio, and the pixel difference over the scaled crops (mean absolute, 99th percentile,
maximum, in 8-bit levels). Alone::

    python benchmarks/bench_scaled.py [--images 24] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Tuple

import cv2
import numpy as np

from gluon_data.arrays import transforms as T
from gluon_data.format import decode

from bench_common import _environ

_ENV = "GLUON_DATA_DECODE_SCALED"
SETS = (("large", (1024, 2048), 1024, 768), ("voc", (375, 500), 400, 320))


def photo_jpeg(h: int, w: int, seed: int) -> bytes:
    """A photographic-looking JPEG (gradients, hard-edged regions, texture, sensor noise;
    quality 90, 4:2:0), about as compressible as a street scene."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([x * 255 / w, y * 255 / h, (x + y) % 256], -1)
    for _ in range(max(8, h * w // 40000)):
        pts = rng.integers(0, (w, h), (int(rng.integers(3, 7)), 2)).astype(np.int32)
        cv2.fillPoly(img, [pts], rng.integers(0, 255, 3).tolist())
    img += rng.normal(0, 14, img.shape).astype(np.float32)
    img = np.clip(cv2.GaussianBlur(img, (0, 0), 0.8), 0, 255).astype(np.uint8)
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90,
                                      cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                                      cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420])[1].tobytes()


def crops(hw: Tuple[int, int], base: int, crop: int, n: int) -> List[Tuple[bytes, tuple, tuple]]:
    """``n`` (jpeg, box, size) triples: one image per seed, ``RandomScaleCrop``'s box and the
    size it resizes the box to."""
    out = []
    for seed in range(n):
        buf = photo_jpeg(hw[0], hw[1], seed)
        t = T.RandomScaleCrop(base, crop, seed=seed)
        box, (_, vh, vw, _, _) = t.plan(*hw)
        out.append((buf, box, (vh, vw)))
    return out


def _scaled(on: bool):
    return _environ(**{_ENV: "1" if on else "0"})


def _exact(buf, box, size):
    part = decode.decode_region(buf, box)
    return cv2.resize(part, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)


def _scaled_path(buf, box, size):
    """What ``train`` computes with scaled decoding on: the box decoded (at a DCT scale
    when shrunk 2x or more), then resized to ``size`` (a copy when it already has it)."""
    part = decode.decode_region(buf, box, shrink_to=size)
    return cv2.resize(part, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)


def _cpu_ms(fn, items, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        c0 = time.process_time()
        for buf, box, size in items:
            fn(buf, box, size)
        best = min(best, (time.process_time() - c0) * 1e3 / len(items))
    return best


def rows(images: int = 24, rounds: int = 3) -> Dict[str, float]:
    """The rows of every set (see the module docstring)."""
    out: Dict[str, float] = {}
    for name, hw, base, crop in SETS:
        items = crops(hw, base, crop, images)
        shrunk = [it for it in items
                  if decode._denom((it[1][2] - it[1][0], it[1][3] - it[1][1]), it[2]) > 1]
        exact_ms = scaled_ms = ex_shrunk = sc_shrunk = float("inf")
        for _ in range(rounds):  # interleaved, the best of each: neither gets the warm cache
            with _scaled(False):
                exact_ms = min(exact_ms, _cpu_ms(_exact, items, 1))
                ex_shrunk = min(ex_shrunk, _cpu_ms(_exact, shrunk, 1) if shrunk else 0.0)
            with _scaled(True):
                scaled_ms = min(scaled_ms, _cpu_ms(_scaled_path, items, 1))
                sc_shrunk = min(sc_shrunk, _cpu_ms(_scaled_path, shrunk, 1) if shrunk else 0.0)
        with _scaled(False):
            refs = [_exact(*it) for it in shrunk]
        with _scaled(True):
            got = [_scaled_path(*it) for it in shrunk]
        diff = (np.concatenate([np.abs(g.astype(np.int16) - r).ravel() for g, r in zip(got, refs)])
                if shrunk else np.zeros(1))
        out.update({
            "%s: crops shrunk 2x or more, %%" % name: 100.0 * len(shrunk) / len(items),
            "%s: exact decode+resize CPU ms/crop" % name: exact_ms,
            "%s: scaled decode CPU ms/crop" % name: scaled_ms,
            "%s: exact / scaled, CPU per crop" % name: exact_ms / scaled_ms,
            "%s: exact / scaled, CPU per shrunk crop" % name:
                ex_shrunk / sc_shrunk if shrunk else 1.0,
            "%s: scaled - exact, mean abs (levels)" % name: float(diff.mean()),
            "%s: scaled - exact, p99 abs (levels)" % name: float(np.percentile(diff, 99)),
            "%s: scaled - exact, max abs (levels)" % name: float(diff.max()),
        })
    return out


#: ``gluon-data bench``'s rows over :func:`rows` (no target: an opt-in, measured and documented)
RATIOS = tuple(("scaled decode, %s crops: exact / scaled, CPU" % name,
                "%s: exact decode+resize CPU ms/crop" % name,
                "%s: scaled decode CPU ms/crop" % name, None) for name, *_ in SETS) + tuple(
    ("scaled decode, %s crops shrunk 2x+: exact / scaled, CPU" % name,
     "%s: exact / scaled, CPU per shrunk crop" % name, 1.0, None) for name, *_ in SETS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    os.environ.pop("GLUON_DATA_REGION_DECODE", None)
    if not decode.region_decoding():
        print("scaled decoding needs the region decoder: %s" % decode.region_decoder(),
              file=sys.stderr)
        return 1
    print("decoder: %s" % decode.region_decoder())
    for k, v in rows(a.images, a.rounds).items():
        print("%-52s %9.2f" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
