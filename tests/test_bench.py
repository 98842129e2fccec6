"""The benchmark harness runs end to end on a tiny dataset (numbers are not asserted: only
that every measurement ran and the report holds every row)."""
import importlib.util
import io
import math
import os
import time

import numpy as np
import pytest

#: The steps that measure against stock MXNet (im2rec, ImageRecordIter, Gluon's DataLoader and
#: transforms) need it; the harness loads without it, and its framework-free steps (the scale
#: step, the harness's parts) run in the core lane too.
needs_mxnet = pytest.mark.skipif(
    importlib.util.find_spec("mxnet") is None,
    reason="this benchmark step compares with stock MXNet (im2rec, ImageRecordIter, Gluon's "
           "DataLoader), not installed here; it runs in the full lane")


@needs_mxnet
@pytest.mark.slow
def test_bench_smoke(tmp_path):
    from gluon_data.cli import load_bench
    run_bench = load_bench().run_bench
    out = io.StringIO()
    res = run_bench(str(tmp_path / "b"), n=24, workers=2, out=out, quick=True,
                    index_records=2000, epochs=1, large_images=2)
    rates = res["rates"]
    for key in ("raw copy of the files, 1 process", "ours convert pass-through, 2 workers",
                "im2rec pass-through, 2 threads", "decode limit, 2 processes",
                "gluoncv VOCSegmentation train", "ours .rec train", "ours LMDB train",
                "stock ImageRecordDataset", "ours ImageRecordDataset",
                "stock ImageRecordIter (crop 224)", "cat .rec (cold)",
                "ours sequential reads (cold)", "ours random reads (warm)",
                "stock read_idx random reads (warm)", "small files, read each (cold)",
                "decode, 2 processes, bytes sent by Pool.map (old limit)",
                "LMDB ours random reads, all of the records (cold)",
                "LMDB ours, DataLoader hints random reads, all of the records (cold)",
                "ours random reads, DataLoader hints (cold)",
                "stock read_idx random reads, 1/8 of the records (cold)",
                "LMDB py-lmdb default random reads, 1/8 of the records (cold)",
                "ours LMDB train (cold)", "ours .rec train (cold)"):
        assert key in rates, key
    assert all(v > 0 and math.isfinite(v) for v in rates.values())
    assert set(res["ratios"]) >= {"ours .rec train / gluoncv train",
                                  "ours cls / stock ImageRecordIter",
                                  "sequential reads / cat (cold)",
                                  "convert pass-through / raw copy",
                                  "ours .rec train / decode limit N",
                                  "ours LMDB train / ours .rec train (cold)",
                                  "LMDB cold random reads: ours hinted / py-lmdb default",
                                  "random reads hinted / stock read_idx (cold)",
                                  "random reads unhinted / stock read_idx (cold)"}
    assert res["index"]["ours bytes/record"] < res["index"]["stock bytes/record"]
    assert len(res["rss"]) == 3 and all(len(e) == 2 and all(p > 0 for p, _ in e)
                                        for e in res["rss"])
    text = out.getvalue()
    assert "ratio (same run)" in text and ("met" in text or "MISSED" in text)
    # the targets, and the direction beyond a step's target
    targets = res["ratios"].targets
    assert targets["ours .rec train / gluoncv train"] == (4.0, False)
    assert targets["ours .rec train / decode limit N"] == (0.7, False)
    assert "(direction 1.00)" in text
    missed = res["ratios"].missed()  # the summary line names every row below its target
    assert all(res["ratios"][k] < targets[k][0] or targets[k][1] for k in missed)
    assert ("targets: %d of " % (sum(t is not None for t, _ in targets.values()) - len(missed))
            in text)
    # after decode: uint8 batches + InputNormalize in the consumer against the float path
    uint8 = load_bench()._sibling("bench_uint8")
    for key in (uint8.FLOAT, uint8.UINT8, uint8.BARE):
        assert rates[key] > 0 and 0 < res["cpu"][key] < 1e4, key
    assert {name for name, *_ in uint8.RATIOS + uint8.CPU_RATIOS} <= set(res["ratios"])
    # LMDB on a slow device: its rows where this machine can throttle a loop device, else
    # a note saying it was skipped; and the GPU comparison, skipped without a GPU
    slow = [k for k in res["ratios"] if k.startswith("LMDB / RecordIO loaders")]
    reason = load_bench()._sibling("bench_lmdb").skip_reason()
    assert (len(slow) == 2) if reason is None else ("skipped: " + reason) in text
    # region decoding: decode CPU per image and the loaders with the region path on and off
    region = load_bench()._sibling("bench_region")
    assert all(v > 0 and math.isfinite(v) for v in res["region"].values()) and res["region"]
    decoding = res["decoding"]  # mask encodings against PNG, scaled decoding (bench_masks/scaled)
    assert all(v >= 0 and math.isfinite(v) for v in decoding.values()) and decoding
    assert {"mask decode, VOC 500x375: PNG / rle",
            "mask decode, Cityscapes 2048x1024: PNG / rle"} <= set(res["ratios"])
    assert targets["mask decode, VOC 500x375: PNG / rle"] == (4.0, False)
    assert {name for name, *_ in region.RATIOS} <= set(res["ratios"])
    # the large-image set (2 full-size scenes): its rows and its ratios in the one table
    large = load_bench()._sibling("bench_large")
    assert large.OURS in res["large"] and large.GLUONCV + large.CPU in res["large"]
    assert all(v > 0 and math.isfinite(v) for v in res["large"].values())
    assert {name for name, *_ in large.ratios(2)} <= set(res["ratios"])
    assert targets["ours large train / gluoncv large train"] == (5.0, False)
    import mxnet as mx
    assert ("note (GPU): skipped" in text) == (mx.context.num_gpus() == 0)
    assert set(res["seconds"]) >= {"conversion", "classification", "reads", "index",
                                   "LMDB on a slow device", "after decode: uint8 batches",
                                   "region decoding", "large images"}
    assert all(v >= 0 for v in res["seconds"].values()) and "step (wall s)" in text


