#!/usr/bin/env python
"""``gluon-data bench --only cores``: how far this machine's cores carry loading and
conversion, to size a machine. ``python benchmarks/bench_cores.py [--max-workers N]``.

For each worker count from 1 up to the machine's cores (1, 2, 4, 8, ... and the core count), on
the same VOC-like pairs (``bench_common.make_dataset``), it measures in items/s:

* the decode limit: the JPEG and PNG bytes decoded from memory with the fastest decoders
  available, in N forked processes timed from a barrier (best of the rounds); it is also
  conversion's floor;
* ``gluon-data convert`` (pass-through) with N workers;
* ``gluon_data.arrays.SegmentationDataset(mode='train', base_size=520, crop_size=480,
  output='uint8')`` in a torch ``DataLoader`` (batch 16, N workers; torch from ``sys.path`` or
  ``$GLUON_DATA_TORCH_PATH``), also with ``collate_fn=BatchRing()`` there, and in a Gluon
  ``DataLoader`` where MXNet is installed, against a plain PIL + numpy file loader of the
  same pairs in the same loader (the one ``bench_feed.py`` defines, written as torchvision's
  segmentation reference does);
* where a CUDA device and torchvision are present: ``lraspp_mobilenet_v3_large`` training
  steps (bf16, channels_last, batch 16 at 480x480) fed by our loader (uint8 masks,
  ``pin_memory=True``; default collation, then ``BatchRing``) at the most workers, against
  the same steps on one batch already on the GPU.

Each loader runs in its own interpreter (torch and MXNet never share one, and no loader forks
from a process whose OpenCV threads already ran). It prints the table and the ratios, writes
them as JSON and, where matplotlib is installed, a PNG of items/s against workers with the
decode limit beside; a row that cannot run here is skipped with its reason printed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Callable, Iterator, List, Optional

from bench_common import make_dataset
from bench_convert import _decode_floor, _timed

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = "decode limit"
CONVERT = "ours convert"
LOADERS = ("ours", "files")
#: ours in torch's DataLoader with ``collate_fn=BatchRing()``
RING = "ours, batch ring"
MODEL = "lraspp_mobilenet_v3_large"
UINT8 = "ours, mask_dtype='uint8'"


def worker_counts(most: int) -> List[int]:
    """1, 2, 4, ... below ``most``, and ``most``."""
    counts, w = [], 1
    while w < most:
        counts.append(w)
        w *= 2
    return counts + [most]


def _loader_rates(kind: str, workdir: str, n: int, counts, rounds: int) -> dict:
    """In this process (a child): name -> {workers: items/s} for ours and the file loader in
    ``kind``'s DataLoader ('torch' or 'gluon'), best of ``rounds`` passes after a warm one."""
    import bench_feed
    sets = {name: (ds, None) for name, (ds, _) in
            bench_feed.datasets(workdir, n, ("ours", "files")).items()}
    if kind == "torch" and bench_feed.BatchRing is not None:
        sets[RING] = (sets["ours"][0], bench_feed.BatchRing())
    out = {}
    for name, (ds, collate) in sets.items():
        for w in counts:
            loader = _loader(kind, ds, w, collate)
            best = 0.0
            for r in range(rounds + 1):
                t0, seen = time.perf_counter(), 0
                for img, _ in loader:
                    seen += img.shape[0]
                if r:  # the first pass starts the workers
                    best = max(best, seen / (time.perf_counter() - t0))
            out.setdefault(name, {})[str(w)] = best
            del loader
    return out


def _loader(kind: str, ds, workers: int, collate=None):
    if kind == "torch":
        import bench_feed
        torch = bench_feed.import_torch()
        return torch.utils.data.DataLoader(ds, batch_size=bench_feed.BATCH, shuffle=True,
                                           num_workers=workers, persistent_workers=True,
                                           collate_fn=collate)
    import mxnet as mx
    return mx.gluon.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers,
                                    last_batch="keep")


def fed_rate(step: Callable, batches: Iterator, ahead: int, steps: int,
             sync: Callable[[], None] = lambda: None,
             read: Optional[Callable[[], float]] = None, warm: int = 5) -> float:
    """Items/s of ``steps`` training steps (``step(*batch)``; ``sync()`` waits for the
    device) on ``batches``, after ``warm`` steps (kernels chosen, workers started) and the
    ``ahead`` batches the workers may have read meanwhile, taken as the timed ones are. The
    queue refills whenever the device is slower than the workers, so the window may still
    begin on batches read before it: ``read()`` (the items the workers have read, where a
    loader feeds the steps) bounds what the window counts (:func:`bench_feed.delivered`)."""
    import bench_feed
    for _ in range(warm + ahead):
        step(*next(batches))
    sync()
    t0, r0 = time.perf_counter(), read() if read else 0
    for _ in range(steps):
        step(*next(batches))
    sync()
    taken, seconds = steps * bench_feed.BATCH, time.perf_counter() - t0
    return bench_feed.delivered(taken, read() - r0 if read else taken, seconds)


