"""``gluon-data demo``: generate a VOC-like sample, pack it, and read it back through a
multi-worker Gluon ``DataLoader``."""
from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, cast

import mxnet as mx

from ..convert.demo import pack_sample
from .batchify import SegmentationBatchify
from .datasets import SegmentationRecordDataset

__all__ = ["run_demo"]


def run_demo(workdir: str, num_images: int = 96, workers: int = 2, batch_size: int = 8,
             epochs: int = 2, out=sys.stdout) -> dict:
    """Generate a VOC-like sample, pack it, and read it back through a multi-worker DataLoader."""
    def say(*args):
        print(*args, file=out, flush=True)

    ds = SegmentationRecordDataset(pack_sample(workdir, num_images, workers, say))
    say("3. reading %r" % ds)
    loader = mx.gluon.data.DataLoader(ds, batch_size=batch_size, shuffle=True,
                                      num_workers=workers, batchify_fn=SegmentationBatchify())
    result: Dict[str, Any] = {"records": len(ds), "epochs": []}
    for epoch in range(epochs):
        t0, seen, pixels = time.perf_counter(), 0, 0
        for imgs, masks in loader:
            seen += imgs.shape[0]
            pixels += int((masks >= 0).sum().asscalar())
        dt = time.perf_counter() - t0
        result["epochs"].append({"samples": seen, "seconds": dt})
        say("   epoch %d: %d samples in %d batches, %.0f samples/s, %d labelled pixels"
            % (epoch + 1, seen, len(loader), seen / dt, pixels))
    img, mask = ds[0]
    present = sorted(set(mask.asnumpy().ravel().tolist()) - {-1})
    classes = cast(List[str], ds.classes)  # the sample's (VOC's) classes
    say("4. sample 0: image %s %s, mask %s %s, classes %s"
        % (img.shape, img.dtype.__name__, mask.shape, mask.dtype.__name__,
           [classes[i] for i in present]))
    ok = all(e["samples"] == len(ds) for e in result["epochs"])
    say("%s: %d records read %d times through DataLoader(num_workers=%d)"
        % ("OK" if ok else "MISMATCH", len(ds), epochs, workers))
    result["ok"] = ok
    return result
