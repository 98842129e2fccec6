"""Sharded datasets: plan, manifest, ShardedStore, engines (local pool, a real Dask
LocalCluster with a worker killed mid-shard), stock MXNet readers, CLI."""
import filecmp
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import mxnet as mx
import pytest

from gluon_data import convert
from gluon_data.errors import ConversionError, FormatError
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_imagefolder
from gluon_data.stores.shardstore import ShardedStore
from gluon_data.convert.sharded import convert_sharded
from gluon_data.stores.shards import parse_size, plan_ranges, write_combined_index
from gluon_data.tools.verify import verify_sharded
from gluon_data.stores.base import open_store

from conftest import same_output_bytes


def same_tree(a, b):
    """Every file of folder ``a`` exists in ``b`` with identical bytes, and no other."""
    fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
    assert fa == fb
    for f in fa:
        pa, pb = os.path.join(a, f), os.path.join(b, f)
        if os.path.isdir(pa):
            same_tree(pa, pb)
        else:
            assert same_output_bytes(pa, pb), f


def payloads(store):
    return [store.read(i) for i in range(len(store))]


def gd(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "gluon_data", *args], capture_output=True,
                       text=True, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def voc_shards(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("voc_shards") / "voc.rec")
    convert_sharded(voc_root, out, "voc", split="trainval", shards=3)
    return out[:-4] + ".shards.json"


# ---------------------------------------------------------------- plan
def test_plan_ranges_and_sizes():
    assert plan_ranges([1] * 10, shards=3) == [(0, 3), (3, 6), (6, 10)]
    assert plan_ranges([1] * 10, shard_items=4) == [(0, 4), (4, 8), (8, 10)]
    assert plan_ranges([5, 5, 5, 5, 5], shard_size=10) == [(0, 2), (2, 4), (4, 5)]
    assert parse_size("1GB") == 10 ** 9 and parse_size("512MiB") == 512 << 20
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="need 1..3"):
        plan_ranges([1] * 3, shards=4)
    with pytest.raises(ValueError, match="exactly one"):
        plan_ranges([1] * 3, shards=1, shard_items=2)
    with pytest.raises(ValueError, match="cannot read .* as a size"):
        parse_size("lots")


def test_too_many_shards_names_the_split_that_has_too_few_items(voc_root, tmp_path):
    """16 shards of a 16-item source split into 12 and 4: the refusal names the split and its
    count, not a bare ``need 1..12`` a user cannot place."""
    with pytest.raises(ValueError, match=r"split 'train' \(12 items\): --shards 16: need "
                                         r"1\.\.12"):
        convert_sharded(voc_root, str(tmp_path / "v.rec"), "voc", split="train,val",
                        shards=16)
    assert not os.path.exists(str(tmp_path / "v.rec")) and os.listdir(str(tmp_path)) == []


# ---------------------------------------------------------------- sharded == unsharded
def test_sharded_store_equals_the_single_file(voc_rec, voc_shards):
    one = RecordFile(voc_rec)
    store = open_store(voc_shards)
    assert isinstance(store, ShardedStore) and len(store) == len(one) == 16
    assert [len(RecordFile(p)) for p in store.paths] == [5, 5, 6]
    assert payloads(store) == payloads(one)
    assert [bytes(v) for v in store.scan()] == payloads(one)
    assert [store.key(i) for i in range(16)] == [one.key(i) for i in range(16)]
    assert store.read(-1) == one.read(15) and bytes(store.view(7)) == one.read(7)
    with pytest.raises(IndexError):
        store.read(16)
    # the manifest's metadata is what one conversion writes (statistics merged exactly),
    # but for the identity stamp: another dataset, another (deterministic) conversion_id
    with open(voc_rec[:-4] + ".meta.json") as f:
        single = json.load(f)
    assert store.meta["conversion_id"] != single["conversion_id"]
    stamps = dict(conversion_id=None, meta_crc32=None,  # the id, and the CRC covering it
                  done=None)  # (a single file records its files; the shards, in theirs)
    assert dict(store.meta, **stamps) == dict(single, **stamps)
    assert store.meta["item_names"] == single["item_names"]
    clone = pickle.loads(pickle.dumps(store))
    assert clone.location == store.location and clone.read(9) == one.read(9)
    assert store.identity() == clone.identity()


