"""``gluon-data bench`` (``python benchmarks/bench.py``): our loaders and the baselines side by side, in one run, as ratios.

Makes (or reuses) a VOC-like dataset of photographic-looking JPEGs (300-500 px, tens of KB)
with palette masks, packs it, and measures in one run:

* conversion: ours (pass-through at N workers) against ``im2rec`` and a raw copy of the same
  files, then ``bench_convert.py`` on the same pairs (1 vs N workers, the N-process decode
  floor, im2rec re-encoding at N threads, Dask 1 vs 2 worker processes);
* the decode limit: image + mask bytes from memory with the fastest decoders available
  (simplejpeg or OpenCV for the JPEG, Pillow or OpenCV for the mask, chosen on the files),
  1 and N processes (forked after loading the bytes, timed from a barrier: no start-up or transfer counted), and the
  old measurement that sent the bytes through a spawn ``Pool.map`` inside the timing;
* segmentation ``train`` (``base_size=400, crop_size=320``, ``ToTensor`` + ``Normalize``,
  ``DataLoader(batch_size=16, num_workers=N)``): gluoncv's ``VOCSegmentation``, ours from
  ``.rec`` and from LMDB, and DALI's CPU pipeline when ``--dali-python`` names an
  interpreter that has DALI (it needs numpy 2, so it cannot share MXNet's environment);
* after decode: float32 samples against uint8 batches + ``InputNormalize`` in the consumer
  (``bench_uint8.py``);
* large images (``bench_large.py``): Cityscapes-size street scenes (2048x1024 JPEGs, ~0.5 MB)
  with palette masks, segmentation ``train`` at ``base_size=1024, crop_size=768``,
  ``DataLoader(batch_size=4, num_workers=N)``: the decode limit, gluoncv's pipeline, ours
  with region decoding on and off and with DCT-scaled decoding, CPU per item of each;
* classification on a stock im2rec ``.rec``: stock ``ImageRecordDataset`` and
  ``ImageRecordIter`` against ours, and DALI's CPU pipeline of the same recipe
  (``bench_cls.py``);
* region decoding's saving on the crops the datasets draw (``bench_region.py``); each mask
  encoding's decode against PNG at VOC and Cityscapes size (``bench_masks.py``); scaled
  decoding's saving and pixel difference from the exact path (``bench_scaled.py``);
* raw record reads, sequential and random, warm and cold (page cache evicted with
  ``posix_fadvise(DONTNEED)``), against ``cat`` and stock ``read_idx``, and the small files;
  cold LMDB reads and loaders (``bench_reads.py``); LMDB against RecordIO on a throttled
  loop device where this is root (``bench_lmdb.py``; a note says it was skipped elsewhere);
* index memory and load time per million records, the private memory a forked worker
  gains reading every index entry, and the scale step (``bench_scale.py``);
* per-worker RSS after each of 3 epochs; a note that the GPU comparison was skipped where
  there is no GPU; every ratio against its target, and each step's wall time.

``--only cores`` (``bench_cores.py``) is a tool to size a machine: it sweeps worker counts
from 1 to the machine's cores for the decode limit, conversion, segmentation ``train`` in
torch's and Gluon's ``DataLoader`` against a plain file loader, and a GPU model fed by ours
where CUDA is present, and writes a JSON table and a PNG plot. ``bench_feed.py`` (run on its
own) measures how much of a loader's rate reaches a training loop that holds the GIL.

The helpers every step shares are in ``bench_common.py``. Each sibling module is loaded once
under its own name (this folder is put on ``sys.path``), and this module keeps every name
they define.

A shared machine is noisy: compare ratios from one run, never absolute numbers from
different runs.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Optional, Tuple

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
# the harness is split by concern into sibling modules, imported by their own names with this
# folder on sys.path (a spawned process gets the same path, so it unpickles what they define);
# this module keeps every name they define. Nothing here imports the package's command line,
# which loads this file by path: the dependency runs one way.
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
for _part in ("bench_common", "bench_reads", "bench_scale", "bench_cls"):
    globals().update((k, v) for k, v in vars(importlib.import_module(_part)).items()
                     if not k.startswith("__"))
from bench_cls import (  # noqa: E402 (this folder is on sys.path just above)
    _CLS_CPU_RATIOS, _CLS_RATIOS, _dali_rate, _im2rec, _stock_lst, _stock_shards,
    classification_rates, run_classification)
from bench_common import (  # noqa: E402
    RatioTable, _cpu_s, _decode_pairs, _forked_decode_rate, _forked_rate, _loader_rates, _rate,
    _ratio_row, _ratio_table, _say_cpu, _say_rates, _seg_train_kw, decode_limit_decoders,
    make_dataset)
from bench_reads import READ_RATIOS, read_rates, run_read_bench  # noqa: E402
from bench_scale import (  # noqa: E402
    _say_scale, _scale_rows, index_costs, run_scale, scale_costs)


def _raw_copy(files, out_path) -> None:
    with open(out_path, "wb") as out:
        for p in files:
            with open(p, "rb") as f:
                out.write(f.read())


def _sibling(name: str):
    """``benchmarks/<name>.py`` beside this file, imported as module ``<name>``; None where
    the file is absent."""
    if not os.path.isfile(os.path.join(_HERE, name + ".py")):
        return None
    return importlib.import_module(name)


@contextlib.contextmanager
def _step(seconds: dict, name: str, say):
    """Announce a step, time it into ``seconds[name]`` and print its time."""
    say("%s ..." % name)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = time.perf_counter() - t0
        say("  (%s: %.0f s)" % (name, seconds[name]))


def _timed_rate(n: int, fn) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def conversion_rates(workdir: str, voc: str, n: int, workers: int, quick: bool,
                     out=sys.stdout) -> Tuple[dict, dict]:
    """The conversion rows; writes what later steps read: ``voc.rec`` (ours, pass-through,
    ``workers`` workers), ``voc.lmdb`` (the same records) and im2rec's ``cls/stock.rec``.
    ``quick``: ours pass-through and re-encode and im2rec pass-through at N only; otherwise
    also ``benchmarks/bench_convert.py`` on the same pairs (1 vs N workers, the N-process
    decode floor, im2rec re-encoding at N threads, Dask 1 vs 2 worker processes on all ``n``
    images). Returns ``(rates, bench_convert's ratio table)`` (empty when ``quick``)."""
    from gluon_data.convert import convert
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    png_files = [os.path.join(png_dir, f) for f in sorted(os.listdir(png_dir))]
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    results = {"raw copy of the files, 1 process": _rate(
        lambda: _raw_copy(jpg_files + png_files, os.path.join(workdir, "copy.bin")), n)}
    results["ours convert pass-through, %d workers" % workers] = _timed_rate(n, lambda: convert(
        voc, rec, "voc", split="train", workers=workers, overwrite=True))
    if quick:
        results["ours convert re-encode, %d workers" % workers] = _timed_rate(
            n, lambda: convert(voc, os.path.join(workdir, "reenc.rec"), "voc", split="train",
                               workers=workers, overwrite=True, encoding="jpg", quality=90))
    convert(rec, lm, overwrite=True)  # the same records as the .rec just written
    cls_root = os.path.join(workdir, "cls")
    _stock_lst(cls_root, jpg_files)
    results["im2rec pass-through, %d threads" % workers] = _timed_rate(
        n, lambda: _im2rec(voc, os.path.join(cls_root, "stock"), "pass-through", workers))
    if quick:
        return results, RatioTable()
    conv = _sibling("bench_convert").run_convert_bench(workdir, n, workers, out=out,
                                                       shards=max(1, min(16, n // 4)))
    results.update(conv["rates"])
    return results, conv["ratios"]


def segmentation_rates(workdir: str, voc: str, n: int, workers: int, epochs: int,
                       dali_python: Optional[str], notes: dict, say) -> Tuple[dict, list]:
    """The decode limit (1 process; N forked processes, the best of the rounds run between
    the loaders; the old figure, bytes sent by ``Pool.map``) and segmentation ``train``
    (:data:`SEG_TRAIN`) from gluoncv, ours ``.rec`` and LMDB and ours with Gluon's batchify,
    in interleaved rounds, and DALI's crop 320 with ``dali_python``. Returns ``(rates, the
    first loader's per-worker RSS after every round)``."""
    from gluoncv.data import VOCSegmentation

    from gluon_data.gluon.batchify import SegmentationBatchify
    from gluon_data.gluon.datasets import SegmentationLMDBDataset, SegmentationRecordDataset

    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    jpg_dir, png_dir = os.path.join(voc, "JPEGImages"), os.path.join(voc, "SegmentationClass")
    pairs = [(open(os.path.join(jpg_dir, f), "rb").read(),
              open(os.path.join(png_dir, f[:-4] + ".png"), "rb").read())
             for f in sorted(os.listdir(jpg_dir))]
    say("mean JPEG size %.1f KB" % (np.mean([len(a) for a, _ in pairs]) / 1024))
    notes["decode limit"] = "fastest decoders on these files: " + decode_limit_decoders(pairs)
    results = {"decode limit, 1 process": _rate(lambda: _decode_pairs(pairs), n)}
    dl_key = "decode limit, %d processes" % workers

    def decode_limit():  # best of the rounds run between the loaders (the machine is noisy)
        results[dl_key] = max(results.get(dl_key, 0.0), _forked_decode_rate(pairs, workers))

    chunks = [pairs[i::workers] for i in range(workers)]
    # the old measurement (a spawn pool then; fork here, so this file need not be importable
    # by name): every image's bytes pickled and piped to the workers inside the timing
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_pairs, [pairs[:2]] * workers)
        results["decode, %d processes, bytes sent by Pool.map (old limit)" % workers] = _rate(
            lambda: sum(pool.map(_decode_pairs, chunks)), n)
    decode_limit()
    kw = _seg_train_kw()
    batchify = SegmentationBatchify(channels_first=True)
    rss = []
    results.update(_loader_rates([
        ("ours .rec train", SegmentationRecordDataset(rec, seed=0, **kw), batchify),
        ("ours LMDB train", SegmentationLMDBDataset(lm, split="train", seed=0, **kw), batchify),
        ("ours .rec train, Gluon's default batchify",
         SegmentationRecordDataset(rec, seed=0, **kw), None),
        ("gluoncv VOCSegmentation train",
         VOCSegmentation(root=workdir, split="train", **kw), None),
    ], workers, max(epochs, 3), rss=rss, between=decode_limit))
    if dali_python:  # optional: only with --dali-python
        try:
            results["DALI CPU crop 320+normalize, image only"] = _dali_rate(
                dali_python, rec, workers, n, "crop320")
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            notes["DALI"] = str(e)
    return results, rss


def slow_device_rates(quick: bool, epochs: int, notes: dict, say) -> dict:
    """``benchmarks/bench_lmdb.py``'s rows (LMDB and RecordIO loaders on a throttled loop
    device), or ``{}`` and a note saying why they were skipped (they need root)."""
    bench_lmdb = _sibling("bench_lmdb")
    why = bench_lmdb.skip_reason()
    if why:
        notes["LMDB on a slow device"] = "skipped: " + why
        return {}
    return bench_lmdb.slow_device_rows(48 if quick else 240, epochs=1 if quick else epochs,
                                       say=say)


def after_decode_rates(rec: str, workers: int, quick: bool, out=sys.stdout) -> Tuple[dict, dict]:
    """``benchmarks/bench_uint8.py`` on ``rec``: float32 samples against uint8 samples +
    ``InputNormalize`` in the consumer, ``(items/s, CPU ms per item)`` (600 records a round
    in the full run, two rounds)."""
    return _sibling("bench_uint8").rows(rec, workers, 1 if quick else 2,
                                        limit=0 if quick else 600, out=out)


def run_bench(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
              quick: bool = False, dali_python: Optional[str] = None,
              index_records: Optional[int] = None, epochs: int = 3,
              scale: int = 0, large_images: int = 64) -> dict:
    """Run every measurement once (each loader: the best of ``epochs`` epochs) and print the
    tables and every ratio against its target; returns ``{"rates", "region", "large",
    "ratios", "index", "rss", "scale", "cpu", "seconds"}`` (``seconds``: each step's wall
    time). ``scale`` > 0 adds :func:`scale_costs` for that many records; ``large_images``:
    the large-image set's count (``bench_large.py``; 0 skips it)."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) + palette masks in %s" % (n, workdir))
    seconds: dict = {}
    with _step(seconds, "dataset", say):
        voc = make_dataset(workdir, n)
    rec, lm = os.path.join(workdir, "voc.rec"), os.path.join(workdir, "voc.lmdb")
    jpg_dir = os.path.join(voc, "JPEGImages")
    jpg_files = [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))]
    notes: dict = {}
    cpu: dict = {}
    with _step(seconds, "conversion", say):
        results, conv_table = conversion_rates(workdir, voc, n, workers, quick, out)
    stock_rec = os.path.join(workdir, "cls", "stock.rec")
    stock_shards = _stock_shards(stock_rec)
    with _step(seconds, "decode limit and segmentation train", say):
        seg, rss = segmentation_rates(workdir, voc, n, workers, epochs, dali_python, notes,
                                      say)
    results.update(seg)
    with _step(seconds, "after decode: uint8 batches", say):
        rate8, cpu8 = after_decode_rates(rec, workers, quick, out)
    results.update(rate8)
    cpu.update(cpu8)
    with _step(seconds, "classification", say):
        results.update(classification_rates(stock_rec, n, workers, epochs, dali_python, notes,
                                            shards=stock_shards, cpu=cpu))
    with _step(seconds, "region decoding", say):
        region = _sibling("bench_region").rows(rec, stock_rec, workers, 1 if quick else 3)
    with _step(seconds, "mask encodings and scaled decoding", say):  # one process, CPU time
        decoding = _sibling("bench_masks").rows(2 if quick else 8)
        decoding.update(_sibling("bench_scaled").rows(4 if quick else 24, 1 if quick else 3))
    large = {}
    if large_images:
        with _step(seconds, "large images", say):
            large = _sibling("bench_large").rows(workdir, large_images, workers,
                                                 1 if quick else 3, notes=notes, say=say)
    with _step(seconds, "reads", say):  # raw reads, warm and cold; cold LMDB; cold loaders
        cold_results, cold_notes = read_rates(rec, lm, jpg_files, workers, quick,
                                              _seg_train_kw(), say)
    results.update(cold_results)
    notes.update(cold_notes)
    with _step(seconds, "LMDB on a slow device", say):
        slow = slow_device_rates(quick, 2, notes, say)
    with _step(seconds, "index", say):
        index = index_costs(workdir, index_records or (100_000 if quick else 1_000_000))
    scaled = {}
    if scale:
        with _step(seconds, "scale: %d records in 8 workers" % scale, say):
            scaled = scale_costs(workdir, scale)
    with _step(seconds, "gpu", say):  # the batch stage on a CUDA device; skipped with its reason
        gpu_rows = _sibling("bench_gpu").run_gpu(rec, stock_rec, None, say=say)
    notes["GPU"] = ("measured: the gpu rows" if gpu_rows
                    else _sibling("bench_gpu").gpu_skip_reason())
    table = _report(say, workers, results, cpu, index, rss, scaled, scale,
                    conv_table=conv_table, slow=slow, notes=notes, seconds=seconds,
                    region=region, decoding=decoding, large=large)
    return {"rates": results, "region": region, "decoding": decoding, "large": large, "ratios": table, "index": index, "rss": rss, "scale": scaled,
            "cpu": cpu, "seconds": seconds}


def _ratios(workers: int) -> list:
    """The full run's ratio rows over its rates: (name, numerator, denominator, target)."""
    dl = "decode limit, %d processes" % workers
    return [
        ("ours .rec train / gluoncv train", "ours .rec train", "gluoncv VOCSegmentation train",
         4.0),
        ("ours .rec train / decode limit N", "ours .rec train", dl, 0.7),
        ("ours .rec train / old limit (bytes sent by Pool.map)", "ours .rec train",
         "decode, %d processes, bytes sent by Pool.map (old limit)" % workers, None),
        ("ours LMDB train / ours .rec train", "ours LMDB train", "ours .rec train", 0.9),
        ("ours .rec train: our batchify / Gluon's", "ours .rec train",
         "ours .rec train, Gluon's default batchify", None),
        *_CLS_RATIOS,
        ("ours .rec train / DALI crop 320 (image only)", "ours .rec train",
         "DALI CPU crop 320+normalize, image only", None),
        *READ_RATIOS,
        # validation decodes every image and mask: the target is the decode floor's (below)
        ("convert pass-through / raw copy", "ours convert pass-through, %d workers" % workers,
         "raw copy of the files, 1 process", None),
    ]


def _report(say, workers, results, cpu, index, rss, scaled, scale, *, conv_table, slow,
            notes, seconds, region, decoding, large) -> dict:
    """Print the rates, CPU, index, scale and RSS tables, then every ratio against its
    target (``conv_table``: bench_convert.py's, with its targets; ``slow``: the slow-device
    rows; ``region``: bench_region.py's; ``decoding``: bench_masks.py's and bench_scaled.py's;
    ``large``: bench_large.py's), a summary of the targets, the notes and each
    step's time; returns the ratio table."""
    _say_rates(say, results)
    _say_cpu(say, cpu)
    say("")
    say("%-56s %12s" % ("index (scaled to 1M records)", "value"))
    for k, v in index.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    if scaled:
        _say_scale(say, scaled, scale)
    if rss:
        say("per-worker RSS after epochs 1..3, MB, private (+ shared batch segments): %s"
            % "; ".join("worker %d: %s" % (k, " ".join("%.0f (+%.0f)" % e[k] for e in rss))
                        for k in range(len(rss[0]))))
    say("")
    say("%-56s %12s" % ("region decoding (decode: CPU ms/image; loaders: items/s, CPU ms)",
                        "value"))
    for k, v in region.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    say("%-56s %12s" % ("mask encodings, scaled decoding (one process, CPU)", "value"))
    for k, v in decoding.items():
        say("%-56s %12.3f" % (k, v))
    say("")
    if large:
        _sibling("bench_large").report(say, large, workers)
    table = _ratio_table(_ratios(workers), results, say)
    uint8 = _sibling("bench_uint8")
    _ratio_table(uint8.RATIOS, results, say, table)
    _ratio_table(_sibling("bench_region").RATIOS, region, say, table)
    _ratio_table(_sibling("bench_masks").RATIOS + _sibling("bench_scaled").RATIOS, decoding,
                 say, table)
    _ratio_table(_CLS_CPU_RATIOS + uint8.CPU_RATIOS, cpu, say, table)
    if large:
        _ratio_table(_sibling("bench_large").ratios(workers), large, say, table)

    def row(name, value, target, lower=False):
        _ratio_row(table, say, name, value, target, lower)

    for name, value in conv_table.items():  # bench_convert.py's rows, with its targets
        row(name, value, *conv_table.targets.get(name, (None, False)))
    row("index bytes/record", index["ours bytes/record"], 16.5, lower=True)
    row("index load s per 1M records", index["ours load s per 1M"], 0.1, lower=True)
    row("index load s per 1M, text .idx only", index["ours (text .idx) load s per 1M"], None)
    row("index: forked worker's private MB per 1M", index["ours forked private MB per 1M"],
        None)
    if rss and len(rss) >= 3:
        for k, what in ((0, "private"), (1, "shared")):
            change = max(abs(e3[k] / e1[k] - 1) if e1[k] else 0.0
                         for e1, e3 in zip(rss[0], rss[-1]))
            row("worker RSS change, epoch 1->3, %s" % what, change, 0.05 if k == 0 else None,
                lower=True)
    for args in _scale_rows(scaled, scale) if scaled else ():
        row(*args)
    for k, v in slow.items():
        row(k, v, 0.9 if k.startswith("LMDB / RecordIO") else None)
    missed = table.missed()
    say("targets: %d of %d met%s" % (
        sum(t is not None for t, _ in table.targets.values()) - len(missed),
        sum(t is not None for t, _ in table.targets.values()),
        "; missed: " + "; ".join(missed) if missed else ""))
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    say("")
    say("%-56s %12s" % ("step (wall s)", "s"))
    for k, v in seconds.items():
        say("%-56s %12.0f" % (k, v))
    return table


def seg_bench(workdir: str, n: int = 400, workers: int = 2, rounds: int = 4,
              out=sys.stdout) -> dict:
    """``--only segmentation``: ``bench_seg.py``'s :func:`seg_bench` (the decode limit, ours
    ``.rec`` ``train`` through a DataLoader at N and 0 workers and without one, items/s and
    CPU per item, interleaved rounds). Returns ``{"rates", "cpu_ms", "ratios"}``."""
    return _sibling("bench_seg").seg_bench(workdir, n, workers, rounds, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gluon-data bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="bench-data", help="dataset and outputs (reused)")
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--quick", action="store_true",
                   help="200 images, fewer conversions, a 100k-record index: a smoke run "
                        "under a minute")
    p.add_argument("--dali-python", default=os.environ.get("GLUON_DATA_DALI_PYTHON"),
                   help="a Python that has nvidia-dali (e.g. a separate venv with "
                        "`pip install nvidia-dali-cuda120`) to measure DALI's CPU pipeline")
    p.add_argument("--scale", type=int, default=10_000_000,
                   help="records of the scale step (a tiny-record .rec opened by 8 workers at "
                        "once; not run by --quick; 0 skips it)")
    p.add_argument("--large-images", type=int, default=None,
                   help="street scenes of the large-image set (2048x1024; kept under "
                        "--workdir; 0 skips the set in the full run) [default: 64; --quick: 8]")
    p.add_argument("--max-workers", type=int, default=None,
                   help="--only cores: the largest worker count [default: this machine's CPUs]")
    p.add_argument("--only", choices=("all", "scale", "segmentation", "reads",
                                      "classification", "large", "cores", "gpu"), default="all",
                   help="run only some rows: 'scale' is the scale step (--scale records); "
                        "'segmentation' is train against the decode limit, with CPU per item "
                        "(400 images unless --num-images is given; ~1-2 min); 'reads' is the "
                        "raw, cold LMDB and cold loader read rows and their ratios (a few "
                        "minutes); 'classification' is the stock im2rec .rec, its 4 shards, the "
                        "decode-only and ImageNet-recipe loaders, ImageRecordIter and (with "
                        "--dali-python) DALI's CPU pipeline; 'large' is the large-image set "
                        "(--large-images street scenes of 2048x1024, segmentation train at "
                        "base 1024, crop 768, batch 4: the decode limit, gluoncv, ours with "
                        "region decoding on and off and DCT-scaled; ~2-3 min); 'cores' sweeps "
                        "worker counts from 1 to --max-workers (1, 2, 4, ...): the decode limit, "
                        "convert, segmentation train in torch's and Gluon's DataLoader against a "
                        "plain file loader, and a GPU model fed by ours where CUDA is present; "
                        "writes <workdir>-cores/cores.json and cores.png (480 images unless "
                        "--num-images is given), to size a machine; 'gpu' is the batch "
                        "stage on a CUDA device against the CPU pipeline and the "
                        "classification recipe fed by each against GPU-resident data "
                        "(skipped, with the reason, where there is no CUDA device)")
    p.add_argument("--reads-only", action="store_const", dest="only", const="reads",
                   help="the same as --only reads")
    a = p.parse_args(argv)
    given = any(x.startswith("--num-images") for x in (argv or sys.argv))
    if a.only == "cores":
        _sibling("bench_cores").run_cores(a.workdir + "-cores", a.num_images if given else 480,
                                          a.max_workers, 1 if a.quick else 2, out=sys.stdout)
        return 0
    if a.only == "scale":
        run_scale(a.workdir, a.scale)
        return 0
    if a.only == "gpu":
        gpu = _sibling("bench_gpu")
        reason = gpu.gpu_skip_reason()
        if reason is not None:  # said before any data is made
            print("gpu: " + reason)
            return 0
        workdir = a.workdir + ("-quick" if a.quick else "")
        voc = make_dataset(workdir, 200 if a.quick else a.num_images)
        conversion_rates(workdir, voc, 200 if a.quick else a.num_images, a.workers, True,
                         sys.stdout)  # writes voc.rec and cls/stock.rec
        gpu.run_gpu(os.path.join(workdir, "voc.rec"), os.path.join(workdir, "cls", "stock.rec"))
        return 0
    if a.only == "segmentation":
        n = a.num_images if given else 400
        seg_bench(a.workdir + "-seg%d" % n, n, a.workers, out=sys.stdout)
        return 0
    n = 200 if a.quick else a.num_images
    workdir = a.workdir + ("-quick" if a.quick else "")
    large = a.large_images if a.large_images is not None else 8 if a.quick else 64
    if a.only == "large":
        # (the stream named at the call: a default bound at definition keeps the first one)
        _sibling("bench_large").run_large(workdir, large, a.workers, 1 if a.quick else 3,
                                          out=sys.stdout)
        return 0
    if a.only == "reads":
        run_read_bench(workdir, n, a.workers, quick=a.quick)
        return 0
    if a.only == "classification":
        run_classification(workdir, n, a.workers, dali_python=a.dali_python,
                           epochs=1 if a.quick else 3)
        return 0
    run_bench(workdir, n, a.workers, quick=a.quick, dali_python=a.dali_python,
              scale=0 if a.quick else a.scale, large_images=large, out=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
