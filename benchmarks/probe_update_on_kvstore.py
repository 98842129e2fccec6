#!/usr/bin/env python
"""Is MXNet's dist_sync training reproducible with update_on_kvstore True / False?

    PYTHONPATH=$PWD python benchmarks/probe_update_on_kvstore.py [--runs 8]

Runs the same 2-worker job (a 2-conv model, 8 SGD steps on seeded random data, nothing from
gluon_data but the launcher) several times with each setting and prints the distinct final
weight sums per rank. A reproducible setting prints one line; ranks that disagree print two
different numbers on one line.
"""
import argparse
import collections
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WORKER = r"""
import sys
import mxnet as mx, numpy as np
from mxnet import gluon, autograd
kv = mx.kv.create("dist_sync")
mx.random.seed(5)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(8, 3, padding=1, activation="relu"), gluon.nn.Conv2D(21, 3, padding=1))
net.initialize(mx.init.Xavier())
trainer = gluon.Trainer(net.collect_params(), "sgd",
                        {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4},
                        kvstore=kv, update_on_kvstore=sys.argv[1] == "True")
rng = np.random.default_rng(kv.rank)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(axis=1)
for step in range(8):
    x = mx.nd.array(rng.random((2, 3, 16, 16)))
    y = mx.nd.array(rng.integers(0, 21, (2, 16, 16)))
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(4)
print("RESULT", kv.rank, repr(float(net[0].weight.data().sum().asscalar())))
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=8)
    args = p.parse_args(argv)
    from gluon_data.gluon.launch import launch_local
    for setting in ("True", "False"):
        seen = collections.Counter()
        for _ in range(args.runs):
            results = launch_local([sys.executable, "-c", WORKER, setting], 2, 1, timeout=120,
                                   env={"OMP_NUM_THREADS": "1"})
            sums = {}
            for r in results:
                for line in r.output.splitlines():
                    if line.startswith("RESULT "):
                        _, rank, value = line.split()
                        sums[int(rank)] = value
            seen[tuple(sums.get(k, "failed") for k in range(2))] += 1
        print("update_on_kvstore=%s: %d runs" % (setting, args.runs))
        for (rank0, rank1), n in seen.most_common():
            print("  %2d x  rank 0 %-22s rank 1 %s" % (n, rank0, rank1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
