"""``gluon-data bench --only segmentation``: segmentation ``train`` against the decode limit,
with the CPU time per item of every process. Loaded by the harness as module
``gluon_data_bench_seg`` (``gluon_data.cli.bench.load_bench_part``)."""
from __future__ import annotations

import os
import sys
import time

from gluon_data.cli.bench import load_bench_part

load_bench_part("bench_common", os.path.dirname(os.path.abspath(__file__)))
from gluon_data_bench_common import (  # noqa: E402 (loaded just above)
    _cpu_s, _decode_pairs, _forked_decode_rate, _forked_rate, _seg_train_kw, decode_limit_decoders,
    make_dataset)


def _pipeline_share(dataset, batchify, k, workers, barrier, done):  # pragma: no cover - child
    idx = list(range(k, len(dataset), workers))
    batchify([dataset[i] for i in idx[:16]])  # warm: pools, libraries, the staging plan
    barrier.wait()
    c0 = time.process_time()
    for s in range(0, len(idx), 16):
        batchify([dataset[i] for i in idx[s:s + 16]])
    done.put((len(idx), time.process_time() - c0))


def seg_bench(workdir: str, n: int = 400, workers: int = 2, rounds: int = 4,
              out=sys.stdout) -> dict:
    """Only segmentation ``train`` against the decode limit (``--only segmentation``), in interleaved
    rounds (best of each): the limit (1 and N forked processes), ours ``.rec`` ``train``
    through ``DataLoader(batch_size=16, num_workers=N)`` and ``num_workers=0``, and the same
    dataset + batchify in N forked processes without a DataLoader. Besides items/s it reports
    the CPU time per item of every process involved (the DataLoader's main process
    included): on a shared machine the rates move with the load, the CPU per item much less.
    Returns ``{"rates", "cpu_ms", "ratios"}``."""
    import mxnet as mx

    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.convert import convert
    from gluon_data.gluon.datasets import SegmentationRecordDataset

    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    voc = make_dataset(workdir, n)
    rec = os.path.join(workdir, "voc.rec")
    if not os.path.exists(rec):
        convert(voc, rec, "voc", split="train")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = [(open(os.path.join(jpg_dir, f), "rb").read(),
              open(os.path.join(png_dir, f[:-4] + ".png"), "rb").read())
             for f in sorted(os.listdir(jpg_dir))]
    ds = SegmentationRecordDataset(rec, seed=0, **_seg_train_kw())
    batchify = SegmentationBatchify(channels_first=True)
    rates, cpu = {}, {}
    lim1, limn = "decode limit, 1 process", "decode limit, %d processes" % workers
    nodl = "ours .rec train, dataset + batchify, %d processes, no DataLoader" % workers
    ours, ours0 = "ours .rec train, DataLoader, %d workers" % workers, \
        "ours .rec train, DataLoader, 0 workers"

    def best(key, rate, cpu_per_item):
        rates[key] = max(rates.get(key, 0.0), rate)
        cpu[key] = min(cpu.get(key, float("inf")), cpu_per_item * 1e3)

    loaders = {k: mx.gluon.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=w,
                                           batchify_fn=batchify, last_batch="keep")
               for k, w in ((ours, workers), (ours0, 0))}
    for loader in loaders.values():
        for _ in loader:  # workers started, pools and plans warm
            pass
    say("decode limit: the fastest decoders on these files: %s" % decode_limit_decoders(pairs))
    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        seen = _decode_pairs(pairs)
        best(lim1, seen / (time.perf_counter() - t0), (time.process_time() - c0) / seen)
        t = []
        r = _forked_decode_rate(pairs, workers, t)
        best(limn, r, t[0])
        t = []
        r = _forked_rate(_pipeline_share, (ds, batchify), workers, t)
        best(nodl, r, t[0])
        for key, loader in loaders.items():
            pids = [p.pid for p in loader._worker_pool._pool] if loader._num_workers else []
            w0 = [_cpu_s(p) for p in pids]
            c0, t0, seen = time.process_time(), time.perf_counter(), 0
            for batch in loader:
                seen += batch[0].shape[0]
            elapsed = time.perf_counter() - t0
            spent = time.process_time() - c0 + sum(_cpu_s(p) - c for p, c in zip(pids, w0))
            best(key, seen / elapsed, spent / seen)
    say("%-64s %8s %8s" % ("measurement", "items/s", "CPU ms"))
    for k in (lim1, limn, nodl, ours, ours0):
        say("%-64s %8.0f %8.3f" % (k, rates[k], cpu[k]))
    ratios = {"ours .rec train / decode limit N (items/s)": rates[ours] / rates[limn],
              "ours .rec train / decode limit N (CPU per item, inverse)": cpu[limn] / cpu[ours],
              "DataLoader / no DataLoader (CPU per item, inverse)": cpu[nodl] / cpu[ours],
              "ours .rec train, 0 workers / decode limit 1 (CPU per item, inverse)":
                  cpu[lim1] / cpu[ours0]}
    say("")
    for k, v in ratios.items():
        say("%-64s %8.2f" % (k, v))
    return {"rates": rates, "cpu_ms": cpu, "ratios": ratios}
