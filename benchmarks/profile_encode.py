"""Where a conversion worker's CPU goes per segmentation item, stage by stage.

Runs the stages of ``gluon_data.convert.encode.encode_item`` (pass-through, the defaults of
``gluon-data convert --layout voc``) on a VOC folder's first items in this one process, with a
worker's set-up (OpenCV single-threaded, the allocator policy), the files read into memory
first, and prints the CPU milliseconds per item of each stage, one line per pass:

    python benchmarks/profile_encode.py VOC2012 [--items 400] [--passes 3]

``benchmarks/bench_convert.py`` makes such a folder under its ``--workdir``. The stages call the
encoder's own functions, so they measure what a worker runs.
"""
import argparse
import time

import cv2

from gluon_data.convert import encode
from gluon_data.convert.options import ConvertOptions
from gluon_data.convert.planning import plan_source
from gluon_data.format import codec
from gluon_data.storage.perprocess import reuse_freed_memory


def profile(voc: str, items: int, passes: int) -> None:
    cv2.setNumThreads(1)
    reuse_freed_memory()
    planned = plan_source(voc, "voc", ConvertOptions(split="train"))
    plan, opts = planned.plan["train"][:items], planned.opts
    files = []
    for it in plan:
        with open(it.image, "rb") as f, open(it.mask, "rb") as g:
            files.append((f.read(), g.read()))
    cap = opts.max_pixels
    for _ in range(passes):
        spent: dict = {}

        def timed(stage, fn, *args):
            t = time.process_time()
            out = fn(*args)
            spent[stage] = spent.get(stage, 0.0) + time.process_time() - t
            return out

        for (image, mask_bytes), it in zip(files, plan):
            rgb = timed("JPEG decode", encode._decode_like_reader, image, it.image, cap)
            info: dict = {}
            timed("pixel stats", encode._pixel_stats, rgb, info)
            im = timed("PNG decode", encode._open_strict, mask_bytes, it.mask, "mask", cap)
            mask, _ = timed("mask ids", encode._mask_indices, im, it.mask, mask_bytes)
            stored = timed("mask encode", encode.mask_part, mask, opts, it.mask, info)
            timed("mask read back", encode._reads_back, stored, it.mask, "mask", cap, mask)
            timed("pack + CRC", lambda: codec.pack_segmentation(image, stored, id=0))
        print("  ".join("%s %.3f" % (k, v / len(plan) * 1e3) for k, v in spent.items()),
              " total %.3f ms/item" % (sum(spent.values()) / len(plan) * 1e3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("voc", help="a VOC2012 folder (JPEGImages, SegmentationClass, ImageSets)")
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args(argv)
    profile(a.voc, a.items, a.passes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
