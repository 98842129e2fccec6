"""LMDB container: same samples as RecordIO, fork/thread safety, map growth, bad input."""
import filecmp
import os
import shutil
import subprocess
import sys

import lmdb
import mxnet as mx
import numpy as np
import pytest

from gluon_data import ImageLMDBDataset, ImageRecordDataset, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.errors import CorruptRecordError, FormatError
from gluon_data.stores.lmdbio import LMDBFile, LMDBWriter, record_key, shared_env

from test_datasets import audit_loader


@pytest.fixture(scope="session")
def voc_lmdb(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("voc_lmdb") / "voc.lmdb")
    convert(voc_root, out, "voc", split="train,val")
    return out


@pytest.fixture(scope="session")
def voc_split_recs(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("voc_recs") / "voc.rec")
    return convert(voc_root, out, "voc", split="train,val").outputs


def test_lmdb_yields_exactly_the_recordio_samples(voc_lmdb, voc_split_recs):
    for split in ("train", "val"):
        a = SegmentationLMDBDataset(voc_lmdb, split)
        b = SegmentationRecordDataset(voc_split_recs[split])
        assert len(a) == len(b) > 0 and a.classes == b.classes and a.num_class == 21
        for i in range(len(a)):
            (ia, ma), (ib, mb) = a[i], b[i]
            np.testing.assert_array_equal(ia.asnumpy(), ib.asnumpy())
            np.testing.assert_array_equal(ma.asnumpy(), mb.asnumpy())
            assert ma.dtype == np.int32
    assert "split='val'" in repr(SegmentationLMDBDataset(voc_lmdb, "val"))


def test_classification_lmdb_matches_rec(cls_rec, tmp_path):
    out = str(tmp_path / "cls.lmdb")
    convert(cls_rec, out)
    a, b = ImageLMDBDataset(out), ImageRecordDataset(cls_rec)
    assert [a[i][1] for i in range(len(a))] == [b[i][1] for i in range(len(b))]
    np.testing.assert_array_equal(a[3][0].asnumpy(), b[3][0].asnumpy())


def test_rec_to_lmdb_to_rec_is_byte_identical(voc_rec, im2rec_rec, tmp_path):
    for name, src in (("ours", voc_rec), ("stock", im2rec_rec)):
        mid, back = str(tmp_path / (name + ".lmdb")), str(tmp_path / (name + "_back.rec"))
        convert(src, mid)
        convert(mid, back)
        for ext in (".rec", ".idx"):
            assert filecmp.cmp(src[:-4] + ext, back[:-4] + ext, shallow=False), (name, ext)
    assert filecmp.cmp(voc_rec[:-4] + ".meta.json", str(tmp_path / "ours_back.meta.json"),
                       shallow=False)


def test_lmdb_values_are_the_record_payloads_under_ordered_keys(voc_lmdb, voc_split_recs):
    from gluon_data.stores.recordio import RecordFile
    rec = RecordFile(voc_split_recs["train"])
    env = shared_env(voc_lmdb)  # py-lmdb allows one open environment per path and process
    with env.begin(db=env.open_db(b"train", create=False)) as txn:
        keys = [k for k, _ in txn.cursor()]
        assert keys == [record_key(i) for i in range(len(rec))]
        assert all(txn.get(record_key(i)) == rec.read(i) for i in range(len(rec)))


@pytest.mark.slow
def test_fork_stress_recreated_loader_many_reads_per_worker(voc_root, tmp_path):
    """The copied recipe fails with ReadersFullError after ~126 reads per worker."""
    out = str(tmp_path / "stress.lmdb")
    convert(voc_root, out, "voc", split="trainval")
    ds = SegmentationLMDBDataset(out, "trainval")
    ds[0]  # the parent has the environment open before the workers fork
    reads = []

    class Repeat(mx.gluon.data.Dataset):
        def __len__(self):
            return len(ds) * 20

        def __getitem__(self, i):
            img, mask = ds[i % len(ds)]
            return np.int64(i % len(ds)), np.int64(mask.asnumpy().sum())

    want = {i: int(ds[i][1].asnumpy().sum()) for i in range(len(ds))}
    for epoch in range(5):  # a new loader (new worker processes) every epoch
        loader = mx.gluon.data.DataLoader(Repeat(), batch_size=16, num_workers=2)
        seen = 0
        for idx, msum in loader:
            for i, m in zip(idx.asnumpy(), msum.asnumpy()):
                assert want[int(i)] == int(m)
                seen += 1
        reads.append(seen)
    assert reads == [len(ds) * 20] * 5  # 160 reads per worker per epoch


