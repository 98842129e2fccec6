"""``gluon-data bench``'s classification rows: a stock im2rec ``.rec`` (and 4 shards of it)
read by the stock ``ImageRecordDataset``, ours and ``ImageRecordIter``, decode only and with
the ImageNet recipe, against DALI's CPU pipeline of the same recipe when an interpreter with
DALI is given; ``--only classification`` runs them alone. Imported by the
harness as module ``bench_cls`` (its folder is on ``sys.path``)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Optional, Tuple

from bench_common import (
    _CountBatchify, _loader_rates, _ratio_table, _say_cpu, _say_rates, make_dataset)


_DALI = r"""
import sys, time
from nvidia.dali import pipeline_def, fn, types
paths, idx, threads, n, recipe, warmup = (sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]),
                                          int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
@pipeline_def(batch_size=16, num_threads=threads, device_id=None)
def pipe():
    jpegs, labels = fn.readers.mxnet(path=paths, index_path=[idx], random_shuffle=True,
                                     name="r")
    norm = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip())
    if recipe.startswith("rrc224"):
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[0.75, 4.0 / 3])
        if recipe == "rrc224-decode":  # the random crop's region decoded, nothing else
            return images, labels
        if recipe == "rrc224-antialias":  # DALI's default resize: linear + antialiasing
            images = fn.resize(images, resize_x=224, resize_y=224)
        else:  # what RandomResizedCrop(224) does: cv2.resize INTER_LINEAR, no antialiasing
            images = fn.resize(images, resize_x=224, resize_y=224,
                               interp_type=types.INTERP_LINEAR, antialias=False)
        images = fn.crop_mirror_normalize(images, **norm)
    else:
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.crop_mirror_normalize(
            images, crop=(320, 320), crop_pos_x=fn.random.uniform(range=(0, 1)),
            crop_pos_y=fn.random.uniform(range=(0, 1)), out_of_bounds_policy="pad", **norm)
    return images, labels
p = pipe()
p.build()
for _ in range(warmup):  # the reader's shuffle buffer filled, every buffer allocated
    p.run()
t0, c0, seen = time.perf_counter(), time.process_time(), 0
while seen < n:
    images, _ = p.run()
    seen += len(images)
print(seen / (time.perf_counter() - t0), (time.process_time() - c0) * 1e3 / seen)
"""


def _dali_rate(python: str, rec, workers: int, n: int, recipe: str, warmup: int = 8,
               index: Optional[str] = None) -> float:
    """Items/s of :func:`_dali_run`."""
    return _dali_run(python, rec, workers, n, recipe, warmup, index)[0]


def _dali_run(python: str, rec, workers: int, n: int, recipe: str, warmup: int = 8,
              index: Optional[str] = None) -> Tuple[float, float]:
    """(items/s, CPU ms per item of the whole process, all threads) of DALI's CPU pipeline
    (``device_id=None``: no GPU, ``num_threads=workers``, batch 16) over ``rec``, run by
    ``python``, an interpreter that has DALI. ``rec`` is a ``.rec`` path, or the list of a
    dataset's shards with ``index`` their combined ``.idx``
    (:func:`gluon_data.stores.shards.write_combined_index`: ``fn.readers.mxnet`` takes several
    ``.rec`` files but one index, offsets counted as if the files were concatenated).
    Measured at its best: the pipeline is built and run ``warmup`` batches (the reader's
    shuffle buffer filled, every buffer allocated) before ``n`` images are timed, so
    neither start-up nor the first allocations count.

    ``recipe`` ``rrc224``: DALI's ImageNet recipe, ``fn.decoders.image_random_crop``
    (decodes only the random area/aspect region), ``fn.resize`` to 224x224 with linear
    interpolation and no antialiasing (what ``RandomResizedCrop(224)``'s
    ``cv2.resize(INTER_LINEAR)`` computes, and DALI's fastest resize), then
    ``fn.crop_mirror_normalize`` with a random mirror to float CHW — what
    ``RandomResizedCrop(224)`` + ``RandomFlipLeftRight`` + ``ToTensor`` + ``Normalize`` do;
    ``rrc224-antialias``: the same with DALI's default (antialiased) resize;
    ``rrc224-decode``: the random crop's region decoded only (what the recipe costs before
    resizing, set against :func:`_region_decode_cpu`);
    ``crop320``: decode, random 320 crop, mirror, normalize."""
    paths = [rec] if isinstance(rec, str) else list(rec)
    index = index or paths[0][:-4] + ".idx"
    res = subprocess.run([python, "-c", _DALI, ",".join(paths), index, str(workers), str(n),
                          recipe, str(warmup)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError("DALI run failed: %s" % res.stderr.strip()[-500:])
    rate, cpu_ms = res.stdout.strip().splitlines()[-1].split()
    return float(rate), float(cpu_ms)


def _stock_lst(cls_root: str, jpg_files) -> str:
    """im2rec's ``.lst`` of the images (labels ``i % 20``), ``cls_root/stock.lst``."""
    os.makedirs(cls_root, exist_ok=True)
    lst = os.path.join(cls_root, "stock.lst")
    with open(lst, "w") as f:
        f.write("".join("%d\t%d\tJPEGImages/%s\n" % (i, i % 20, os.path.basename(p))
                        for i, p in enumerate(jpg_files)))
    return lst