def test_slow_device_step_says_why_it_was_skipped(monkeypatch):
    """Without root the LMDB-on-a-slow-device rows are skipped with a note that says so."""
    from gluon_data.cli import load_bench
    bench = load_bench()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    notes = {}
    assert bench.slow_device_rates(True, 1, notes, print) == {}
    assert notes == {"LMDB on a slow device": "skipped: needs root"}


@needs_mxnet
@pytest.mark.slow
def test_reads_only(tmp_path):
    """``--reads-only``: the read rows and their ratios, nothing else."""
    from gluon_data.cli import load_bench
    bench = load_bench()
    out = io.StringIO()
    res = bench.run_read_bench(str(tmp_path / "r"), n=16, workers=2, out=out, quick=True)
    names = {name for name, *_ in bench.READ_RATIOS}
    assert set(res["ratios"]) == names
    assert all(v > 0 and math.isfinite(v) for v in res["rates"].values())
    assert "ours .rec train (cold)" in res["rates"] and "ours .rec train" not in res["rates"]
    assert "random reads hinted / stock read_idx (cold)" in out.getvalue()


@needs_mxnet
@pytest.mark.slow
def test_segmentation_only_run_reports_rates_and_cpu_per_item(tmp_path, capsys):
    from gluon_data.cli import load_bench
    bench = load_bench()
    assert bench.main(["--only", "segmentation", "--num-images", "24",
                       "--workdir", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    res = bench.seg_bench(str(tmp_path / "b-seg24"), 24, 2, rounds=1, out=io.StringIO())
    rows = ("decode limit, 1 process", "decode limit, 2 processes",
            "ours .rec train, dataset + batchify, 2 processes, no DataLoader",
            "ours .rec train, DataLoader, 2 workers", "ours .rec train, DataLoader, 0 workers")
    for key in rows:
        assert key in text and key in res["rates"] and key in res["cpu_ms"], key
        assert 0 < res["rates"][key] < math.inf and 0 < res["cpu_ms"][key] < 1000, key
    assert "ours .rec train / decode limit N (CPU per item, inverse)" in text
    assert all(0 < v < math.inf for v in res["ratios"].values())


def test_scale_step_small(tmp_path):
    """The scale step on 20,000 tiny records: every worker opened, read, and reported, for
    the binary index, the text .idx (first open, then from the cache), a 4-shard manifest
    and workers forked after the parent opened; the rows against the targets exist."""
    from gluon_data.cli import load_bench
    from gluon_data.stores.recordio import RecordFile
    from gluon_data.tools.verify import verify_sharded
    bench = load_bench()
    out = bench.scale_costs(str(tmp_path), n=20_000, workers=2, reads=200, shards=4)
    f = RecordFile(str(tmp_path / "scale-20000.rec"))
    assert len(f) == 20_000 and f.read(19_999) == b"abcd"
    manifest = tmp_path / "scale-20000-shards" / "tiny.shards.json"
    rep = verify_sharded(str(manifest))  # the manifest's counts, sizes and checksums hold;
    assert rep.records == 20_000  # the only complaints are about the fake 4-byte payloads
    assert all("IRHeader" in p["reason"] for p in rep.problems), rep.problems[:3]
    assert os.listdir(tmp_path / "cache" / "index")  # the text .idx went to the bench's cache
    for case in ("binary index", "text .idx only, first open", "text .idx only, later opens",
                 "4-shard manifest"):
        for what in ("worst open s", "worst private MB", "random reads/s per worker",
                     "worst anonymous MB"):
            key = "20000, %s: %s" % (case, what)
            assert key in out and math.isfinite(out[key]), key
        assert 0 <= out["20000, %s: worst open s" % case] < 60
    for key in ("20000, forked after the parent opened: random reads/s per worker",
                "2,000 records: random reads/s per worker"):
        assert key in out and math.isfinite(out[key]), key
    assert all(v > 0 for k, v in out.items() if "reads/s" in k)
    rows = {name: (value, target) for name, value, target, _ in bench._scale_rows(out, 20_000)}
    assert len(rows) == 4 * 4 + 4 and all(math.isfinite(v) for v, _ in rows.values())
    assert all(v > 0 for name, (v, _) in rows.items() if "reads" in name or "open s" in name)


@needs_mxnet
def test_classification_only(tmp_path):
    """``--only classification``: the stock im2rec ``.rec``, its shards (the same records),
    every classification loader and the recipe ratios, on 16 images."""
    from gluon_data.cli import load_bench
    from gluon_data.stores.recordio import RecordFile
    from gluon_data.stores.shardstore import ShardedStore
    out = io.StringIO()
    res = load_bench().run_classification(str(tmp_path / "c"), n=16, workers=1, out=out,
                                          epochs=1)
    stock = tmp_path / "c" / "cls" / "stock.rec"
    shards = ShardedStore(str(tmp_path / "c" / "cls" / "shards" / "stock.shards.json"))
    assert len(shards) == len(RecordFile(str(stock))) == 16 and len(shards.paths) == 4
    assert [shards.read(i) for i in range(16)] == [RecordFile(str(stock)).read(i)
                                                   for i in range(16)]
    rates = res["rates"]
    for key in ("stock ImageRecordDataset", "ours ImageRecordDataset",
                "stock ImageRecordDataset + RandomResizedCrop 224 recipe",
                "ours ImageRecordDataset + RandomResizedCrop 224 recipe",
                "ours sharded + RandomResizedCrop 224 recipe",
                "stock ImageRecordIter (crop 224)"):
        assert key in rates and rates[key] > 0 and math.isfinite(rates[key]), key
    assert not any("DALI" in k for k in rates)  # no --dali-python: no DALI rows
    assert set(res["ratios"]) == {"ours cls / stock ImageRecordDataset",
                                  "ours cls / stock ImageRecordIter",
                                  "ours cls recipe / stock cls recipe",
                                  "ours cls recipe: sharded / one .rec"}
    assert set(res["cpu"]) == {"ours ImageRecordDataset + RandomResizedCrop 224 recipe",
                               "ours sharded + RandomResizedCrop 224 recipe",
                               "stock ImageRecordDataset + RandomResizedCrop 224 recipe"}
    assert all(0 < v < 1e4 for v in res["cpu"].values())
    assert "ours cls recipe / stock cls recipe" in out.getvalue()


@needs_mxnet  # the stock .rec it reads is im2rec's
@pytest.mark.skipif(not os.environ.get("GLUON_DATA_DALI_PYTHON"),
                    reason="needs an interpreter with nvidia-dali (GLUON_DATA_DALI_PYTHON)")
def test_dali_rows(tmp_path):
    """Opt-in (DALI needs numpy 2, so it lives in another environment): DALI's CPU pipeline
    reads the bench's stock ``.rec`` and its shards through one combined index, and the
    classification run reports the DALI rows and the ratio with its 1.8x target."""
    from gluon_data.cli import load_bench
    bench = load_bench()
    out = io.StringIO()
    res = bench.run_classification(str(tmp_path / "c"), n=32, workers=1, out=out, epochs=1,
                                   dali_python=os.environ["GLUON_DATA_DALI_PYTHON"])
    assert "note (DALI)" not in out.getvalue(), out.getvalue()
    for key in ("DALI CPU RandomResizedCrop 224 recipe",
                "DALI CPU RandomResizedCrop 224 recipe, antialiased resize",
                "DALI CPU sharded RandomResizedCrop 224 recipe"):
        assert res["rates"][key] > 0, key
    assert {"ours cls recipe / DALI same recipe", "ours sharded cls recipe / DALI sharded",
            "ours cls recipe / DALI, CPU per item"} <= set(res["ratios"])
    assert res["cpu"]["DALI CPU RandomResizedCrop 224 recipe"] > 0
    assert res["ratios"].targets["ours cls recipe / DALI same recipe"] == (1.8, False)
    assert "ours cls recipe / DALI same recipe" in out.getvalue()


@needs_mxnet
def test_full_run_conversion_step(tmp_path):
    """The full run's conversion step on 8 pairs (Dask on 8 too): the files later steps read,
    benchmarks/bench_convert.py's every row measured on the same pairs, and the issue's four
    conversion ratios with their targets in the table the full run prints."""
    from gluon_data.cli import load_bench
    from gluon_data.stores.recordio import RecordFile
    bench = load_bench()
    work = str(tmp_path / "c")
    voc = bench.make_dataset(work, 8)
    out = io.StringIO()
    rates, table = bench.conversion_rates(work, voc, 8, 2, quick=False, out=out)
    assert len(RecordFile(os.path.join(work, "voc.rec"))) == 8
    assert len(RecordFile(os.path.join(work, "cls", "stock.rec"))) == 8
    assert os.path.exists(os.path.join(work, "voc.lmdb", "data.mdb"))
    assert set(rates) == {
        "raw copy of the files, 1 process", "ours convert pass-through, 2 workers",
        "im2rec pass-through, 2 threads",
        "convert pass-through, 1 workers", "convert pass-through, 2 workers",
        "convert re-encode, 1 workers", "convert re-encode, 2 workers",
        "decode floor, 1 processes", "decode floor, 2 processes",
        "im2rec re-encode, 2 threads", "dask convert_sharded, 1 worker processes",
        "dask convert_sharded, 2 worker processes"}
    assert all(v > 0 and math.isfinite(v) for v in rates.values())
    assert len(table) == 10 and all(v > 0 for v in table.values())
    assert table.targets["parent CPU per converted item (ms)"] == (0.1, True)
    assert "workers the parent can serve (1-worker time / its CPU)" in table
    assert {name: table.targets[name][0] for name in table if table.targets[name][0]} == {
        "convert pass-through: 2 / 1 workers": 1.8,
        "convert pass-through 2 workers / decode floor 2": 0.8,
        "convert pass-through 1 worker / decode floor 1": 0.5,
        "convert pass-through 2 workers / decode floor 2 (>= 0.5)": 0.5,
        "convert 2/1 scaling / decode floor 2/1 scaling": 0.9,
        "convert re-encode: 2 / 1 workers": 1.8,
        "convert re-encode 2 workers / im2rec 2 threads": 1.0,
        "dask convert_sharded: 2 / 1 worker processes": 1.7,
        "parent CPU per converted item (ms)": 0.1}
    text = out.getvalue()  # bench_convert.py's own table, fixed costs included
    assert "convert pass-through: 2 / 1 workers" in text
    assert "convert 10 pairs, 2 workers (s)" in text
    assert "parent CPU per item, pass-through, 2 workers (ms)" in text
    assert "dask LocalCluster start-up, 2 workers (s)" in text


def test_harness_parts_load_from_the_harness_folder(tmp_path):
    """``GLUON_DATA_BENCH`` naming a copy of the harness elsewhere (as with an installed
    wheel): every module it is split into loads from that copy, each once under its own name,
    and a forked process unpickles an object one of them defines."""
    import shutil
    import subprocess
    import sys
    from gluon_data.cli import bench_path
    copy = tmp_path / "benchmarks"
    shutil.copytree(os.path.dirname(bench_path()), copy)
    code = (
        "import multiprocessing, pickle, sys\n"
        "from gluon_data.cli import load_bench\n"
        "b = load_bench()\n"
        "names = sorted(k for k in sys.modules if k.startswith(('gluon_data_bench', 'bench')))\n"
        "print(names)\n"
        "print(sorted({sys.modules[k].__file__.rsplit('/', 1)[0] for k in names}))\n"
        "blob = pickle.dumps(b._CountBatchify())\n"
        "with multiprocessing.get_context('fork').Pool(1) as pool:\n"
        "    print(pool.apply(pickle.loads, (blob,)).__class__.__module__)\n"
        "print(b._sibling('bench_lmdb') is not None, callable(b.run_bench))\n")
    env = dict(os.environ, GLUON_DATA_BENCH=str(copy / "bench.py"))
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == str(["bench_cls", "bench_common", "bench_reads", "bench_scale",
                            "gluon_data_bench"])
    assert lines[1] == str([str(copy)])
    assert lines[2] == "bench_common" and lines[3] == "True True"


@needs_mxnet
def test_large_images_only(tmp_path, capsys):
    """The large-image set on 4 street scenes at 256x128 (gluoncv's sizes scaled with the
    width: base 128, crop 96; batch 2): the files it packs (4:2:0 JPEGs, palette masks of
    the 19 Cityscapes ids and 255, the same pairs in the .rec), every row measured and a
    positive number, the ratios with their targets; then ``--only large`` from the command
    line on 2 full-size scenes (2048x1024, base 1024, crop 768)."""
    from PIL import Image

    from gluon_data.cli import load_bench
    from gluon_data.format import codec
    from gluon_data.format.headers import jpeg_frame
    from gluon_data.stores.recordio import RecordFile
    bench = load_bench()
    large = bench._sibling("bench_large")
    out = io.StringIO()
    res = large.run_large(str(tmp_path / "b"), n=4, workers=2, rounds=1, batch_size=2,
                          size=(256, 128), out=out)
    root = large.large_root(str(tmp_path / "b"), 4, (256, 128))
    voc = os.path.join(root, "VOC2012")
    names = sorted(os.listdir(os.path.join(voc, "JPEGImages")))
    assert len(names) == 4
    rec = RecordFile(os.path.join(root, "large.rec"))
    assert len(rec) == 4
    for i, name in enumerate(names):
        with open(os.path.join(voc, "JPEGImages", name), "rb") as f:
            jpeg = f.read()
        frame = jpeg_frame(jpeg)
        assert (frame.height, frame.width) == (128, 256)
        assert frame.sampling == ((2, 2), (1, 1), (1, 1))  # 4:2:0
        mask = Image.open(os.path.join(voc, "SegmentationClass", name[:-4] + ".png"))
        assert mask.mode == "P"
        ids = set(np.unique(np.asarray(mask)).tolist())
        assert ids <= set(range(19)) | {255} and len(ids - {255}) >= 4, ids
        assert codec.unpack(rec.read(i), segmentation=True).image == jpeg
    rows = res["rows"]
    for key in (large.decode_limit_key(2), large.OURS, large.OFF, large.SCALED, large.GLUONCV):
        assert key in rows and key + large.CPU in rows, key
    assert all(v > 0 and math.isfinite(v) for v in rows.values()), rows
    table = res["ratios"]
    assert set(table) == {name for name, *_ in large.ratios(2)}
    assert table.targets["ours large train / decode limit N"] == (1.2, False)
    assert table.targets["ours large train / gluoncv large train"] == (5.0, False)
    text = out.getvalue()
    assert "ours large train / gluoncv large train" in text and "targets: " in text
    assert ("note (large, DCT-scaled decode)" in text) != large.scaled_supported()
    # the command line: the default (Cityscapes) sizes, 2 scenes, one round
    assert bench.main(["--only", "large", "--quick", "--large-images", "2",
                       "--workdir", str(tmp_path / "c")]) == 0
    text = capsys.readouterr().out
    assert "large set: 2 street scenes 2048x1024" in text
    assert "ours large train / decode limit N" in text
    assert os.path.exists(os.path.join(large.large_root(str(tmp_path / "c-quick"), 2),
                                       "large.rec"))


def test_the_harness_does_not_import_the_cli_that_loads_it():
    """``gluon_data.cli`` loads ``benchmarks/bench.py`` by path; no file of the harness imports
    ``gluon_data.cli`` back (nor loads it by name): the dependency runs one way."""
    import ast
    from gluon_data.cli import bench_path
    folder = os.path.dirname(bench_path())
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            text = f.read()
        for node in ast.walk(ast.parse(text)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += ["%s: %s" % (name, n) for n in names if n.startswith("gluon_data.cli")]
        # a load by module name counts too (also inside the scripts the harness runs)
        found += ["%s: by name" % name for s in ("gluon_data.cli", "load_bench")
                  if s in text]
    assert not found, found


@pytest.mark.slow
def test_cores_sweep_small(tmp_path, capsys):
    """``gluon-data bench --only cores`` on 8 pairs with 1 and 2 workers: every row it can
    run here measured at each count and positive, the ratios to the decode limit, the rows
    that cannot run here skipped with a reason, the JSON as printed and the plot a PNG."""
    import json
    from gluon_data.cli import load_bench
    bench = load_bench()
    assert bench.main(["--only", "cores", "--num-images", "8", "--max-workers", "2",
                       "--quick", "--workdir", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    folder = tmp_path / "b-cores"
    with open(folder / "cores.json") as f:
        res = json.load(f)
    assert res["workers"] == [1, 2] and res["images"] == 8
    rows = res["rows"]
    assert {"decode limit", "ours convert"} <= set(rows)
    for kind in ("torch", "gluon"):
        loaders = {"ours, %s DataLoader" % kind, "files, %s DataLoader" % kind}
        assert (loaders <= set(rows)) != ("%s DataLoader" % kind in res["skipped"]), kind
    if importlib.util.find_spec("mxnet") is not None:
        assert "ours, gluon DataLoader" in rows
    if "torch DataLoader" not in res["skipped"]:  # BatchRing's row, against the file loader
        ring = "ours, batch ring, torch DataLoader"
        assert ring in rows and ring + " / files, torch DataLoader" in res["ratios"]
    for name, by_count in rows.items():
        assert set(by_count) == {"1", "2"} and all(0 < v < math.inf for v in by_count.values())
        assert name == "decode limit" or name + " / decode limit" in res["ratios"]
    assert "skipped" in res["gpu"] or res["gpu"]["fed items/s"] > 0
    assert ("GPU (lraspp_mobilenet_v3_large fed by ours / GPU-resident): skipped"
            in text) == ("skipped" in res["gpu"])
    if importlib.util.find_spec("matplotlib") is None:
        assert res["plot"].startswith("matplotlib does not import") and "plot: skipped" in text
    else:
        assert res["plot"] == str(folder / "cores.png")
        with open(res["plot"], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "ours convert / decode limit" in text


def test_cores_worker_counts():
    """1, 2, 4, ... up to the machine's cores, and the core count itself."""
    from gluon_data.cli import load_bench
    counts = load_bench()._sibling("bench_cores").worker_counts
    assert counts(1) == [1] and counts(2) == [1, 2] and counts(16) == [1, 2, 4, 8, 16]
    assert counts(15) == [1, 2, 4, 8, 15] and counts(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_feed_reproduction_small(tmp_path):
    """``bench_feed.py`` on 32 pairs, 1 worker, 2 batches a measurement: ours, ours with
    uint8 masks, the file loader and the control each measured standalone and under the
    consumer, with the main process's CPU per batch and the workers' counters (their CPU per
    item split into the dataset's own and the loader's); the batches with 4-byte masks are
    the larger ones."""
    from gluon_data.cli import load_bench
    feed = load_bench()._sibling("bench_feed")
    try:
        feed.import_torch()
    except ImportError:
        pytest.skip("PyTorch is not installed (GLUON_DATA_TORCH_PATH names a folder with it)")
    which = ("ours", "ours, uint8 masks", "files", "burn", "free, uint8 masks",
             "ours, uint8, workers niced")
    out = io.StringIO()
    res = feed.run_feed(str(tmp_path / "f"), n=32, workers=1, rounds=1, batches=2,
                        spin_ms=1.0, sleep_ms=1.0, which=which, out=out)
    rows = res["rows"]
    assert set(rows) == set(which)
    for name, row in rows.items():
        assert row["items/s"] > 0 and row["busy items/s"] > 0 and row["share"] > 0, name
        assert row["main ms/batch"] > 0 and row["threads"] >= 1, name
        assert row["worker ms/item"] > 0, name
    assert rows["ours"]["batch bytes"] == 16 * (3 * 480 * 480 + 4 * 480 * 480)
    assert rows["ours, uint8 masks"]["batch bytes"] == rows["files"]["batch bytes"] \
        == rows["free, uint8 masks"]["batch bytes"] == 16 * 4 * 480 * 480
    # the ceiling: the free control's rate under the consumer, for batches of its size only.
    # Against itself (one round) the control's share is busy / min(standalone, busy): 1 where
    # its standalone rate is the higher, above 1 where two noisy batches made it the lower.
    free = rows["free, uint8 masks"]
    assert free["share of ceiling"] == pytest.approx(
        free["busy items/s"] / min(free["items/s"], free["busy items/s"]))
    assert free["share of ceiling"] >= 1.0 - 1e-9
    assert rows["files"]["share of ceiling"] > 0
    assert math.isnan(rows["ours"]["share of ceiling"])  # (no free control of int32 masks)
    assert all(name in out.getvalue() for name in which)
    # the niced variant's workers run below this process, which is left as it was
    main = os.nice(0)
    ds, init = feed.datasets(str(tmp_path / "f"), 32, ("ours, uint8, workers niced",))[
        "ours, uint8, workers niced"]
    f = feed.Feed(feed.import_torch(), ds, 1, init)
    assert os.nice(0) == main
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in f.pids] == [min(19, main + 10)]
    del f
    # every item a worker reads goes through the timed wrapper, its tally shared with this
    # process: after 4 batches at start-up and 2 + 2 in one measurement, at least 8 x 16
    f = feed.Feed(feed.import_torch(), feed.Burn(64, 0.5), 1)
    got = f.rate(2)
    assert f.timed.tally[1] >= 8 * 16 and f.timed.tally[0] > 0
    assert got["items read"] >= 0 and got["items/s"] > 0
    # a window that begins on batches read before it (the queue refilled while the workers
    # waited) counts no more than the workers read in it: here two full batches lie ready
    # and the window, drained of nothing, takes them at once
    f = feed.Feed(feed.import_torch(), feed.Burn(640, 2.0), 1)
    f.ahead = 0
    time.sleep(1.0)
    got = f.rate(2)
    assert got["items taken"] == 2 * 16 and got["items read"] < got["items taken"]
    assert got["items/s"] == pytest.approx(got["items read"] / got["seconds"])


@pytest.mark.slow
def test_the_gpu_fed_rate_counts_no_batch_read_before_its_window():
    """``bench --only cores``' GPU-fed row, its timing run on the CPU: steps that take no
    time on a loader of ~2 ms an item, two full batches queued before the window; the rate
    is what the worker read in the window, not the batches taken at once."""
    import multiprocessing
    from gluon_data.cli import load_bench
    bench = load_bench()
    feed, cores = bench._sibling("bench_feed"), bench._sibling("bench_cores")
    try:
        torch = feed.import_torch()
    except ImportError:
        pytest.skip("PyTorch is not installed (GLUON_DATA_TORCH_PATH names a folder with it)")
    ctx = multiprocessing.get_context()
    counted = feed.Timed(feed.Burn(640, 2.0), ctx)
    loader = torch.utils.data.DataLoader(counted, batch_size=feed.BATCH, num_workers=1,
                                         prefetch_factor=2, persistent_workers=True,
                                         multiprocessing_context=ctx)
    batches = iter(loader)
    next(batches)
    time.sleep(1.0)  # the worker fills the queue: two batches ready
    taken = []
    t0 = time.perf_counter()
    rate = cores.fed_rate(lambda img, mask: taken.append(len(img)), batches, ahead=0,
                          steps=2, read=lambda: counted.tally[1], warm=0)
    seconds = time.perf_counter() - t0
    assert taken == [feed.BATCH] * 2
    assert rate < 0.5 * 2 * feed.BATCH / seconds  # the queued batches are not counted
    del batches, loader


def test_only_gpu_says_why_it_is_skipped_here(tmp_path, capsys):
    """``gluon-data bench --only gpu`` without a CUDA device (or PyTorch): the reason, before
    any data is made, and exit 0."""
    from gluon_data.cli import load_bench
    bench = load_bench()
    reason = bench._sibling("bench_gpu").gpu_skip_reason()
    if reason is None:
        pytest.skip("a CUDA device and a GPU backend are present: the step measures")
    assert bench.main(["--only", "gpu", "--workdir", str(tmp_path / "g")]) == 0
    assert capsys.readouterr().out.strip() == "gpu: " + reason
    assert not os.path.exists(str(tmp_path / "g"))


def test_conversion_scaling_without_the_fixed_cost():
    """bench_convert's row of what a long conversion approaches: each run's fixed cost (its
    10-pair run) out of its time, over the floor's scaling; no row where it cannot be told."""
    from gluon_data.cli import load_bench
    marginal = load_bench()._sibling("bench_convert")._marginal_scaling
    rates = {"convert pass-through, 1 workers": 400.0, "convert pass-through, 2 workers": 600.0,
             "decode floor, 1 processes": 1000.0, "decode floor, 2 processes": 1500.0}
    seconds = {"convert 10 pairs, 1 workers (s)": 0.1, "convert 10 pairs, 2 workers (s)": 0.4}
    # 1,200 pairs: (3.0 - 0.1) / (2.0 - 0.4) = 1.8125 against the floor's 1.5
    assert marginal(rates, seconds, 2, 1200) == pytest.approx(1.8125 / 1.5)
    assert marginal(rates, seconds, 2, 100) is None        # the 10-pair run: too large a part
    assert marginal(rates, seconds, 1, 1200) is None
    assert marginal(rates, {"convert 10 pairs, 1 workers (s)": 0.1}, 2, 1200) is None
    assert marginal(rates, dict(seconds, **{"convert 10 pairs, 2 workers (s)": 2.5}),
                    2, 1200) is None                      # a fixed cost over its run's time
