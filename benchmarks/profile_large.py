"""Where a large-image ``train`` sample's CPU time goes: ours from ``.rec`` on the bench's
large set (``bench_large.py``: 2048x1024 street scenes, ``base_size=1024, crop_size=768``,
``ToTensor`` + ``Normalize``, batches of 4), stage by stage.

    python benchmarks/profile_large.py [--workdir bench-data] [--images 64] [--epochs 2]
                                       [--env GLUON_DATA_DECODE_SCALED=1 ...]

Two measurements, each under the environment given (region decoding on by default):

* the stages: ``dataset[i]`` + ``SegmentationBatchify`` in a forked child (as a DataLoader
  worker runs them: batches staged in shared segments), under ``cProfile`` with the process
  CPU clock; each stage is the cumulative CPU time of the function that does it (the JPEG
  decode: ``decode_region``, the full decode inside it included; the mask: ``decode_mask``;
  the resize, mirror, pad and blur inside ``RandomScaleCrop.apply``; ``ToTensor`` +
  ``Normalize``: the numpy fast path; batchify ...), per item, and what is left;
* the decode limit's parts: OpenCV's whole JPEG and PNG mask decodes, and the decoder of
  record's whole JPEG decode, CPU per item in this process;
* the DataLoader's own cost: ``DataLoader(batch_size=4, num_workers=N)`` epochs, the CPU per
  item of the main process (receiving the batches: unpickling, mapping the shared segments)
  and of the workers, against the same dataset + batchify in a forked child without a
  DataLoader (the workers' excess is the sending side: pickling, the queue).
"""
from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # the checkout's gluon_data first

import bench_common as common  # noqa: E402 (this folder is sys.path[0] for a script)
import bench_large as large  # noqa: E402

#: stage -> (file suffix, function name) whose cumulative CPU time it is; the resize, mirror,
#: pad and blur are inside the joint transform's apply (its row is what they leave).
STAGES = (
    ("read + unpack + CRC", ("arrays/base.py", "_record")),
    ("draw the crop (plan)", ("arrays/transforms.py", "plan")),
    ("JPEG decode (region / whole)", ("format/decode.py", "decode_region")),
    ("mask decode", ("format/codec.py", "decode_mask")),
    ("resize image + mask", ("arrays/transforms.py", "_resize_pair")),
    ("mirror", ("~", "<flip>")),
    ("pad", ("arrays/transforms.py", "_pad_to")),
    ("blur (half the samples)", ("~", "<GaussianBlur>")),
    ("joint transform: the rest", ("arrays/transforms.py", "apply")),
    ("ToTensor + Normalize", ("arrays/base.py", "_tensor")),
    ("mask -> int32 labels", ("arrays/datasets.py", "_labels")),
    ("batchify", ("gluon/batchify.py", "__call__")),
)
_INSIDE_APPLY = ("resize image + mask", "mirror", "pad", "blur (half the samples)")


def _cum(stats: pstats.Stats, where) -> float:
    suffix, name = where
    return sum(v[3] for (f, _, fn), v in stats.stats.items()
               if fn == name and (f == suffix or f.endswith(suffix)))


def _stages_child(rec, size, epochs, batch, conn):  # pragma: no cover - forked child
    import cv2
    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.gluon.datasets import SegmentationRecordDataset
    cv2.setNumThreads(1)
    ds = SegmentationRecordDataset(rec, seed=0, **large.train_kw(size))
    batchify = SegmentationBatchify(channels_first=True)
    n = len(ds)

    def epoch():
        for s in range(0, n, batch):
            batchify([ds[i] for i in range(s, min(n, s + batch))])

    epoch()  # warm: pools, staging plans, libraries
    c0 = time.process_time()
    for _ in range(epochs):
        epoch()
    plain = (time.process_time() - c0) * 1e3 / (n * epochs)
    prof = cProfile.Profile(time.process_time)
    c0 = time.process_time()
    prof.enable()
    for _ in range(epochs):
        epoch()
    prof.disable()
    total = (time.process_time() - c0) * 1e3 / (n * epochs)
    st = pstats.Stats(prof)
    out = {name: _cum(st, where) * 1e3 / (n * epochs) for name, where in STAGES}
    out["joint transform: the rest"] -= sum(out[k] for k in _INSIDE_APPLY)
    out["other (Python glue, buffers, NDArray wrapping)"] = total - sum(out.values())
    out["total, profiled"] = total
    out["total, not profiled"] = plain
    conn.send(out)