def test_datasets_on_the_manifest_give_the_single_files_samples(voc_rec, voc_shards,
                                                                cls_rec, tmp_path):
    from gluon_data import ImageRecordDataset, SegmentationRecordDataset
    one, sharded = SegmentationRecordDataset(voc_rec), SegmentationRecordDataset(voc_shards)
    assert len(sharded) == len(one) and sharded.classes == one.classes
    for i in range(len(one)):
        for a, b in zip(one[i], sharded[i]):
            assert (a.asnumpy() == b.asnumpy()).all()
    man = convert_sharded(cls_rec, str(tmp_path / "c.rec"), shard_items=5).outputs["train"]
    one, sharded = ImageRecordDataset(cls_rec), ImageRecordDataset(man)
    assert [(sharded[i][0].asnumpy().tobytes(), sharded[i][1]) for i in range(len(one))] == \
        [(one[i][0].asnumpy().tobytes(), one[i][1]) for i in range(len(one))]


def test_a_replaced_manifest_is_refused_on_unpickling(voc_shards, tmp_path):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(os.path.dirname(voc_shards), str(d))
    man = str(d / "voc.shards.json")
    blob = pickle.dumps(ShardedStore(man))
    # re-sharded from the original (in place, onto its own files, is refused)
    convert_sharded(voc_shards, str(d / "voc.rec"), shards=2, overwrite=True)
    with pytest.raises(FormatError, match="replaced") as e:
        pickle.loads(blob)
    assert e.value.path == man


def test_shuffled_plan_and_worker_count_give_identical_bytes(folder_root, tmp_path):
    one = str(tmp_path / "one.rec")
    convert(folder_root, one, "imagefolder", shuffle=True, seed=7)
    a, b = tmp_path / "w1", tmp_path / "w2"
    convert_sharded(folder_root, str(a / "c.rec"), "imagefolder", shuffle=True, seed=7,
                    shard_items=5, workers=1)
    convert_sharded(folder_root, str(b / "c.rec"), "imagefolder", shuffle=True, seed=7,
                    shard_items=5, workers=2)
    same_tree(str(a), str(b))
    assert payloads(ShardedStore(str(a / "c.shards.json"))) == payloads(RecordFile(one))
    for d, w in (("l1", 1), ("l2", 2)):  # LMDB shards: one writer, same transactions
        convert_sharded(folder_root, str(tmp_path / d / "c.lmdb"), "imagefolder", shuffle=True,
                        seed=7, shard_items=5, workers=w)
    same_tree(str(tmp_path / "l1"), str(tmp_path / "l2"))
    assert payloads(open_store(str(tmp_path / "l1" / "c.shards.json"))) == \
        payloads(RecordFile(one))