def _im2rec(voc: str, prefix: str, mode: str, threads: int) -> None:
    """MXNet's ``tools/im2rec.py`` packing ``prefix.lst`` into ``prefix.rec`` (``mode``
    ``pass-through`` keeps the JPEG bytes, ``re-encode`` re-encodes at quality 90)."""
    import mxnet as mx
    im2rec = os.path.join(os.path.dirname(mx.__file__), "tools", "im2rec.py")
    args = ["--pass-through"] if mode == "pass-through" else ["--quality", "90"]
    subprocess.run([sys.executable, im2rec, *args, "--num-thread", str(threads), prefix, voc],
                   check=True, capture_output=True)


def _stock_shards(stock_rec: str, shards: int = 4) -> str:
    """The records of ``stock_rec`` copied into ``shards`` ``.rec`` shards + manifest (kept
    if already there); returns the manifest."""
    from gluon_data.stores.recordio import RecordFile
    from gluon_data.stores.shardstore import ShardedStore
    from gluon_data.convert.sharded import convert_sharded
    out = os.path.join(os.path.dirname(stock_rec), "shards", "stock.rec")
    manifest = os.path.join(os.path.dirname(out), "stock.shards.json")
    if not os.path.exists(manifest) or len(ShardedStore(manifest)) != len(
            RecordFile(stock_rec)):  # absent, or left by a dataset of another size
        os.makedirs(os.path.dirname(out), exist_ok=True)
        convert_sharded(stock_rec, out, shards=shards, overwrite=True)
    return manifest


_CLS_RECIPE = "RandomResizedCrop 224 recipe"
_DALI_DECODE = "DALI CPU RandomResizedCrop 224 region decode only"
_OURS_DECODE = "ours RandomResizedCrop 224 region decode only, 1 process"


def _region_decode_cpu(stock_rec: str, n: int, rounds: int = 2) -> float:
    """The least CPU ms per item (this process, one thread) of the recipe's decode alone:
    ``RandomResizedCrop(224)``'s box drawn from the header's size and decoded by
    :func:`gluon_data.format.decode.decode_region`, as the dataset's fast path does, over
    the first ``n`` records (read first, not timed): the part of the recipe no change after
    the decoder can remove."""
    from gluon_data.arrays.tensorize import ImageCropNormalize
    from gluon_data.format import codec
    from gluon_data.format.decode import decode_region
    from gluon_data.stores.recordio import RecordFile
    store = RecordFile(stock_rec)
    images = [codec.unpack(store.view(i)).image for i in range(min(n, len(store)))]
    crop = ImageCropNormalize(("random", (224, 224), (0.08, 1.0), (3 / 4, 4 / 3), 1), seed=0)
    best = float("inf")
    for _ in range(rounds):
        c0 = time.thread_time()
        for buf in images:
            box, _ = crop.plan(*codec.image_size(buf))
            decode_region(buf, box)
        best = min(best, (time.thread_time() - c0) * 1e3 / max(1, len(images)))
    return best


_DALI_RECIPES = (("DALI CPU %s" % _CLS_RECIPE, "rrc224"),
                 ("DALI CPU %s, antialiased resize" % _CLS_RECIPE, "rrc224-antialias"))