@pytest.mark.slow
def test_lmdb_dataloader_workers_and_thread_pool(voc_lmdb):
    ds = SegmentationLMDBDataset(voc_lmdb, "train")
    audit_loader(ds, epochs=2, num_workers=2)
    audit_loader(ds, epochs=2, num_workers=2, thread_pool=True)


def test_lmdb_dataset_pickles_and_two_datasets_share_a_path(voc_lmdb):
    import pickle
    a = SegmentationLMDBDataset(voc_lmdb, "train")
    b = SegmentationLMDBDataset(voc_lmdb, "val")
    a[0], b[0]
    c = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(c[1][1].asnumpy(), a[1][1].asnumpy())


@pytest.mark.reliability
def test_map_grows_from_a_tiny_map_without_losing_a_put(tmp_path):
    w = LMDBWriter(str(tmp_path / "g.lmdb"), map_size=64 << 10, commit_every=50)
    s = w.split("train")
    payloads = [codec.pack_classification(i, os.urandom(3000), id=i) for i in range(400)]
    for i, p in enumerate(payloads):
        s.write(i, p)
    s.finish({"format": "gluon_data", "format_version": 1, "task": "classification",
              "num_records": 400, "checksum": "crc32-id2"})
    s.publish()
    assert w.grows >= 3
    f = LMDBFile(str(tmp_path / "g.lmdb"), "train")
    assert len(f) == 400 and all(f.read(i) == payloads[i] for i in range(400))


def test_raw_encoding_round_trips_in_both_containers(voc_root, voc_rec, tmp_path):
    for out in (str(tmp_path / "raw.rec"), str(tmp_path / "raw.lmdb")):
        convert(voc_root, out, "voc", split="trainval", encoding="raw")
        ds = (SegmentationLMDBDataset(out, "trainval") if out.endswith(".lmdb")
              else SegmentationRecordDataset(out))
        ref = SegmentationRecordDataset(voc_rec)
        assert ds.meta["mask_encoding"] == "raw"
        for i in range(len(ref)):
            np.testing.assert_array_equal(ds[i][0].asnumpy(), ref[i][0].asnumpy())
            np.testing.assert_array_equal(ds[i][1].asnumpy(), ref[i][1].asnumpy())


# ---------------------------------------------------------------- bad input
@pytest.mark.reliability
def test_not_an_lmdb_and_missing_split(voc_lmdb, tmp_path):
    with pytest.raises(FormatError, match="not an LMDB"):
        SegmentationLMDBDataset(str(tmp_path))
    with pytest.raises(FormatError, match="not an LMDB"):
        SegmentationLMDBDataset(str(tmp_path / "nope.lmdb"))
    with pytest.raises(FormatError, match="available splits: train, val"):
        SegmentationLMDBDataset(voc_lmdb, "test")
    with pytest.raises(FormatError, match="ImageLMDBDataset|SegmentationLMDBDataset"):
        ImageLMDBDataset(voc_lmdb, "train")


@pytest.mark.reliability
def test_foreign_lmdb_without_metadata_is_refused(tmp_path):
    env = lmdb.open(str(tmp_path / "foreign"), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"0", b"x")
    env.close()
    with pytest.raises(FormatError, match="no gluon_data metadata"):
        ImageLMDBDataset(str(tmp_path / "foreign"))


@pytest.mark.reliability
@pytest.mark.parametrize("size", [0, 100, "half"])
def test_truncated_data_mdb_is_an_error_not_sigbus(voc_lmdb, tmp_path, size):
    bad = str(tmp_path / "bad.lmdb")
    shutil.copytree(voc_lmdb, bad)
    data = os.path.join(bad, "data.mdb")
    n = os.path.getsize(data) // 2 if size == "half" else size
    with open(data, "r+b") as f:
        f.truncate(n)
    code = ("from gluon_data import SegmentationLMDBDataset as D\n"
            "try:\n    d = D(%r); [d[i] for i in range(len(d))]\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n" % bad)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]  # a SIGBUS would give -7
    assert p.stdout.startswith("FormatError") and "data.mdb" in p.stdout


