"""Reading a dataset from S3 (moto's server on loopback) vs the same files read locally.

    PYTHONPATH=$PWD python scripts/bench_remote.py [--images 300] [--epochs 3]

Packs a generated VOC-style sample once, uploads it (``upload_dataset``: records, index,
metadata last), then times epochs of decoded samples (``SegmentationRecordDataset[i]``, one
process, a seeded shuffled order):

* local cold: the local files with their pages dropped from the page cache
  (``posix_fadvise(DONTNEED)``) before the epoch;
* S3 epoch 1: an empty cache, so the epoch includes downloading the ``.rec`` and ``.idx``
  (verified against their SHA-256) into it;
* S3 epochs 2..N: read from the cached copy with the local fast path; compared with local
  warm epochs in the same run (interleaved rounds, best of each).

Also the same for raw payload reads (``store.read(i)``), where the download is not hidden
behind decoding. Prints ratios (S3 / local). Runs in well under a minute.
"""
import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def drop_cache(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def epoch(fn, order):
    t0 = time.perf_counter()
    for i in order:
        fn(int(i))
    return len(order) / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    from gluon_data import convert
    from gluon_data.gluon.datasets import SegmentationDataset, SegmentationRecordDataset
    from gluon_data.storage.remotefs import filesystem
    from gluon_data.convert.upload import upload_dataset
    from gluon_data.stores.recordio import RecordFile
    from gluon_data.convert.sample import make_voc
    from gluon_data.stores.base import open_store

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        so = {"endpoint_url": "http://127.0.0.1:%d" % server.get_host_and_port()[1]}
        with tempfile.TemporaryDirectory(prefix="gd-bench-remote-") as d:
            voc = make_voc(os.path.join(d, "VOC2012"), num_images=a.images,
                           size_range=(160, 320), seed=a.seed)
            local = os.path.join(d, "voc.rec")
            convert(voc, local, "voc", split="trainval", workers=2)
            files = [local, local[:-4] + ".idx", local[:-4] + ".meta.json"]
            size = sum(os.path.getsize(f) for f in files[:2])
            fs, _ = filesystem("s3://bench", so)
            fs.mkdir("bench")
            t0 = time.perf_counter()
            uri = upload_dataset([local], "s3://bench/voc.rec", storage_options=so)[local]
            up = time.perf_counter() - t0
            print("dataset: %d records, %.1f MB (.rec + .idx); upload %.2f s (%.0f MB/s)"
                  % (a.images, size / 1e6, up, size / 1e6 / up))
            order = np.random.default_rng(a.seed).permutation(a.images)
            rows = []
            for what in ("decoded samples", "raw payloads"):
                cache = os.path.join(d, "cache-" + what.split()[0])
                if what == "decoded samples":
                    loc = SegmentationRecordDataset(local)
                    rem = SegmentationDataset(open_store(uri, storage_options=so,
                                                         cache_dir=cache))
                    lfn, rfn = loc.__getitem__, rem.__getitem__
                else:
                    loc = RecordFile(local)
                    rem = open_store(uri, storage_options=so, cache_dir=cache)
                    lfn, rfn = loc.read, rem.read
                lfn(int(order[0]))  # warm-up (imports, buffer pools), not timed
                drop_cache(files)
                cold = epoch(lfn, order)
                first = epoch(rfn, order)
                warm, later = [], []
                for _ in range(a.epochs - 1):  # interleaved rounds, best of each
                    warm.append(epoch(lfn, order))
                    later.append(epoch(rfn, order))
                rows.append((what, cold, first, max(warm), max(later)))
            print("%-16s %14s %14s %8s %14s %14s %8s" % ("samples/s", "local cold", "S3 epoch 1",
                                                         "ratio", "local warm", "S3 later",
                                                         "ratio"))
            for what, cold, first, warm, later in rows:
                print("%-16s %14.0f %14.0f %7.2fx %14.0f %14.0f %7.2fx"
                      % (what, cold, first, first / cold, warm, later, later / warm))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