_CLS_RATIOS = (  # (name, numerator row, denominator row, target)
    ("ours cls / stock ImageRecordDataset", "ours ImageRecordDataset",
     "stock ImageRecordDataset", 1.5),
    ("ours cls / stock ImageRecordIter", "ours ImageRecordDataset",
     "stock ImageRecordIter (crop 224)", 1.5),
    ("ours cls recipe / stock cls recipe", "ours ImageRecordDataset + " + _CLS_RECIPE,
     "stock ImageRecordDataset + " + _CLS_RECIPE, 3.0),
    ("ours cls recipe / DALI same recipe", "ours ImageRecordDataset + " + _CLS_RECIPE,
     _DALI_RECIPES[0][0], 1.8),
    ("ours cls recipe / DALI, antialiased resize", "ours ImageRecordDataset + " + _CLS_RECIPE,
     _DALI_RECIPES[1][0], None),
    ("ours sharded cls recipe / DALI sharded", "ours sharded + " + _CLS_RECIPE,
     "DALI CPU sharded %s" % _CLS_RECIPE, None),
    ("ours cls recipe: sharded / one .rec", "ours sharded + " + _CLS_RECIPE,
     "ours ImageRecordDataset + " + _CLS_RECIPE, None),
)


_CLS_CPU_RATIOS = (  # CPU ms per item: DALI's / ours (higher: ours cheaper)
    ("ours cls recipe / DALI, CPU per item", _DALI_RECIPES[0][0],
     "ours ImageRecordDataset + " + _CLS_RECIPE, 1.5),
    ("ours sharded / DALI sharded, CPU per item", "DALI CPU sharded %s" % _CLS_RECIPE,
     "ours sharded + " + _CLS_RECIPE, None),
    # the decoders alone, and the ceiling: DALI's whole recipe over our decode alone, the
    # ratio ours would reach if everything after decoding (resize, flip, normalise, batch,
    # transport) cost nothing
    ("decode only: ours / DALI, CPU per item", _DALI_DECODE, _OURS_DECODE, None),
    ("ours cls recipe / DALI, CPU, ceiling (all but decode free)", _DALI_RECIPES[0][0],
     _OURS_DECODE, None),
)


def _cls_recipe():
    """The ImageNet training recipe: ``RandomResizedCrop(224)`` + flip + ``ToTensor`` +
    ``Normalize``, as Gluon transforms."""
    from mxnet.gluon.data.vision import transforms
    return transforms.Compose([transforms.RandomResizedCrop(224),
                               transforms.RandomFlipLeftRight(), transforms.ToTensor(),
                               transforms.Normalize([.485, .456, .406], [.229, .224, .225])])