@pytest.mark.reliability
def test_corrupt_value_raises_checksum_error_naming_the_key(voc_lmdb, tmp_path):
    bad = str(tmp_path / "bad.lmdb")
    shutil.copytree(voc_lmdb, bad)
    env = lmdb.open(bad, max_dbs=8)
    db = env.open_db(b"train")
    with env.begin(write=True, db=db) as txn:
        v = bytearray(txn.get(record_key(2)))
        v[60] ^= 0xFF
        txn.put(record_key(2), bytes(v))
    env.close()
    ds = SegmentationLMDBDataset(bad, "train")
    ds[1]
    with pytest.raises(CorruptRecordError, match="record 2: checksum") as e:
        ds[2]
    assert e.value.path == bad


@pytest.mark.reliability
def test_failed_conversion_leaves_no_lmdb(tmp_path, voc_root):
    src = str(tmp_path / "VOC")
    shutil.copytree(voc_root, src)
    open(os.path.join(src, "JPEGImages", "2007_000003.jpg"), "wb").close()
    with pytest.raises(Exception, match="empty"):
        convert(src, str(tmp_path / "out.lmdb"), "voc", split="trainval")
    assert sorted(os.listdir(tmp_path)) == ["VOC"]


def test_overwrite_replaces_an_open_lmdb(tmp_path, voc_root):
    out = str(tmp_path / "o.lmdb")
    convert(voc_root, out, "voc", split="train")
    assert len(SegmentationLMDBDataset(out)) == 12
    with pytest.raises(FileExistsError):
        convert(voc_root, out, "voc", split="val")
    convert(voc_root, out, "voc", split="val", overwrite=True)
    assert len(SegmentationLMDBDataset(out, "val")) == 4


@pytest.mark.reliability
def test_reads_from_a_read_only_filesystem(voc_lmdb, voc_split_recs, tmp_path):
    """A real read-only bind mount, in a private mount namespace (no lock file can be made)."""
    import shutil as sh
    if not sh.which("unshare"):
        pytest.skip("unshare not available")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    sh.copytree(voc_lmdb, src / "voc.lmdb")
    for ext in (".rec", ".idx", ".meta.json"):
        sh.copy(voc_split_recs["train"][:-4] + ext, src / ("t" + ext))
    code = ("from gluon_data import SegmentationLMDBDataset as L, SegmentationRecordDataset as R\n"
            "import errno\n"
            "try:\n    open(%r, 'w')\n    raise SystemExit('mount is writable')\n"
            "except OSError as e:\n    assert e.errno == errno.EROFS, e\n"
            "a, b = L(%r, 'train'), R(%r)\n"
            "assert all((a[i][1].asnumpy() == b[i][1].asnumpy()).all() for i in range(len(a)))\n"
            "print('read', len(a))\n" % (str(mnt / "probe"), str(mnt / "voc.lmdb"),
                                         str(mnt / "t.rec")))
    script = ("mount --bind %s %s && mount -o remount,bind,ro %s && %s -c \"$CODE\""
              % (src, mnt, mnt, sys.executable))
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                       env=dict(os.environ, CODE=code), timeout=120)
    if p.returncode != 0 and "mount" in p.stderr and "read" not in p.stdout:
        pytest.skip("cannot make a read-only bind mount here: %s" % p.stderr.strip()[-200:])
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "read 12"
    assert not os.path.exists(os.path.join(str(src / "voc.lmdb"), "lock.mdb"))


@pytest.mark.reliability
def test_map_grown_by_another_process_is_handled(voc_root, tmp_path):
    out = str(tmp_path / "grow.lmdb")
    convert(voc_root, out, "voc", split="train")
    ds = SegmentationLMDBDataset(out)
    first = ds[0][1].asnumpy()
    env_size = os.path.getsize(os.path.join(out, "data.mdb"))
    code = ("import lmdb\n"
            "e = lmdb.open(%r, max_dbs=64, map_size=%d)\n"
            "db = e.open_db(b'scratch')\n"
            "with e.begin(write=True) as t:\n"
            "    t.put(b'big', b'x' * %d, db=db)\n"
            "e.close()\n" % (out, 64 * env_size + (256 << 20), 32 * env_size + (128 << 20)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert os.path.getsize(os.path.join(out, "data.mdb")) > 16 * env_size
    np.testing.assert_array_equal(ds[0][1].asnumpy(), first)
    assert all(ds[i][0].shape[2] == 3 for i in range(len(ds)))
