"""Region decoding: what decoding only a crop's box saves, on the benchmark's photo JPEGs.

Rows (one process, CPU time, so hardly moved by other jobs on the machine):

* CPU ms per image of the strict full decode (``codec.decode_image``, then the crop) and of
  ``decode.decode_region`` for the crops the datasets draw: segmentation ``train``
  (``base_size=400, crop_size=320``) and ``RandomResizedCrop(224)``, same seeds, same boxes;
  also ``decode_region(strict=False)``, stopping after the box's last row: what the datasets
  decode for records whose checksum they verified (bytes a conversion decoded strictly).
* items/s and CPU ms per item (main process and workers) of segmentation ``train`` and the
  classification recipe through a DataLoader with region decoding on and off
  (``GLUON_DATA_REGION_DECODE``), in interleaved rounds of the same run.

``rows(seg_rec, cls_rec, workers, rounds)`` returns them for the main benchmark, ``RATIOS``
says which quotients it reports. Alone::

    python benchmarks/bench_region.py --images 300 [--workers 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np

_ENV = "GLUON_DATA_REGION_DECODE"
SEG, CLS = "seg train crop 320", "RandomResizedCrop 224"
SEG_ITEMS, CLS_ITEMS = "seg train", "cls recipe"

# (name, numerator row, denominator row, target): higher is better. Only the classification
# crop has a target: segmentation crops keep ~60 % of the image on average (half of them are
# decoded whole by the REGION_MAX_FRACTION rule), and a loader item costs much more than its
# decode, so those rows are reported, not judged.
RATIOS = (
    ("full / region decode, %s, CPU per image" % SEG, "full decode ms/image, %s" % SEG,
     "region decode ms/image, %s" % SEG, None),
    ("full / region decode, %s, CPU per image" % CLS, "full decode ms/image, %s" % CLS,
     "region decode ms/image, %s" % CLS, 1.1),
    ("%s items/s, region on / off" % SEG_ITEMS, "%s items/s, region on" % SEG_ITEMS,
     "%s items/s, region off" % SEG_ITEMS, None),
    ("%s items/s, region on / off" % CLS_ITEMS, "%s items/s, region on" % CLS_ITEMS,
     "%s items/s, region off" % CLS_ITEMS, None),
    ("%s CPU per item, region off / on" % CLS_ITEMS, "%s CPU ms/item, region off" % CLS_ITEMS,
     "%s CPU ms/item, region on" % CLS_ITEMS, None),
)


@contextlib.contextmanager
def _region(on: bool):
    old = os.environ.get(_ENV)
    os.environ[_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_ENV, None)
        else:
            os.environ[_ENV] = old


def _cls_recipe():
    from mxnet.gluon.data.vision import transforms as VT
    return VT.Compose([VT.RandomResizedCrop(224), VT.RandomFlipLeftRight(), VT.ToTensor(),
                       VT.Normalize([.485, .456, .406], [.229, .224, .225])])


def _datasets(seg_rec: str, cls_rec: str):
    from gluon_data.gluon.datasets import ImageRecordDataset, SegmentationRecordDataset
    seg = SegmentationRecordDataset(seg_rec, mode="train", base_size=400, crop_size=320,
                                    seed=0)
    cls = ImageRecordDataset(cls_rec, seed=0).transform_first(_cls_recipe())
    return seg, cls


def crops(seg_rec: str, cls_rec: str) -> Dict[str, List[Tuple[bytes, tuple, tuple]]]:
    """``{kind: [(jpeg bytes, (h, w), box)]}``: the boxes the two datasets draw (epoch 0)."""
    from gluon_data.format import codec
    from gluon_data.arrays import transforms as T
    seg, cls = _datasets(seg_rec, cls_rec)
    out = {SEG: [], CLS: []}
    for kind, ds, plan in ((SEG, seg, lambda hw: seg._joint.plan(*hw)[0]),
                           (CLS, cls, lambda hw: cls.fast_path.plan(*hw)[0])):
        for i in range(len(ds)):
            buf = codec.unpack(ds._file.view(i), verify=False).image
            hw = codec.image_size(buf)
            with T.sample_context(0, i):
                out[kind].append((buf, hw, plan(hw)))
    return out


def _cpu_ms(fn, items, rounds: int) -> float:
    """Least process CPU ms per item of ``fn(*item)`` over ``rounds`` passes."""
    best = float("inf")
    for _ in range(rounds):
        c0 = time.process_time()
        for item in items:
            fn(*item)
        best = min(best, (time.process_time() - c0) * 1e3 / len(items))
    return best


def decode_rows(boxes, rounds: int) -> Dict[str, float]:
    """CPU ms per image: full strict decode + crop, region decode, region decode stopping
    after the box (``strict=False``), per kind of crop, the three interleaved round by
    round."""
    from gluon_data.format import codec, decode
    ext = decode._jpegregion

    def full(buf, hw, box):
        y0, x0, y1, x1 = box
        return codec.decode_image(buf, 1)[y0:y1, x0:x1]

    def region(buf, hw, box):
        return decode.decode_region(buf, box, 1)

    def stop_after_box(buf, hw, box):
        return decode.decode_region(buf, box, 1, strict=False)

    out: Dict[str, float] = {}
    for kind, items in boxes.items():
        runs = [("full decode", full), ("region decode", region)]
        if ext is not None:
            runs.append(("region decode stopping after the box (verified records)",
                         stop_after_box))
        for _ in range(rounds):
            for name, fn in runs:
                key = "%s ms/image, %s" % (name, kind)
                out[key] = min(out.get(key, float("inf")), _cpu_ms(fn, items, 1))
        fractions = [(b[2] - b[0]) * (b[3] - b[1]) / (hw[0] * hw[1]) for _, hw, b in items]
        out["mean box fraction of the image, %s" % kind] = float(np.mean(fractions))
    return out


def threshold_table(boxes, rounds: int) -> List[Tuple[str, int, float, float]]:
    """Full decode vs the region decoder on every box (no threshold), by box fraction of
    the image: ``(bucket, images, full ms, region ms)``, to place REGION_MAX_FRACTION."""
    from gluon_data.format import codec, decode
    if decode._jpegregion is None:
        return []
    items = [it for kind in boxes.values() for it in kind]
    edges = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01]
    table = []
    for lo, hi in zip(edges, edges[1:]):
        part = [it for it in items
                if lo <= (it[2][2] - it[2][0]) * (it[2][3] - it[2][1]) / np.prod(it[1]) < hi]
        if not part:
            continue
        full = _cpu_ms(lambda b, hw, box: codec.decode_image(b, 1), part, rounds)
        region = _cpu_ms(lambda b, hw, box: decode._jpegregion.decode(b, *box, 1), part, rounds)
        table.append(("%.1f-%.1f" % (lo, min(hi, 1.0)), len(part), full, region))
    return table


def _proc_cpu_s(pid: int) -> float:
    if pid == os.getpid():
        return time.process_time()  # finer than /proc's clock ticks
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def loader_rows(seg_rec: str, cls_rec: str, workers: int, rounds: int) -> Dict[str, float]:
    """Best items/s and least CPU ms per item of each (dataset, region on/off) loader, one
    epoch of each in turn per round. Each loader's workers start with its setting."""
    import mxnet as mx
    loaders = {}
    for on in (True, False):
        with _region(on):
            seg, cls = _datasets(seg_rec, cls_rec)
            for name, ds in ((SEG_ITEMS, seg), (CLS_ITEMS, cls)):
                key = "%s %%s, region %s" % (name, "on" if on else "off")
                loaders[key] = (on, mx.gluon.data.DataLoader(
                    ds, batch_size=16, shuffle=True, num_workers=workers, last_batch="keep"))
    out: Dict[str, float] = {}
    for _ in range(rounds + 1):  # the first round warms up (workers, caches), untimed
        for key, (on, loader) in loaders.items():
            pool = getattr(getattr(loader, "_worker_pool", None), "_pool", None) or []
            pids = [os.getpid()] + [p.pid for p in pool]
            with _region(on):
                c0, t0, seen = sum(map(_proc_cpu_s, pids)), time.perf_counter(), 0
                for batch in loader:
                    seen += batch[0].shape[0]
                rate = seen / (time.perf_counter() - t0)
                ms = (sum(map(_proc_cpu_s, pids)) - c0) * 1e3 / seen
            if _ > 0:
                out[key % "items/s"] = max(out.get(key % "items/s", 0.0), rate)
                out[key % "CPU ms/item"] = min(out.get(key % "CPU ms/item", float("inf")), ms)
    return out