def classification_rates(stock_rec: str, n: int, workers: int, epochs: int,
                         dali_python: Optional[str] = None, notes: Optional[dict] = None,
                         shards: Optional[str] = None, cpu: Optional[dict] = None) -> dict:
    """Items/s of classification on a stock im2rec ``.rec``: decode only (stock and ours),
    the ImageNet recipe (stock ``ImageRecordDataset`` + Gluon's transforms, ours with the same
    transforms), ``ImageRecordIter``, and — with ``dali_python`` — DALI's CPU pipeline of the
    same recipe on the same file with ``num_threads=workers`` (and ``shards``, a
    ``.shards.json`` of the same records: ours and DALI reading its ``.rec`` shards). The
    loaders run in interleaved rounds (see :func:`_loader_rates`); one DALI pass of every
    DALI row runs after every round, each keeping its best, so a change of load on the
    machine hits DALI and ours alike. ``cpu`` collects the least CPU ms per item of the
    recipe loaders and the DALI rows (every process and thread each one runs)."""
    import mxnet as mx

    from gluon_data.gluon.batchify import StackBatchify
    from gluon_data.gluon.datasets import ClassificationDataset, ImageRecordDataset
    from gluon_data.stores.shardstore import ShardedStore
    from gluon_data.stores.shards import write_combined_index

    notes = {} if notes is None else notes
    cb, recipe = _CountBatchify(), _cls_recipe()
    stock_ds = mx.gluon.data.vision.ImageRecordDataset
    loaders = [
        ("stock ImageRecordDataset", stock_ds(stock_rec), cb),
        ("ours ImageRecordDataset", ImageRecordDataset(stock_rec), cb),
        ("stock ImageRecordDataset + " + _CLS_RECIPE,
         stock_ds(stock_rec).transform_first(recipe), None),
        ("ours ImageRecordDataset + " + _CLS_RECIPE,
         ImageRecordDataset(stock_rec).transform_first(recipe), StackBatchify()),
    ]
    dali_runs = [(name, stock_rec, None, how) for name, how in _DALI_RECIPES]
    dali_runs.append((_DALI_DECODE, stock_rec, None, "rrc224-decode"))
    if shards:
        combined = shards[:-len(".shards.json")] + ".all.idx"
        paths = write_combined_index(shards, combined)
        loaders.append(("ours sharded + " + _CLS_RECIPE,
                        ClassificationDataset(ShardedStore(shards)).transform_first(recipe),
                        StackBatchify()))
        dali_runs.append(("DALI CPU sharded %s" % _CLS_RECIPE, paths, combined, "rrc224"))
    dali_best: dict = {}
    cpu = {} if cpu is None else cpu

    def dali_round():
        if not dali_python or "DALI" in notes:
            return
        ms = _region_decode_cpu(stock_rec, min(n, 600))  # against DALI's decode only
        cpu[_OURS_DECODE] = min(cpu.get(_OURS_DECODE, ms), ms)
        for name, path, index, how in dali_runs:
            try:
                rate, ms = _dali_run(dali_python, path, workers, n, how, index=index)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                notes["DALI"] = str(e)
                return
            if name != _DALI_DECODE:  # a CPU row only: the recipe's rates compare whole
                dali_best[name] = max(dali_best.get(name, 0.0), rate)
            cpu[name] = min(cpu.get(name, ms), ms)

    loader_cpu: dict = {}
    results = _loader_rates(loaders, workers, epochs, between=dali_round, cpu=loader_cpu)
    cpu.update((k, v) for k, v in loader_cpu.items() if _CLS_RECIPE in k)
    results.update(dali_best)
    it = mx.io.ImageRecordIter(path_imgrec=stock_rec, data_shape=(3, 224, 224), batch_size=16,
                               preprocess_threads=workers, rand_crop=True)
    t0, seen = time.perf_counter(), 0
    for b in it:
        seen += 16 - b.pad
    results["stock ImageRecordIter (crop 224)"] = seen / (time.perf_counter() - t0)
    return results


def run_classification(workdir: str, n: int = 2000, workers: int = 2, out=sys.stdout,
                       dali_python: Optional[str] = None, epochs: int = 3) -> dict:
    """Only the classification rows of :func:`run_bench` (``--only classification``): the
    stock im2rec ``.rec`` of the same dataset, 4 shards of it, the loaders and DALI in
    interleaved rounds, and their ratios; returns ``{"rates", "ratios", "cpu"}`` (CPU ms per
    item of the recipe loaders and DALI)."""
    def say(*a):
        print(*a, file=out, flush=True)

    os.makedirs(workdir, exist_ok=True)
    say("dataset: %d VOC-like JPEG photos (300-500 px) in %s" % (n, workdir))
    voc = make_dataset(workdir, n)
    jpg_dir = os.path.join(voc, "JPEGImages")
    cls_root = os.path.join(workdir, "cls")
    stock_rec = os.path.join(cls_root, "stock.rec")
    if not os.path.exists(stock_rec[:-4] + ".idx"):
        _stock_lst(cls_root, [os.path.join(jpg_dir, f) for f in sorted(os.listdir(jpg_dir))])
        _im2rec(voc, stock_rec[:-4], "pass-through", workers)
    shards = _stock_shards(stock_rec)
    say("classification ...")
    notes: dict = {}
    cpu: dict = {}
    results = classification_rates(stock_rec, n, workers, epochs, dali_python, notes,
                                   shards=shards, cpu=cpu)
    _say_rates(say, results)
    _say_cpu(say, cpu)
    say("")
    table = _ratio_table(_CLS_RATIOS, results, say)
    _ratio_table(_CLS_CPU_RATIOS, cpu, say, table)
    for k, v in notes.items():
        say("note (%s): %s" % (k, v))
    return {"rates": results, "ratios": table, "cpu": cpu}

