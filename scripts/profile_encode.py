#!/usr/bin/env python
"""Where a segmentation item's conversion time goes, step by step (``encode.encode_item``).

    python scripts/profile_encode.py [--items 6]

Writes VOC-size (500x375) and Cityscapes-size (2048x1024) pairs (a JPEG photo and a palette
PNG mask, the masks of ``benchmarks/bench_masks.py``), then times, in CPU ms per item (best of
3 rounds), each step ``encode_item`` takes, with the functions it calls, and the whole
``encode_item`` for each mask encoding.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from bench_masks import SIZES, masks_for  # noqa: E402
from gluon_data.convert import encode as E  # noqa: E402
from gluon_data.convert.sample import synthetic_photo  # noqa: E402
from gluon_data.convert.sources import Item, voc_palette  # noqa: E402
from gluon_data.format import codec  # noqa: E402


def best_ms(fn, items, rounds=3):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for it in items:
            fn(it)
        best = min(best, (time.process_time() - t0) / len(items))
    return best * 1e3


def steps(items, opts):
    """CPU ms per item of each step of encode_item, in its order."""
    data = {it: E._read_bytes(it.image, "image") for it in items}
    mdata = {it: E._read_bytes(it.mask, "mask") for it in items}
    rgb = {it: E._decode_like_reader(data[it], it.image, opts.max_pixels) for it in items}
    mim = {it: E._open_strict(mdata[it], it.mask, "mask", opts.max_pixels) for it in items}
    idx = {it: E._mask_indices(mim[it], it.mask, mdata[it])[0] for it in items}
    out = {
        "read image bytes": best_ms(lambda it: E._read_bytes(it.image, "image"), items),
        "decode JPEG (strict, reader's decoder)": best_ms(
            lambda it: E._decode_like_reader(data[it], it.image, opts.max_pixels), items),
        "pixel statistics": best_ms(lambda it: E._pixel_stats(rgb[it], {}), items),
        "read mask bytes": best_ms(lambda it: E._read_bytes(it.mask, "mask"), items),
        "open + decode mask (Pillow, strict)": best_ms(
            lambda it: E._open_strict(mdata[it], it.mask, "mask", opts.max_pixels), items),
        "mask -> class indices": best_ms(
            lambda it: E._mask_indices(mim[it], it.mask, mdata[it]), items),
    }
    for kind in codec.MASK_ENCODINGS:
        o = opts.__class__(**dict(opts.__dict__, mask_encoding=kind))
        parts = {it: E.mask_part(idx[it], o, it.mask, {}) for it in items}
        out["count ids + encode mask (%s)" % kind] = best_ms(
            lambda it: E.mask_part(idx[it], o, it.mask, {}), items)
        out["read back + compare (%s)" % kind] = best_ms(
            lambda it: E._reads_back(parts[it], it.mask, "mask", o.max_pixels, idx[it]), items)
    pay = {it: (data[it], E.mask_part(idx[it], opts, it.mask, {})) for it in items}
    out["pack + CRC-32"] = best_ms(lambda it: codec.pack_segmentation(*pay[it]), items)
    for kind in codec.MASK_ENCODINGS:
        o = opts.__class__(**dict(opts.__dict__, mask_encoding=kind))
        out["encode_item total (%s)" % kind] = best_ms(lambda it: E.encode_item(it, 0, o), items)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, default=6)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    pal = [v for rgb in voc_palette(256) for v in rgb]
    with tempfile.TemporaryDirectory() as root:
        for name, ((h, w), _, _) in SIZES.items():
            items = []
            for i, m in enumerate(masks_for(name, a.items)):
                ip, mp = (os.path.join(root, "%s%d.%s" % (name[:3], i, e)) for e in ("jpg", "png"))
                Image.fromarray(synthetic_photo(rng, h, w)).save(ip, quality=90)
                im = Image.fromarray(m, mode="P")
                im.putpalette(pal)
                im.save(mp)
                items.append(Item(name=os.path.basename(ip), image=ip, mask=mp))
            opts = E.EncodeOptions(task="segmentation", num_classes=256)
            print("\n%s, CPU ms per item" % name)
            for k, v in steps(items, opts).items():
                print("  %-44s %8.3f" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