def rows(seg_rec: str, cls_rec: str, workers: int = 2, rounds: int = 3) -> Dict[str, float]:
    """Every row (see the module docstring) for a segmentation and a classification .rec."""
    out = decode_rows(crops(seg_rec, cls_rec), rounds)
    out.update(loader_rows(seg_rec, cls_rec, workers, rounds))
    return out


def make_recs(root: str, n: int) -> Tuple[str, str]:
    """The main benchmark's data: ``n`` photo JPEGs (300-500 px) with masks, as a
    segmentation .rec (our converter) and a classification .rec of the same JPEG bytes
    written as stock tools write them (no CRC-32)."""
    import mxnet as mx

    from gluon_data.format import codec
    from gluon_data import convert
    from gluon_data.convert.sample import make_voc
    voc = make_voc(os.path.join(root, "VOC2012"), n, size_range=(300, 500), seed=0,
                   photo=True, prefix="2012")
    seg_rec = os.path.join(root, "seg.rec")
    convert(voc, seg_rec, "voc", split="trainval")
    cls_rec = os.path.join(root, "cls.rec")
    w = mx.recordio.MXIndexedRecordIO(cls_rec[:-4] + ".idx", cls_rec, "w")
    jpegs = sorted(os.listdir(os.path.join(voc, "JPEGImages")))
    for i, name in enumerate(jpegs):
        with open(os.path.join(voc, "JPEGImages", name), "rb") as f:
            w.write_idx(i, codec.pack_classification(i % 20, f.read(), id=i, checksum=False))
    w.close()
    return seg_rec, cls_rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    import cv2
    cv2.setNumThreads(1)
    from gluon_data.format import decode
    print("decoder: %s" % decode.region_decoder())
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="bench_region_") as root:
        seg_rec, cls_rec = make_recs(root, args.images)
        boxes = crops(seg_rec, cls_rec)
        result = decode_rows(boxes, args.rounds)
        result.update(loader_rows(seg_rec, cls_rec, args.workers, args.rounds))
        table = threshold_table(boxes, args.rounds)
    for k, v in result.items():
        print("%-72s %8.3f" % (k, v))
    for name, num, den, target in RATIOS:
        if num in result and den in result:
            print("%-72s %7.2fx (target %s)" % (name, result[num] / result[den], target))
    if table:
        print("\nbox fraction  images  full ms  region ms (no threshold; REGION_MAX_FRACTION=%g)"
              % decode.REGION_MAX_FRACTION)
        for bucket, k, full, region in table:
            print("%-12s %7d %8.3f %10.3f" % (bucket, k, full, region))
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