def _gpu_rates(workdir: str, n: int, workers: int, steps: int = 30) -> dict:
    """In this process (a child): items/s of ``MODEL`` training fed by our loader and on one
    batch already on the GPU; ``{"skipped": reason}`` without CUDA or torchvision."""
    import bench_feed
    torch = bench_feed.import_torch()
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device (torch %s)" % torch.__version__}
    try:
        import torchvision
    except ImportError as e:
        return {"skipped": "torchvision does not import (%s)" % e}
    # masks in one byte, 255 ignored (what the step's loss ignores; int32 masks hold -1)
    ours = bench_feed.datasets(workdir, n, (UINT8,))[UINT8][0]
    dev = torch.device("cuda")
    model = torchvision.models.segmentation.__dict__[MODEL](
        weights=None, weights_backbone=None, num_classes=21).to(dev)
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor([123.7, 116.3, 103.5], device=dev).view(1, 3, 1, 1)
    std = torch.tensor([58.4, 57.1, 57.4], device=dev).view(1, 3, 1, 1)

    def step(img, mask):
        x = ((img.to(dev, non_blocking=True).float() - mean) / std).contiguous(
            memory_format=torch.channels_last)
        y = mask.to(dev, non_blocking=True).long()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x)["out"], y, ignore_index=255)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    prefetch = 4
    ctx = multiprocessing.get_context()
    sync = torch.cuda.synchronize
    fed = {}
    for name, collate in (("fed items/s", None),
                          ("fed items/s, batch ring", bench_feed.BatchRing())):
        counted = bench_feed.Timed(ours, ctx)  # the items the workers read, in shared memory
        loader = torch.utils.data.DataLoader(
            counted, batch_size=bench_feed.BATCH, shuffle=True, num_workers=workers,
            drop_last=True, pin_memory=True, persistent_workers=True, prefetch_factor=prefetch,
            multiprocessing_context=ctx, collate_fn=collate)

        def forever():
            while True:
                yield from loader

        fed[name] = fed_rate(step, forever(), prefetch * workers, steps, sync,
                             lambda: counted.tally[1])
        if collate is None:
            img, mask = next(iter(loader))
            resident = (img.to(dev), mask.to(dev))
        del loader

    def same():
        while True:
            yield resident

    on_gpu = fed_rate(step, same(), 0, steps, sync)
    res = {"GPU-resident items/s": on_gpu, "workers": workers, "model": MODEL,
           "device": torch.cuda.get_device_name(0)}
    for name, rate in fed.items():
        res[name] = rate
        res[name.replace("fed items/s", "fed / GPU-resident")] = rate / on_gpu
    return res