def stage_rows(rec: str, size=large.LARGE_SIZE, epochs: int = 2,
               batch: int = large.BATCH_SIZE) -> dict:
    """CPU ms per item of each stage (see the module docstring), in a forked child."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(False)
    p = ctx.Process(target=_stages_child, args=(rec, size, epochs, batch, send))
    p.start()
    out = recv.recv()
    p.join()
    return out


def loader_rows(rec: str, size=large.LARGE_SIZE, workers: int = 2, epochs: int = 2,
                batch: int = large.BATCH_SIZE) -> dict:
    """CPU ms per item of the DataLoader's main process and of its workers (least over
    ``epochs`` epochs after a warm-up one)."""
    import mxnet as mx
    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.gluon.datasets import SegmentationRecordDataset
    ds = SegmentationRecordDataset(rec, seed=0, **large.train_kw(size))
    loader = mx.gluon.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                      batchify_fn=SegmentationBatchify(channels_first=True),
                                      last_batch="keep")
    pids = [p.pid for p in loader._worker_pool._pool]
    best = {}
    for k in range(epochs + 1):
        m0, w0, seen = time.process_time(), [common._cpu_s(p) for p in pids], 0
        for b in loader:
            seen += b[0].shape[0]
        if k:
            for key, v in (("DataLoader main process", time.process_time() - m0),
                           ("DataLoader workers", sum(common._cpu_s(p) - c
                                                      for p, c in zip(pids, w0)))):
                best[key] = min(best.get(key, float("inf")), v * 1e3 / seen)
    return best


def limit_rows(voc: str, rounds: int = 2) -> dict:
    """CPU ms per item (least of ``rounds`` passes, this process) of what the decode limit
    does, part by part: OpenCV decoding the JPEGs and the PNG masks whole, and, beside it,
    the decoder of record (``codec.decode_image``) on the same JPEGs."""
    import cv2
    import numpy as np
    from gluon_data.format import codec
    jpg, png = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = []
    for f in sorted(os.listdir(jpg)):
        with open(os.path.join(jpg, f), "rb") as a, open(os.path.join(png, f[:-4] + ".png"),
                                                         "rb") as b:
            pairs.append((np.frombuffer(a.read(), np.uint8), np.frombuffer(b.read(), np.uint8)))
    runs = {"decode limit: OpenCV JPEG, whole": lambda j, m: cv2.imdecode(j, cv2.IMREAD_COLOR),
            "decode limit: OpenCV PNG mask, whole":
                lambda j, m: cv2.imdecode(m, cv2.IMREAD_UNCHANGED),
            "decoder of record (simplejpeg), JPEG whole": lambda j, m: codec.decode_image(j, 1)}
    out = {}
    for _ in range(rounds):
        for name, fn in runs.items():
            c0 = time.process_time()
            for j, m in pairs:
                fn(j, m)
            ms = (time.process_time() - c0) * 1e3 / len(pairs)
            out[name] = min(out.get(name, ms), ms)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="bench-data")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                    help="environment of the measurement, e.g. GLUON_DATA_REGION_DECODE=0")
    a = ap.parse_args(argv)
    import cv2
    cv2.setNumThreads(1)
    os.environ.update(kv.split("=", 1) for kv in a.env)
    root = large.large_root(a.workdir, a.images)
    rec = os.path.join(root, "large.rec")
    if not os.path.exists(rec):
        from gluon_data.convert import convert
        convert(large.make_large(root, a.images), rec, "voc", split="train")
    print("%s, env: %s" % (rec, " ".join(a.env) or "(default)"))
    stages = stage_rows(rec, epochs=a.epochs)
    print("%-52s %8s %6s" % ("stage (CPU per item, in a worker-like child)", "ms", "share"))
    for k, v in stages.items():
        print("%-52s %8.2f %5.0f%%" % (k, v, 100 * v / stages["total, profiled"]))
    loader = loader_rows(rec, workers=a.workers, epochs=a.epochs)
    print()
    print("%-52s %8s" % ("DataLoader, batch 4, %d workers (CPU per item)" % a.workers, "ms"))
    for k, v in loader.items():
        print("%-52s %8.2f" % (k, v))
    print("%-52s %8.2f" % ("workers beyond dataset + batchify (sending)",
                           loader["DataLoader workers"] - stages["total, not profiled"]))
    print()
    print("%-52s %8s" % ("the decode limit's parts (CPU per item, 1 process)", "ms"))
    for k, v in limit_rows(os.path.join(root, "VOC2012"), a.epochs).items():
        print("%-52s %8.2f" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
