#!/usr/bin/env python
"""Where one segmentation ``train`` sample's time goes, stage by stage, in one process.

    python scripts/profile_train.py                       # makes 300 VOC-like samples first
    python scripts/profile_train.py --rec bench-data/voc.rec

Times each stage of ``SegmentationRecordDataset(mode="train", base_size=400, crop_size=320,
transform=ToTensor + Normalize)[i]`` over the records, next to OpenCV decoding the same image and
mask bytes (what ``gluon-data bench`` calls the decode limit). For a sampling profile of the whole
loader, workers included: ``py-spy record -s -o prof.svg -- python -m gluon_data bench --quick``.
"""
import argparse
import os
import tempfile
import time

import cv2
import numpy as np
from mxnet.gluon.data.vision import transforms

from gluon_data import SegmentationRecordDataset, buffers, codec


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rec", help="a segmentation .rec (default: generate 300 samples)")
    ap.add_argument("--samples", type=int, default=300)
    a = ap.parse_args()
    cv2.setNumThreads(1)
    rec = a.rec
    if rec is None:
        from gluon_data import convert
        from gluon_data.cli import load_bench
        make_dataset = load_bench().make_dataset
        work = tempfile.mkdtemp(prefix="gluon-data-profile-")
        voc = make_dataset(work, a.samples)
        rec = os.path.join(work, "voc.rec")
        convert(voc, rec, "voc", split="train")
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    ds = SegmentationRecordDataset(rec, mode="train", base_size=400, crop_size=320,
                                   transform=tf, seed=0)
    n = min(a.samples, len(ds))
    for i in range(min(20, n)):  # warm caches and pools
        ds[i]
    spent = {}

    def tick(stage, t0):
        t = time.perf_counter()
        spent[stage] = spent.get(stage, 0.0) + t - t0
        return t

    t_all = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        rec_, key, offset = ds._record(i)
        t = tick("read + unpack + CRC", t)
        img = ds._decode(codec.decode_image, rec_.image, key, offset, "image", flag=1)
        t = tick("decode JPEG (libjpeg-turbo)", t)
        mask = ds._decode(codec.decode_mask, rec_.mask, key, offset, "mask")
        t = tick("decode mask", t)
        img, mask = ds._joint(img, mask)
        t = tick("augment (RandomScaleCrop)", t)
        m = buffers.samples.wrap(ds._labels(mask, buffers.samples.take(mask.shape, np.int32)))
        t = tick("mask -> int32 NDArray", t)
        x = ds._image_out(img)
        t = tick("ToTensor + Normalize -> NDArray", t)
        del m, x
        tick("free", t)
    total = time.perf_counter() - t_all
    pairs = [codec.unpack(ds._file.read(i), segmentation=True) for i in range(n)]
    t0 = time.perf_counter()
    for p in pairs:
        cv2.imdecode(np.frombuffer(p.image, np.uint8), cv2.IMREAD_COLOR)
        codec.decode_mask(p.mask)
    limit = (time.perf_counter() - t0) / n
    print("%-34s %8s %6s" % ("stage (per sample)", "ms", "share"))
    for stage, v in spent.items():
        print("%-34s %8.3f %5.0f%%" % (stage, v / n * 1e3, 100 * v / total))
    print("%-34s %8.3f" % ("total", total / n * 1e3))
    print("%-34s %8.3f" % ("OpenCV decode of the same bytes", limit * 1e3))


if __name__ == "__main__":
    main()
