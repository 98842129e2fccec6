#!/usr/bin/env python
"""Where one segmentation ``train`` sample's CPU time goes, stage by stage.

    python scripts/profile_train.py                       # makes 400 VOC-like samples first
    python scripts/profile_train.py --rec bench-data/voc.rec

Runs ``SegmentationRecordDataset(mode="train", base_size=400, crop_size=320, transform=ToTensor
+ Normalize)`` + ``SegmentationBatchify`` over the records in batches of 16, in a forked child
(as a DataLoader worker runs it: staged batches, shared segments; ``--in-process`` runs it in
this process instead), timing each stage with ``time.process_time`` (CPU time), the fused
``RandomScaleCrop`` split into its steps. Beside it, OpenCV decoding the same image bytes and
the original PNG masks — what ``gluon-data bench`` calls the decode limit. Every stage is timed
around the same calls the dataset makes, and the total is checked against the untimed
``dataset[i]`` path. For the DataLoader's own costs (worker -> main transfer, the main
process), see ``gluon-data bench --only segmentation``.
"""
import argparse
import multiprocessing
import os
import tempfile
import time

import cv2
import numpy as np
from mxnet.gluon.data.vision import transforms

from gluon_data import SegmentationBatchify, SegmentationRecordDataset
from gluon_data.gluon import buffers
from gluon_data.format import codec
from gluon_data.arrays import transforms as T


def profile(ds, n, pngs):
    batchify = SegmentationBatchify(channels_first=True)
    rsc, spent = ds._joint, {}
    clock = time.process_time

    def tick(stage, t0):
        t = clock()
        spent[stage] = spent.get(stage, 0.0) + t - t0
        return t

    def sample(i):
        t = clock()
        rec, key, offset = ds._record(i)
        t = tick("read + unpack + CRC", t)
        img = ds._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
        t = tick("decode JPEG (libjpeg-turbo)", t)
        mask = ds._decode(codec.decode_mask, rec.mask, key, offset, "mask")
        t = tick("inflate mask (GDRZ)", t)
        h, w = mask.shape
        with ds._sample(i, None):
            flip, oh, ow, y1, x1, blur, sigma = rsc.rng.draw(lambda g: rsc._draw(g, h, w))
        t = tick("draw parameters (sample_rng)", t)
        ch, cw = rsc.size
        vh, vw = min(ch, oh - y1), min(cw, ow - x1)
        if flip:
            x1 = ow - x1 - vw
        ya, yb = rsc._span(y1, vh, oh, h)
        xa, xb = rsc._span(x1, vw, ow, w)
        part_i, part_m = T._resize_pair(img[ya:yb, xa:xb], mask[ya:yb, xa:xb], vw, vh)
        t = tick("resize the kept region (image + mask)", t)
        if flip:
            part_i, part_m = T.as_hwc(cv2.flip(part_i, 1)), cv2.flip(part_m, 1)
        t = tick("mirror", t)
        if (vh, vw) == (ch, cw):
            out_i, out_m = np.ascontiguousarray(part_i), np.ascontiguousarray(part_m)
        else:
            out_i, out_m = T._pad_to(part_i, part_m, ch, cw, rsc.image_fill, rsc.mask_fill)
        t = tick("pad", t)
        if blur:
            out_i = T.as_hwc(cv2.GaussianBlur(out_i, (0, 0), sigmaX=sigma))
        t = tick("blur (half the samples)", t)
        x = ds._image_out(out_i)
        t = tick("ToTensor + Normalize -> NDArray", t)
        m = buffers.samples.wrap(ds._labels(out_m, buffers.samples.take(out_m.shape, np.int32)))
        tick("mask -> int32 NDArray", t)
        return x, m

    for s in range(0, min(32, n), 16):  # warm: pools, the staging plan
        batchify([ds[i] for i in range(s, min(s + 16, n))])
    spent.clear()
    t_all = clock()
    for s in range(0, n, 16):
        samples = [sample(i) for i in range(s, min(s + 16, n))]
        t = clock()
        batch = batchify(samples)
        t = tick("batchify (staged: no copy)" if buffers._get_pool().adopted
                 else "batchify (copy)", t)
        del samples, batch
        tick("free", t)
    total = clock() - t_all
    t0 = clock()
    for s in range(0, n, 16):
        batchify([ds[i] for i in range(s, min(s + 16, n))])
    untimed = clock() - t0
    recs = [codec.unpack(ds._file.read(i), segmentation=True) for i in range(n)]
    t0 = clock()
    for r, png in zip(recs, pngs):
        cv2.imdecode(np.frombuffer(r.image, np.uint8), cv2.IMREAD_COLOR)
        cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_UNCHANGED)
    limit = clock() - t0
    print("%-44s %8s %6s" % ("stage (CPU per sample)", "ms", "share"))
    for stage, v in spent.items():
        print("%-44s %8.3f %5.0f%%" % (stage, v / n * 1e3, 100 * v / total))
    print("%-44s %8.3f" % ("total (timed stage by stage)", total / n * 1e3))
    print("%-44s %8.3f" % ("dataset[i] + batchify, untimed", untimed / n * 1e3))
    print("%-44s %8.3f" % ("decode limit: OpenCV JPEG + PNG mask", limit / n * 1e3))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rec", help="a segmentation .rec made from the bench's VOC folder "
                                  "(default: generate --samples of them)")
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--in-process", action="store_true",
                    help="profile in this process, not a forked worker-like child")
    a = ap.parse_args()
    cv2.setNumThreads(1)
    rec = a.rec
    if rec is None:
        from gluon_data import convert
        from gluon_data.cli import load_bench
        work = tempfile.mkdtemp(prefix="gluon-data-profile-")
        load_bench().make_dataset(work, a.samples)
        rec = os.path.join(work, "voc.rec")
        convert(os.path.join(work, "VOC2012"), rec, "voc", split="train")
    tf = transforms.Compose([transforms.ToTensor(),
                             transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    ds = SegmentationRecordDataset(rec, mode="train", base_size=400, crop_size=320,
                                   transform=tf, seed=0)
    n = min(a.samples, len(ds))
    png_dir = os.path.join(os.path.dirname(rec), "VOC2012", "SegmentationClass")
    names = ds._names or []
    pngs = [open(os.path.join(png_dir, os.path.splitext(nm)[0] + ".png"), "rb").read()
            for nm in names[:n]] if os.path.isdir(png_dir) and len(names) >= n else None
    if pngs is None:  # no PNGs beside the .rec: the mask bytes as stored stand in
        pngs = [codec.unpack(ds._file.read(i), segmentation=True).mask for i in range(n)]
    if a.in_process:
        profile(ds, n, pngs)
        return
    child = multiprocessing.get_context("fork").Process(target=profile, args=(ds, n, pngs))
    child.start()
    child.join()


if __name__ == "__main__":
    main()
