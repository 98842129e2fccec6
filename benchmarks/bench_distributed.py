#!/usr/bin/env python
"""What DistributedSampler and a 2-worker dist_sync data path cost over the plain loader.

    PYTHONPATH=$PWD python benchmarks/bench_distributed.py            # ~30 s on 2 cores

Three measurements, each a ratio within one run (the median of rounds that time the two
loaders back to back, alternating which goes first):
1. the sampler alone: planning one ImageNet-sized epoch (1,281,167 samples) for one rank of 8;
2. one process: a Gluon DataLoader reading the training set through ``DistributedSampler``
   vs the same loader given the same indexes as a plain list of ints (the stock path);
3. the same comparison inside each worker of a real 2-worker dist_sync job on 127.0.0.1,
   each reading its shard (every batch also does a kvstore push/pull, as training would).
A ratio is ours / stock throughput: 1.0 means no measurable cost.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def make_data(folder, images=256):
    from gluon_data import convert
    from gluon_data.convert.sample import make_voc
    root = make_voc(os.path.join(folder, "VOC"), num_images=images, size_range=(64, 120),
                    val_fraction=0.01, seed=0)
    return convert(root, os.path.join(folder, "b.rec"), "voc", split="train",
                   workers=1).outputs["train"]


def loader_rates(path, world=1, rank=0, kv=None, rounds=9, batch=8):
    """(stock samples/s, ours samples/s, per-round ratios): medians of ``rounds`` rounds,
    each timing the two loaders back to back (in alternating order)."""
    import mxnet as mx
    from gluon_data import DistributedSampler, SegmentationBatchify, SegmentationRecordDataset
    dataset = SegmentationRecordDataset(path, mode="train", base_size=96, crop_size=64, seed=0)
    sampler = DistributedSampler(len(dataset), world, rank, seed=0, batch_size=batch)
    plain = [int(k) for k in sampler]   # the same indexes, as a stock sampler gives them
    kw = {"batch_size": batch, "batchify_fn": SegmentationBatchify()}
    loaders = {"stock": mx.gluon.data.DataLoader(dataset, sampler=plain, **kw),
               "ours": mx.gluon.data.DataLoader(dataset, sampler=sampler, **kw)}
    if kv is not None:
        kv.init(0, mx.nd.zeros((4,)))
    rates = {"stock": [], "ours": []}
    for r in range(rounds + 1):             # round 0 warms the page cache and the pools
        for name in (("stock", "ours") if r % 2 else ("ours", "stock")):
            t0, n = time.perf_counter(), 0
            for data, _ in loaders[name]:
                n += data.shape[0]
                if kv is not None:          # a training step's exchange, once per batch
                    kv.push(0, mx.nd.ones((4,)))
                    out = mx.nd.zeros((4,))
                    kv.pull(0, out=out)
                    out.wait_to_read()
            if r:
                rates[name].append(n / (time.perf_counter() - t0))
    ratios = [o / s for o, s in zip(rates["ours"], rates["stock"])]
    return float(np.median(rates["stock"])), float(np.median(rates["ours"])), ratios


def describe(ratios):
    return "median ratio %.3f (rounds %.2f-%.2f)" % (np.median(ratios), min(ratios), max(ratios))


def sampler_alone(length=1_281_167, world=8):
    from gluon_data import DistributedSampler
    s = DistributedSampler(length, world, 0, seed=0, batch_size=32)
    s.set_epoch(1)
    t0 = time.perf_counter()
    keys = list(s)
    return len(keys), time.perf_counter() - t0


def worker(path):
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    stock, ours, ratios = loader_rates(path, kv.num_workers, kv.rank, kv)
    print("RESULT " + json.dumps({"rank": kv.rank, "stock": stock, "ours": ours,
                                  "ratios": ratios}), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", metavar="REC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from gluon_data.gluon.launch import launch_local
    with tempfile.TemporaryDirectory() as tmp:
        path = make_data(tmp)
        n, seconds = sampler_alone()
        print("sampler alone    : a %d-sample epoch planned for rank 0 of 8 (%d keys) in "
              "%.3f s, %.2f us per key" % (1_281_167, n, seconds, seconds / n * 1e6))
        stock, ours, ratios = loader_rates(path)
        print("1 process        : stock %7.1f samples/s  DistributedSampler %7.1f  %s"
              % (stock, ours, describe(ratios)))
        results = launch_local([sys.executable, os.path.abspath(__file__), "--worker", path],
                               2, 1, timeout=300, env={"OMP_NUM_THREADS": "1"})
        for r in results:
            line = [x for x in r.output.splitlines() if x.startswith("RESULT ")]
            if r.returncode != 0 or not line:
                print(r.output[-3000:], file=sys.stderr)
                return 1
            got = json.loads(line[0][7:])
            print("dist_sync rank %d: stock %7.1f samples/s  DistributedSampler %7.1f  %s"
                  % (got["rank"], got["stock"], got["ours"], describe(got["ratios"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