# ---------------------------------------------------------------- restart, damage
def test_rerun_skips_done_shards_and_redoes_a_killed_one(folder_root, tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "out"
    convert_sharded(folder_root, str(ref / "c.rec"), "imagefolder", shards=3)
    convert_sharded(folder_root, str(out / "c.rec"), "imagefolder", shards=3)
    # a crash mid-shard: shard 1 unpublished, partial files of a killed attempt left over,
    # and no manifest yet (nothing is a dataset until its manifest exists)
    for ext in (".rec", ".idx", ".meta.json", ".idx.gdx"):
        os.remove(str(out / ("c-00001-of-00003" + ext)))
    with open(str(ref / "c-00001-of-00003.rec"), "rb") as f:
        half = f.read(40)  # half a record: how a killed writer's partial .rec begins
    with open(str(out / "c-00001-of-00003.rec.partial"), "wb") as f:
        f.write(half)
    os.remove(str(out / "c.shards.json"))
    with pytest.raises(FileNotFoundError, match="manifest is missing"):
        open_store(str(out / "c.shards.json"))
    with open(str(out / "other-notes.txt"), "w") as f:  # not a shard, whatever it starts with
        f.write("notes")
    with pytest.raises(FileNotFoundError, match=r"no sharded dataset at .*other\.shards\.json "
                       r"\(no such file\)"):  # no shard of that name: nothing unfinished
        open_store(str(out / "other.shards.json"))
    os.remove(str(out / "other-notes.txt"))
    before = os.stat(str(out / "c-00000-of-00003.rec")).st_mtime_ns
    rep = convert_sharded(folder_root, str(out / "c.rec"), "imagefolder", shards=3)
    assert [e["reused"] for e in rep.shards] == [True, False, True]
    assert os.stat(str(out / "c-00000-of-00003.rec")).st_mtime_ns == before
    same_tree(str(ref), str(out))
    # another plan over the same names is refused, not silently mixed in
    with pytest.raises(FileExistsError, match="not written by this plan"):
        convert_sharded(folder_root, str(out / "c.rec"), "imagefolder", shards=2)


def test_missing_or_damaged_shard_is_named(voc_shards, tmp_path):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(os.path.dirname(voc_shards), str(d))
    man = str(d / "voc.shards.json")
    assert verify_sharded(man).ok
    # damage one byte of shard 2's data
    p2 = str(d / "voc-00002-of-00003.rec")
    with open(p2, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    rep = verify_sharded(man)
    assert not rep.ok and any("voc-00002-of-00003" in (p["where"] or "") for p in rep.problems)
    r = gd("verify", man, check=False)
    assert r.returncode == 1 and "voc-00002-of-00003" in r.stderr  # problems go to stderr
    # delete shard 1: reading it names it, reading shard 0 still works
    os.remove(str(d / "voc-00001-of-00003.rec"))
    store = ShardedStore(man)
    assert store.read(0) == RecordFile(os.path.join(os.path.dirname(voc_shards),
                                                    "voc-00000-of-00003.rec")).read(0)
    with pytest.raises(FileNotFoundError, match=r"shard 1 of 3 .*voc-00001-of-00003\.rec"):
        store.read(6)
    rep = verify_sharded(man)
    assert any(p["reason"] == "shard is missing" and "shard 1 of 3" in p["where"]
               for p in rep.problems)
    r = gd("show", man, "--index", "6", "--out", str(tmp_path / "x.png"), check=False)
    assert r.returncode == 1 and "voc-00001-of-00003" in r.stderr


def test_manifest_is_checked_on_open(voc_shards, tmp_path):
    with open(voc_shards) as f:
        doc = json.load(f)
    bad = str(tmp_path / "bad.shards.json")
    for change, msg in (({"format_version": 9}, "manifest version 9"),
                        ({"num_records": 17}, "do not add up"),
                        ({"format": "other"}, "not a shard manifest")):
        with open(bad, "w") as f:
            json.dump(dict(doc, **change), f)
        with pytest.raises(FormatError, match=msg) as e:
            open_store(bad)
        assert e.value.path == bad
    with open(bad, "w") as f:  # a whole manifest, whose shards resolve beside it: missing
        json.dump(doc, f)
    with pytest.raises(FileNotFoundError, match="shard 0 of 3"):
        open_store(bad).read(0)


def test_bad_item_fails_naming_shard_and_item(tmp_path):
    root = make_imagefolder(str(tmp_path / "src"), per_class=3)
    bad = sorted(os.listdir(os.path.join(root, os.listdir(root)[0])))[0]
    bad = os.path.join(root, os.listdir(root)[0], bad)
    with open(bad, "wb") as f:
        f.write(b"not an image")
    with pytest.raises(ConversionError, match=r"shard \d of 3 .*item \d+") as e:
        convert_sharded(root, str(tmp_path / "o" / "c.rec"), "imagefolder", shards=3)
    assert e.value.path == bad
    assert not os.path.exists(str(tmp_path / "o" / "c.shards.json"))
    rep = convert_sharded(root, str(tmp_path / "s" / "c.rec"), "imagefolder", shards=3,
                          on_error="skip")
    store = ShardedStore(rep.outputs["train"])
    assert len(store) == 8 and [s["file"] for s in store.meta["skipped"]] == [bad]


# ---------------------------------------------------------------- copies between containers
def test_reshard_and_rec_lmdb_rec_shard_by_shard(voc_rec, voc_shards, tmp_path):
    one = payloads(RecordFile(voc_rec))
    re4 = convert_sharded(voc_rec, str(tmp_path / "re" / "v.rec"), shards=4)
    assert payloads(ShardedStore(re4.outputs["trainval"])) == one
    lm = convert_sharded(voc_shards, str(tmp_path / "lm" / "v.lmdb"))
    lstore = open_store(lm.outputs["trainval"])
    assert lstore.container == "lmdb" and len(lstore.paths) == 3 and payloads(lstore) == one
    assert verify_sharded(lm.outputs["trainval"]).ok
    back = convert_sharded(lm.outputs["trainval"], str(tmp_path / "back" / "voc.rec"))
    src_dir = os.path.dirname(voc_shards)
    for k in range(3):
        for ext in (".rec", ".idx"):
            name = "voc-%05d-of-00003%s" % (k, ext)
            assert filecmp.cmp(os.path.join(src_dir, name),
                               str(tmp_path / "back" / name), shallow=False), name
    assert ShardedStore(back.outputs["trainval"]).meta == ShardedStore(voc_shards).meta


# ---------------------------------------------------------------- stock MXNet
def _labels(it):
    out = []
    for b in it:
        out += b.label[0].asnumpy()[:b.data[0].shape[0] - b.pad].tolist()
    return out


def test_stock_mxnet_reads_each_shard_and_all_shards_at_once(cls_rec, folder_root, tmp_path):
    rep = convert_sharded(folder_root, str(tmp_path / "c.rec"), "imagefolder", shards=3)
    man = rep.outputs["train"]
    paths = ShardedStore(man).paths
    kw = dict(data_shape=(3, 16, 16), batch_size=4, resize=16)
    ref = _labels(mx.io.ImageRecordIter(path_imgrec=cls_rec, **kw))
    per, one = [], RecordFile(cls_rec)
    for p in paths:
        rio = mx.recordio.MXIndexedRecordIO(p[:-4] + ".idx", p, "r")
        for k in rio.keys:
            assert rio.read_idx(k) == one.read_key(k)
        rio.close()
        per += _labels(mx.io.ImageRecordIter(path_imgrec=p, path_imgidx=p[:-4] + ".idx", **kw))
    assert per == ref and len(ref) == 12
    # several files in one iterator: "a.rec;b.rec;c.rec", read in order...
    assert _labels(mx.io.ImageRecordIter(path_imgrec=";".join(paths), **kw)) == ref
    # ...and with one combined index (offsets into the concatenation), shuffled too
    idx = str(tmp_path / "all.idx")
    assert write_combined_index(man, idx) == paths
    it = mx.io.ImageRecordIter(path_imgrec=";".join(paths), path_imgidx=idx, shuffle=True,
                               seed=3, **kw)
    got = _labels(it)
    assert sorted(got) == sorted(ref) and got != ref


# ---------------------------------------------------------------- CLI
def test_cli_convert_info_stats_show_on_a_manifest(voc_root, tmp_path):
    out = str(tmp_path / "v.rec")
    r = gd("convert", voc_root, out, "--layout", "voc", "--split", "trainval",
           "--shard-items", "6", "--workers", "2", "--quiet")
    assert "shard   2" in r.stdout and "v-00002-of-00003.rec" in r.stdout
    man = str(tmp_path / "v.shards.json")
    info = json.loads(gd("info", man, "--json").stdout)
    assert info["shards"] == 3 and info["records"] == 16 and info["task"] == "segmentation"
    stats = json.loads(gd("stats", man, "--json").stdout)
    assert stats["records"] == 16 and len(stats["weights"]["enet"]) == 21
    r = gd("show", man, "--index", "13", "--out", str(tmp_path / "p.png"))
    assert "record 13" in r.stdout and os.path.getsize(str(tmp_path / "p.png")) > 0
    r = gd("convert", voc_root, str(tmp_path / "w.rec"), "--layout", "voc", "--engine", "dask",
           check=False)
    assert r.returncode == 1 and "--shards" in r.stderr


# ---------------------------------------------------------------- Dask
@pytest.fixture(scope="module")
def dask_cluster():
    dd = pytest.importorskip("dask.distributed")
    cluster = dd.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=None)
    client = dd.Client(cluster, timeout=60)
    try:
        yield cluster, client
    finally:
        client.close()
        cluster.close()


def test_dask_cli_output_identical_to_local(folder_root, tmp_path, dask_cluster):
    cluster, _ = dask_cluster
    common = ["--layout", "imagefolder", "--shards", "3", "--quiet", "--shuffle", "--seed", "2"]
    gd("convert", folder_root, str(tmp_path / "local" / "c.rec"), "--workers", "1", *common)
    gd("convert", folder_root, str(tmp_path / "dask" / "c.rec"), "--engine", "dask",
       "--scheduler", cluster.scheduler_address, *common)
    same_tree(str(tmp_path / "local"), str(tmp_path / "dask"))


def _convert_and_kill_mid_shard(root, out_dir, opts, cluster, client):
    """Run a Dask conversion; as soon as shard 1's partial files appear, freeze both
    workers (SIGSTOP), and if shard 1 is still unpublished SIGKILL the worker writing it and
    let the conversion finish. Returns ``(report, killed pid)``, or ``None`` when shard 1 was
    published before the freeze (then the run is let finish and the caller tries again)."""
    shard = "c-00001-of-00004"
    pids = client.run(os.getpid)
    box = {}

    def run():
        try:
            box["report"] = convert_sharded(root, str(out_dir / "c.rec"), "imagefolder",
                                            engine="dask", scheduler=cluster.scheduler_address,
                                            **opts)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    frozen, killed = {}, None
    try:
        deadline = time.time() + 90
        partial = str(out_dir / (shard + ".rec.partial"))
        while not os.path.exists(partial):
            assert time.time() < deadline and t.is_alive(), "shard 1 never started"
            time.sleep(0.001)
        for w, pid in pids.items():
            os.kill(pid, signal.SIGSTOP)
            frozen[w] = pid
        if not os.path.exists(str(out_dir / (shard + ".meta.json"))):  # mid-shard: kill it
            addr = [w for w, keys in client.processing().items()
                    if any(shard in str(k) for k in keys)]
            assert len(addr) == 1, addr
            killed = frozen.pop(addr[0])
            os.kill(killed, signal.SIGKILL)
    finally:
        for pid in frozen.values():
            os.kill(pid, signal.SIGCONT)
    t.join(150)
    assert not t.is_alive(), "conversion did not finish"
    if "error" in box:
        raise box["error"]
    if killed is None:
        return None
    assert killed not in client.run(os.getpid).values()  # that process really died
    return box["report"], killed


def test_dask_worker_killed_mid_shard_gives_identical_bytes(tmp_path, dask_cluster):
    """A worker SIGKILLed while writing a shard: Dask reschedules the task on another
    worker, and the result equals an uninterrupted run byte for byte."""
    cluster, client = dask_cluster
    root = make_imagefolder(str(tmp_path / "src"), per_class=40, size_range=(160, 200))
    opts = dict(shards=4, encoding="png")  # ~0.2 s of real work per shard
    for attempt in range(3):
        out_dir = tmp_path / ("dask%d" % attempt)
        got = _convert_and_kill_mid_shard(root, out_dir, opts, cluster, client)
        if got is not None:
            break
    assert got is not None, "could not catch shard 1 mid-write in 3 tries"
    convert_sharded(root, str(tmp_path / "local" / "c.rec"), "imagefolder", **opts)
    same_tree(str(tmp_path / "local"), str(out_dir))
    assert len(ShardedStore(got[0].outputs["train"])) == 120


_UNGUARDED_DASK = """from gluon_data import convert
convert(%r, %r, "voc", split="trainval", shards=2, engine="dask", workers=1)
print("converted")
"""


def test_a_script_converting_on_a_local_dask_cluster_without_the_main_guard_is_told_why(
        voc_root, tmp_path):
    """A local Dask cluster's workers are spawned by multiprocessing, which imports the main
    script in each: a script converting at import would convert again there. Each worker
    says why it stops, the parent's error names the rule (not Dask's "Nanny failed to
    start" alone), and nothing is written."""
    script = tmp_path / "convert_dask.py"
    out = tmp_path / "out" / "voc.rec"
    script.write_text(_UNGUARDED_DASK % (voc_root, str(out)))
    r = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "converted" not in r.stdout
    assert "a conversion was started while this spawned process imported the main script" \
        in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("gluon_data.errors.ConversionError: the local Dask cluster could "
                           "not start"), last
    assert 'if __name__ == "__main__":' in last
    assert not out.parent.exists() or os.listdir(str(out.parent)) == []


def test_missing_dask_extra_is_a_clear_import_error(monkeypatch, folder_root, tmp_path):
    import builtins
    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.startswith("dask"):
            raise ImportError("No module named %r" % name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ImportError, match=r"pip install gluon-data\[dask\]"):
        convert_sharded(folder_root, str(tmp_path / "c.rec"), "imagefolder", shards=2,
                        engine="dask")


def test_class_names_and_a_disagreeing_count_are_refused_like_the_unsharded_convert(
        voc_root, tmp_path):
    """Expected: the sharded path checks --classes against --num-classes as convert() does
    (it used to take the names' count silently)."""
    names = ["background", "cat", "dog"]
    for fn in (convert, convert_sharded):
        with pytest.raises(ValueError, match="num_classes=5 disagrees with 3 class names"):
            fn(voc_root, str(tmp_path / ("%s.rec" % fn.__name__)), "voc", split="trainval",
               classes=names, num_classes=5, **({"shards": 2} if fn is convert_sharded else {}))
        assert not any(f.endswith(".shards.json") for f in os.listdir(tmp_path))