def _child(kind: str, workdir: str, n: int, counts, rounds: int) -> dict:
    """Run ``kind``'s rows in a fresh interpreter (torch's path added for 'torch' and 'gpu');
    ``{"skipped": reason}`` where it cannot run here."""
    env = dict(os.environ)
    if kind in ("torch", "gpu") and os.environ.get("GLUON_DATA_TORCH_PATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), os.environ["GLUON_DATA_TORCH_PATH"]) if p)
    code = ("import json, sys; sys.path.insert(0, %r); import bench_cores as b; "
            "print('RESULT ' + json.dumps(b._child_main(*json.loads(sys.argv[1]))))" % HERE)
    args = json.dumps([kind, workdir, n, list(counts), rounds])
    r = subprocess.run([sys.executable, "-c", code, args], env=env, capture_output=True,
                       text=True, timeout=3600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        tail = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
        return {"skipped": tail}
    return json.loads(lines[-1][len("RESULT "):])


def _child_main(kind: str, workdir: str, n: int, counts, rounds: int) -> dict:
    if kind == "gpu":
        return _gpu_rates(workdir, n, max(counts))
    try:
        if kind == "torch":
            import bench_feed
            bench_feed.import_torch()
        else:
            import mxnet  # noqa: F401
    except ImportError as e:
        return {"skipped": "%s does not import here (%s)" % (kind, e)}
    return _loader_rates(kind, workdir, n, counts, rounds)


def run_cores(workdir: str, n: int = 480, max_workers: Optional[int] = None, rounds: int = 2,
              out=sys.stdout, json_path: Optional[str] = None,
              png_path: Optional[str] = None) -> dict:
    """Measure, print, write the JSON (``json_path``, default ``<workdir>/cores.json``) and
    the plot (``png_path``, default ``<workdir>/cores.png``); returns what the JSON holds."""
    def say(*a):
        print(*a, file=out, flush=True)

    most = max_workers or os.cpu_count() or 1
    counts = worker_counts(most)
    os.makedirs(workdir, exist_ok=True)
    voc = make_dataset(workdir, n)
    say("cores: %d VOC-like pairs, workers %s on %d CPUs" % (n, counts, os.cpu_count() or 0))
    rows, skipped = {}, {}
    for kind in ("torch", "gluon"):  # first: nothing in this process has forked yet
        got = _child(kind, workdir, n, counts, rounds)
        if "skipped" in got:
            skipped["%s DataLoader" % kind] = got["skipped"]
            continue
        for name, by_count in got.items():
            rows["%s, %s DataLoader" % (name, kind)] = by_count
    gpu = _child("gpu", workdir, n, counts, rounds)
    out_rec = os.path.join(workdir, "cores-convert", "c.rec")
    from gluon_data.convert import convert
    for w in counts:
        rows.setdefault(LIMIT, {})[str(w)] = max(_decode_floor(voc, w) for _ in range(rounds))
        rows.setdefault(CONVERT, {})[str(w)] = n / min(_timed(lambda: convert(
            voc, out_rec, "voc", split="train", workers=w, overwrite=True))
            for _ in range(rounds))
    ratios = {}
    for name in rows:
        if name != LIMIT:
            ratios[name + " / " + LIMIT] = {k: v / rows[LIMIT][k] for k, v in rows[name].items()}
    for kind in ("torch", "gluon"):
        b = "files, %s DataLoader" % kind
        for ours in ("ours", RING):
            a = "%s, %s DataLoader" % (ours, kind)
            if a in rows and b in rows:
                ratios[a + " / " + b] = {k: rows[a][k] / rows[b][k] for k in rows[a]}
    res = {"cpus": os.cpu_count(), "images": n, "workers": counts, "rows": rows,
           "ratios": ratios, "gpu": gpu, "skipped": skipped}
    _report(say, res)
    json_path = json_path or os.path.join(workdir, "cores.json")
    png_path = png_path or os.path.join(workdir, "cores.png")
    res["plot"] = plot(res, png_path)
    if res["plot"] != png_path:
        say("plot: skipped: %s" % res["plot"])
    else:
        say("plot: %s" % png_path)
    with open(json_path, "w") as f:
        json.dump(res, f, indent=1)
    say("json: %s" % json_path)
    return res


def _report(say, res: dict) -> None:
    counts = [str(w) for w in res["workers"]]
    say("")
    say("%-52s" % "items/s by workers" + "".join("%9s" % w for w in counts))
    for name, by_count in list(res["rows"].items()) + list(res["ratios"].items()):
        say("%-52s" % name + "".join(
            ("%9.2f" if "/" in name else "%9.0f") % by_count[w] for w in counts))
    for name, reason in res["skipped"].items():
        say("%s: skipped: %s" % (name, reason))
    gpu = res["gpu"]
    if "skipped" in gpu:
        say("GPU (%s fed by ours / GPU-resident): skipped: %s" % (MODEL, gpu["skipped"]))
    else:
        say("GPU %s, %s, %d workers: fed %.0f items/s (%.0f with BatchRing), GPU-resident "
            "%.0f: %.2f (%.2f)" % (
                gpu["device"], MODEL, gpu["workers"], gpu["fed items/s"],
                gpu["fed items/s, batch ring"], gpu["GPU-resident items/s"],
                gpu["fed / GPU-resident"], gpu["fed / GPU-resident, batch ring"]))


def plot(res: dict, path: str) -> str:
    """A PNG of items/s against workers (loaders on the left, conversion on the right, the
    decode limit on both) at ``path``; returns ``path``, or the reason there is none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return "matplotlib does not import here (%s)" % e
    counts = res["workers"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    limit = [res["rows"][LIMIT][str(w)] for w in counts]
    for ax, title, names in ((axes[0], "segmentation train loaders",
                              [k for k in res["rows"] if "DataLoader" in k]),
                             (axes[1], "gluon-data convert", [CONVERT])):
        ax.plot(counts, limit, "k--", label="decode limit (fastest decoders)")
        for name in names:
            ax.plot(counts, [res["rows"][name][str(w)] for w in counts], "o-", label=name)
        ax.set_title(title)
        ax.set_xlabel("workers")
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("items/s")
    fig.suptitle("%d CPUs, %d VOC-like pairs" % (res["cpus"] or 0, res["images"]))
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=480)
    ap.add_argument("--max-workers", type=int, default=None,
                    help="the largest worker count (default: this machine's CPUs)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", default=os.path.join("bench-data", "cores"))
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args(argv)
    run_cores(a.workdir, a.images, a.max_workers, a.rounds, json_path=a.json, png_path=a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
