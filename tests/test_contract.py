"""One contract, every store x task: what a dataset over any record store must do.

Like torchvision's dataset test harness, every store runs the same tests: the same samples
as the reference for the same source, dtypes and shapes, pickling, DataLoader workers
(fork, ``thread_pool=True``, spawn), typed errors, gluoncv's modes, and randomness that
depends on ``(seed, epoch, index)`` only.

Adding a store = adding one fixture
-----------------------------------
Write a fixture that builds your store from the shared source and returns a
:class:`Case`, and add its name to ``SEGMENTATION_STORES`` or ``CLASSIFICATION_STORES``::

    @pytest.fixture(scope="module")
    def seg_shards(seg_source, tmp_path_factory):
        path = ...  # write seg_source["rec"]'s records into your container
        return Case("shards", lambda **kw: SegmentationDataset(open_store(path), **kw),
                    lambda tmp: SegmentationDataset(open_store(damaged_copy(path, tmp))))

``make(**options)`` builds the task dataset with the given options (``mode``, ``seed``,
``transform``, ...). ``damage(tmp_dir)`` builds it over a copy (in ``tmp_dir``) whose record 1
is damaged (a flipped byte, a truncated value): reading it must raise a typed error naming
the copy. The reference samples are the ``.rec`` converted from the source; a store must
return exactly them.
"""
import multiprocessing
import os
import pickle
import shutil
from typing import Callable, NamedTuple, Optional

import lmdb
import mxnet as mx
import numpy as np
import pytest

from gluon_data import (CaffeLMDBDataset, ClassificationDataset, ImageLMDBDataset,
                        ImageRecordDataset, RecipeLMDBDataset, SampleKey, SegmentationDataset,
                        SegmentationLMDBDataset, SegmentationRecordDataset, codec, convert)
from gluon_data.errors import FormatError, GluonDataError
from gluon_data.lmdbio import record_key
from gluon_data.recordio import RecordFile
from gluon_data.sample import make_voc
from gluon_data.store import open_store

SEGMENTATION_STORES = ["seg_rec", "seg_lmdb", "seg_recipe", "seg_shards", "seg_shards_lmdb"]
CLASSIFICATION_STORES = ["cls_rec_case", "cls_lmdb", "cls_caffe", "cls_shards"]
SIZE = 32  # the recipe layout needs one image shape


class Case(NamedTuple):
    name: str
    make: Callable  # make(**options) -> dataset
    damage: Callable  # damage(tmp_dir) -> dataset over a copy whose record 1 is damaged


def _flip(value: bytes, at: int) -> bytes:
    b = bytearray(value)
    b[at] ^= 0xFF
    return bytes(b)


def _copy_lmdb_and_put(src: str, tmp_dir, db: Optional[bytes], key: bytes, fn) -> str:
    """A copy of the environment at ``src`` with ``key``'s value in ``db`` replaced by
    ``fn(old value)``."""
    dst = os.path.join(str(tmp_dir), os.path.basename(src.rstrip("/")) + "-damaged")
    shutil.copytree(src, dst)
    env = lmdb.open(dst, max_dbs=64, subdir=True)
    with env.begin(write=True) as txn:
        handle = env.open_db(db, txn=txn, create=False) if db else None
        txn.put(key, fn(bytes(txn.get(key, db=handle))), db=handle)
    env.close()
    return dst


def _damaged_rec(rec: str, tmp_dir) -> str:
    """A copy of the ``.rec`` (with its ``.idx`` and metadata) with a byte of record 1's
    image flipped: its CRC-32 no longer matches."""
    stem = os.path.join(str(tmp_dir), "damaged")
    for ext in (".rec", ".idx", ".meta.json"):
        if os.path.exists(rec[:-4] + ext):
            shutil.copy(rec[:-4] + ext, stem + ext)
    at = RecordFile(stem + ".rec").offset(1) + 8 + 40
    with open(stem + ".rec", "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return stem + ".rec"


def _damaged_shards(manifest: str, tmp_dir) -> str:
    """A copy of a sharded dataset (RecordIO shards) whose record 1 (in shard 0) has a byte
    of its image flipped."""
    dst = os.path.join(str(tmp_dir), "shards")
    shutil.copytree(os.path.dirname(manifest), dst)
    shard0 = sorted(f for f in os.listdir(dst) if f.endswith(".rec"))[0]
    path = os.path.join(dst, shard0)
    at = RecordFile(path).offset(1) + 8 + 40
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    return os.path.join(dst, os.path.basename(manifest))


# ------------------------------------------------------------------ sources and stores
@pytest.fixture(scope="module")
def seg_source(tmp_path_factory):
    root = make_voc(str(tmp_path_factory.mktemp("cvoc") / "VOC2012"), num_images=8,
                    size_range=(SIZE, SIZE), seed=5)
    rec = convert(root, str(tmp_path_factory.mktemp("crec") / "seg.rec"), "voc",
                  split="trainval").outputs["trainval"]
    ref = SegmentationRecordDataset(rec, ignore_value=None)
    samples = [(ref[i][0].asnumpy(), ref[i][1].asnumpy()) for i in range(len(ref))]
    return {"root": root, "rec": rec, "samples": samples}


@pytest.fixture(scope="module")
def seg_rec(seg_source):
    rec = seg_source["rec"]
    return Case("rec", lambda **kw: SegmentationRecordDataset(rec, **kw),
                lambda tmp: SegmentationRecordDataset(_damaged_rec(rec, tmp)))


@pytest.fixture(scope="module")
def seg_lmdb(seg_source, tmp_path_factory):
    lm = str(tmp_path_factory.mktemp("clmdb") / "seg.lmdb")
    convert(seg_source["root"], lm, "voc", split="trainval")
    return Case("lmdb", lambda **kw: SegmentationLMDBDataset(lm, split="trainval", **kw),
                lambda tmp: SegmentationLMDBDataset(_copy_lmdb_and_put(
                    lm, tmp, b"trainval", record_key(1), lambda v: _flip(v, 40)),
                    split="trainval"))


@pytest.fixture(scope="module")
def seg_shards(seg_source, tmp_path_factory):
    from gluon_data.shards import convert_sharded
    man = convert_sharded(seg_source["root"], str(tmp_path_factory.mktemp("cshards") / "seg.rec"),
                          "voc", split="trainval", shards=3).outputs["trainval"]
    return Case("shards", lambda **kw: SegmentationDataset(open_store(man), **kw),
                lambda tmp: SegmentationDataset(open_store(_damaged_shards(man, tmp))))


@pytest.fixture(scope="module")
def seg_shards_lmdb(seg_source, seg_shards, tmp_path_factory):
    """LMDB shards, copied shard by shard from the RecordIO shards."""
    from gluon_data.shards import convert_sharded
    rec_man = seg_shards.make().store.location
    man = convert_sharded(rec_man, str(tmp_path_factory.mktemp("cshl") / "seg.lmdb")
                          ).outputs["trainval"]
    def damage(tmp):
        dst = os.path.join(str(tmp), "lshards")
        shutil.copytree(os.path.dirname(man), dst)
        _copy_lmdb_and_put(os.path.join(dst, "seg-00000-of-00003.lmdb"), tmp, b"trainval",
                           record_key(1), lambda v: _flip(v, 40))
        shutil.rmtree(os.path.join(dst, "seg-00000-of-00003.lmdb"))
        os.rename(os.path.join(str(tmp), "seg-00000-of-00003.lmdb-damaged"),
                  os.path.join(dst, "seg-00000-of-00003.lmdb"))
        return SegmentationDataset(open_store(os.path.join(dst, "seg.shards.json")))
    return Case("shards-lmdb", lambda **kw: SegmentationDataset(open_store(man), **kw), damage)


@pytest.fixture(scope="module")
def seg_recipe(seg_source, tmp_path_factory):
    """The recipe layout written from the reference samples (raw arrays, str(i) keys)."""
    path = str(tmp_path_factory.mktemp("crecipe") / "recipe")
    env = lmdb.open(path, max_dbs=4, map_size=1 << 24)
    d, lab = env.open_db(b"trainval_data"), env.open_db(b"trainval_label")
    with env.begin(write=True) as txn:
        for i, (img, mask) in enumerate(seg_source["samples"]):
            txn.put(str(i).encode(), np.ascontiguousarray(img).tobytes(), db=d)
            txn.put(str(i).encode(), mask.astype(np.uint8).tobytes(), db=lab)
    env.close()
    def make(where=path, **kw):
        return RecipeLMDBDataset(where, split="trainval", image_shape=(SIZE, SIZE, 3),
                                 ignore_label=255, num_classes=21, **kw)
    return Case("recipe", make, lambda tmp: make(_copy_lmdb_and_put(
        path, tmp, b"trainval_data", b"1", lambda v: v[:-5])))


@pytest.fixture(scope="module")
def cls_source(folder_root, tmp_path_factory):
    rec = str(tmp_path_factory.mktemp("ccls") / "cls.rec")
    convert(folder_root, rec, "imagefolder")
    ref = ImageRecordDataset(rec)
    samples = [(ref[i][0].asnumpy(), ref[i][1]) for i in range(len(ref))]
    return {"rec": rec, "samples": samples}


@pytest.fixture(scope="module")
def cls_rec_case(cls_source):
    rec = cls_source["rec"]
    return Case("rec", lambda **kw: ImageRecordDataset(rec, **kw),
                lambda tmp: ImageRecordDataset(_damaged_rec(rec, tmp)))


@pytest.fixture(scope="module")
def cls_lmdb(cls_source, tmp_path_factory):
    lm = str(tmp_path_factory.mktemp("clsl") / "cls.lmdb")
    convert(cls_source["rec"], lm)
    return Case("lmdb", lambda **kw: ImageLMDBDataset(lm, split="train", **kw),
                lambda tmp: ImageLMDBDataset(_copy_lmdb_and_put(
                    lm, tmp, b"train", record_key(1), lambda v: _flip(v, 40)), split="train"))


@pytest.fixture(scope="module")
def cls_shards(cls_source, tmp_path_factory):
    from gluon_data.shards import convert_sharded
    man = convert_sharded(cls_source["rec"], str(tmp_path_factory.mktemp("cclsh") / "cls.rec"),
                          shards=3).outputs["train"]
    return Case("shards", lambda **kw: ClassificationDataset(open_store(man), **kw),
                lambda tmp: ClassificationDataset(open_store(_damaged_shards(man, tmp))))


@pytest.fixture(scope="module")
def cls_caffe(cls_source, tmp_path_factory):
    """A Caffe LMDB written from the reference samples: raw BGR CHW Datums."""
    from test_legacy import datum_bytes
    path = str(tmp_path_factory.mktemp("ccaffe") / "caffe")
    env = lmdb.open(path, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i, (img, label) in enumerate(cls_source["samples"]):
            chw = np.ascontiguousarray(img[:, :, ::-1].transpose(2, 0, 1))
            txn.put(b"%08d_x.jpg" % i, datum_bytes(int(label), chw.tobytes(), False,
                                                   *chw.shape))
    env.close()
    return Case("caffe", lambda **kw: CaffeLMDBDataset(path, **kw),
                lambda tmp: CaffeLMDBDataset(_copy_lmdb_and_put(
                    path, tmp, None, b"%08d_x.jpg" % 1, lambda v: b"\xff\xff not a Datum")))


@pytest.fixture(params=SEGMENTATION_STORES)
def seg(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(params=CLASSIFICATION_STORES)
def cls(request):
    return request.getfixturevalue(request.param)


# ------------------------------------------------------------------ helpers
def _np(x):
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def _seg_batch(samples):
    """Picklable batchify keeping every sample as numpy (the batch order is the sampler's)."""
    return [(_np(a), _np(b)) for a, b in samples]


def _cls_batch(samples):
    return [(_np(a), float(np.asarray(b).ravel()[0])) for a, b in samples]


def _through(ds, batches, batchify, **loader):
    out = []
    for batch in mx.gluon.data.DataLoader(ds, batch_sampler=batches, batchify_fn=batchify,
                                          **loader):
        out.extend(batch)
    return out


def _sums(args):
    ds, idx = args
    return [int(_np(ds[i][0]).astype(np.int64).sum()) for i in idx]


# ------------------------------------------------------------------ the contract: segmentation
def test_seg_same_samples_as_the_reference(seg, seg_source):
    ds = seg.make(ignore_value=None)
    ref = seg_source["samples"]
    assert len(ds) == len(ref) and "%d records" % len(ref) in repr(ds)
    assert isinstance(ds, SegmentationDataset)
    for i, (img, mask) in enumerate(ref):
        a, b = ds[i]
        assert a.dtype == np.uint8 and b.dtype == np.int32 and a.shape == (SIZE, SIZE, 3)
        np.testing.assert_array_equal(a.asnumpy(), img)
        np.testing.assert_array_equal(b.asnumpy(), mask)
    mapped = seg.make()[0][1].asnumpy()  # the ignore label comes back as -1 by default
    np.testing.assert_array_equal(mapped, np.where(ref[0][1] == 255, -1, ref[0][1]))
    assert ds.num_class == 21 and ds.NUM_CLASS == 21


def test_seg_pickling_and_workers(seg, seg_source):
    ds = seg.make(ignore_value=None)
    want = _sums((ds, range(len(ds))))
    assert _sums((pickle.loads(pickle.dumps(ds)), range(len(ds)))) == want
    batches = [[0, 1, 2], [3, 4, 5], [6, 7]]
    for loader in ({"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
        got = _through(ds, batches, _seg_batch, **loader)
        assert [int(a.astype(np.int64).sum()) for a, _ in got] == want, loader
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.map(_sums, [(ds, range(len(ds)))])[0] == want


def test_seg_typed_errors(seg):
    ds = seg.make()
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert _np(ds[-1][0]).shape == _np(ds[len(ds) - 1][0]).shape
    with pytest.raises(ValueError, match="unknown mode"):
        seg.make(mode="nope")


def test_seg_modes(seg):
    train = seg.make(mode="train", base_size=24, crop_size=20, seed=3)
    img, mask = train[SampleKey(1, epoch=2)]
    assert img.shape == (20, 20, 3) and mask.shape == (20, 20)
    again = train[SampleKey(1, epoch=2)]
    np.testing.assert_array_equal(again[0].asnumpy(), img.asnumpy())
    np.testing.assert_array_equal(again[1].asnumpy(), mask.asnumpy())
    val = seg.make(mode="val", crop_size=16)
    assert val[0][0].shape == (16, 16, 3)
    testval = seg.make(mode="testval")
    assert testval[0][0].shape == (SIZE, SIZE, 3)
    img, name = seg.make(mode="test")[2]
    assert img.shape == (SIZE, SIZE, 3) and isinstance(name, str)


@pytest.mark.parametrize("task", ["seg", "cls"])
def test_a_damaged_record_is_a_typed_error_naming_the_store(task, request, tmp_path):
    """Expected: reading the damaged record raises a GluonDataError (CorruptRecordError for
    checksummed stores, FormatError for legacy values) whose path is the damaged copy, and
    the records around it still read."""
    for name in (SEGMENTATION_STORES if task == "seg" else CLASSIFICATION_STORES):
        case = request.getfixturevalue(name)
        where = tmp_path / name
        where.mkdir()
        ds = case.damage(where)
        with pytest.raises(GluonDataError) as e:
            ds[1]
        assert e.value.path is not None and str(where) in e.value.path, (name, e.value)
        assert _np(ds[0][0]).ndim == 3 and _np(ds[2][0]).ndim == 3


def _hinted_loader(ds, batches, batchify, **loader):
    from gluon_data import DataLoader
    out = []
    for batch in DataLoader(ds, batch_sampler=batches, batchify_fn=batchify, **loader):
        out.extend(batch)
    return out


@pytest.mark.parametrize("task", ["seg", "cls"])
def test_will_need_then_read_gives_the_single_reads_bytes(task, request, tmp_path):
    """Every store, hinted (``store.will_need`` where it has one, nothing where it cannot:
    legacy, remote) then read, returns exactly the bytes of plain reads; a hint never
    raises, not for positions out of range, SampleKeys, or a damaged record; the damaged
    record's read (and gluon_data.DataLoader, which hints every batch) still raises the
    typed error naming the damaged copy."""
    from gluon_data.store import will_need
    names = SEGMENTATION_STORES if task == "seg" else CLASSIFICATION_STORES
    batchify = _seg_batch if task == "seg" else _cls_batch
    for name in names:
        case = request.getfixturevalue(name)
        ds = case.make()
        store = ds.store
        assert hasattr(store, "will_need") == (name not in ("seg_recipe", "cls_caffe")), name
        single = [bytes(store.read(i)) for i in range(len(store))]
        fresh = pickle.loads(pickle.dumps(ds))  # a copy that has opened nothing yet
        order = list(np.random.default_rng(2).permutation(len(store)))
        will_need(fresh.store, order + [len(store), -1, len(store) + 5])
        fresh.will_need([SampleKey(int(i), epoch=1) for i in order] + [-1, 10 ** 6])
        assert [bytes(fresh.store.read(int(i))) for i in order] == [single[i] for i in order]
        batches = [[int(i) for i in order[k:k + 3]] for k in range(0, len(order), 3)]
        want = _through(ds, batches, batchify)
        for loader in ({}, {"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
            got = _hinted_loader(ds, batches, batchify, **loader)
            assert len(got) == len(want), (name, loader)
            for (a, b), (c, d) in zip(got, want):
                np.testing.assert_array_equal(a, c)
                assert np.array_equal(b, d), (name, loader)
        where = tmp_path / name
        where.mkdir()
        bad = case.damage(where)
        will_need(bad.store, range(len(bad.store)))  # a hint reads and checks nothing
        bad.will_need(range(len(bad)))
        for loader in ({}, {"num_workers": 2, "thread_pool": True}):
            with pytest.raises(GluonDataError) as e:
                _hinted_loader(bad, [[2, 1, 0]], batchify, **loader)
            assert e.value.path is not None and str(where) in e.value.path, (name, e.value)
        assert _np(bad[2][0]).ndim == 3


def test_seg_missing_location_is_typed(seg, tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises((FileNotFoundError, FormatError)):
        SegmentationDataset(open_store(missing))


# ------------------------------------------------------------------ the contract: classification
def test_cls_same_samples_as_the_reference(cls, cls_source):
    ds = cls.make()
    ref = cls_source["samples"]
    assert len(ds) == len(ref) and isinstance(ds, ClassificationDataset)
    for i, (img, label) in enumerate(ref):
        a, b = ds[i]
        assert a.dtype == np.uint8
        np.testing.assert_array_equal(a.asnumpy(), img)
        assert b == label
    assert ds[SampleKey(3, epoch=4)][1] == ref[3][1]


def test_cls_pickling_workers_and_errors(cls):
    ds = cls.make()
    want = _sums((ds, range(len(ds))))
    assert _sums((pickle.loads(pickle.dumps(ds)), range(len(ds)))) == want
    batches = [list(range(i, min(i + 5, len(ds)))) for i in range(0, len(ds), 5)]
    for loader in ({"num_workers": 2}, {"num_workers": 2, "thread_pool": True}):
        got = _through(ds, batches, _cls_batch, **loader)
        assert [int(a.astype(np.int64).sum()) for a, _ in got] == want, loader
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.map(_sums, [(ds, range(len(ds)))])[0] == want
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(ValueError, match="flag"):
        cls.make(flag=3)


# ------------------------------------------------------------------ randomness that repeats
def _keyed_batches(order, epoch, size):
    keys = [SampleKey(i, epoch) for i in order]
    return [keys[j:j + size] for j in range(0, len(keys), size)]


CONFIGS = [{"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "thread_pool": True}]


@pytest.mark.parametrize("store", ["seg_rec", "seg_lmdb"])
def test_epoch_e_sample_i_is_identical_in_every_configuration(store, request):
    """Expected: with SampleKeys, sample (e, i) of a seeded train set is bit-identical with
    0 or 2 workers, with the thread pool, and for two sampler configurations (sequential,
    batch 3 / shuffled, batch 4); epochs differ from each other."""
    case = request.getfixturevalue(store)
    n = len(case.make())
    results = []
    for loader in CONFIGS:
        for order, size in ((list(range(n)), 3), (list(np.random.default_rng(0).permutation(n)),
                                                   4)):
            ds = case.make(mode="train", base_size=24, crop_size=20, seed=11)
            got = {}
            for epoch in (0, 1):
                batches = _keyed_batches(order, epoch, size)
                keys = [k for b in batches for k in b]
                for k, (img, mask) in zip(keys, _through(ds, batches, _seg_batch, **loader)):
                    got[int(k.index), epoch] = (img.tobytes(), mask.tobytes())
            results.append(got)
    for got in results[1:]:
        assert got == results[0]
    assert any(results[0][i, 0] != results[0][i, 1] for i in range(n))


def test_stock_int_samplers_first_pass_reproducible_everywhere(seg_rec, seg_lmdb):
    """Expected: plain ints (Gluon's samplers) give the same first pass in every
    configuration and from every store; a second pass in one process repeats across runs."""
    n = len(seg_rec.make())
    firsts = []
    for case in (seg_rec, seg_lmdb):
        for loader in CONFIGS:
            ds = case.make(mode="train", base_size=24, crop_size=20, seed=2)
            order = list(np.random.default_rng(len(firsts)).permutation(n))
            batches = [order[j:j + 3] for j in range(0, n, 3)]
            got = dict(zip(order, ((a.tobytes(), b.tobytes()) for a, b in
                                   _through(ds, batches, _seg_batch, **loader))))
            firsts.append(got)
    for got in firsts[1:]:
        assert got == firsts[0]
    a, b = seg_rec.make(mode="train", base_size=24, crop_size=20, seed=2), \
        seg_rec.make(mode="train", base_size=24, crop_size=20, seed=2)
    second_a = [(a[i], a[i])[1][0].asnumpy().tobytes() for i in range(n)]
    second_b = [(b[i], b[i])[1][0].asnumpy().tobytes() for i in range(n)]
    assert second_a == second_b
    assert second_a != [firsts[0][i][0] for i in range(n)]


def test_unseeded_datasets_draw_fresh_entropy(seg_rec):
    a = seg_rec.make(mode="train", base_size=24, crop_size=20)
    b = seg_rec.make(mode="train", base_size=24, crop_size=20)
    n = len(a)
    assert [a[i][0].asnumpy().tobytes() for i in range(n)] != \
        [b[i][0].asnumpy().tobytes() for i in range(n)]


@pytest.mark.parametrize("store", ["cls_rec_case", "cls_lmdb"])
def test_classification_fast_path_repeats_per_sample(store, request):
    """Expected: the recognised RandomResizedCrop + flip fast path draws from (seed, epoch,
    index): identical across workers, thread pool and sample order."""
    from mxnet.gluon.data.vision import transforms as VT
    case = request.getfixturevalue(store)
    recipe = VT.Compose([VT.RandomResizedCrop(12), VT.RandomFlipLeftRight(), VT.ToTensor()])
    n = len(case.make())
    results = []
    for loader in CONFIGS:
        for order in (list(range(n)), list(np.random.default_rng(1).permutation(n))):
            ds = case.make(seed=4).transform_first(recipe)
            assert ds.fast_path is not None
            batches = _keyed_batches(order, 3, 5)
            keys = [k for b in batches for k in b]
            got = {int(k.index): a.tobytes()
                   for k, (a, _) in zip(keys, _through(ds, batches, _cls_batch, **loader))}
            results.append(got)
    for got in results[1:]:
        assert got == results[0]
    other = case.make(seed=5).transform_first(recipe)
    assert [_np(other[SampleKey(i, 3)][0]).tobytes() for i in range(n)] != \
        [results[0][i] for i in range(n)]


def test_codec_reads_what_every_segmentation_store_holds(seg):
    store = seg.make().store
    for payload in store.scan():
        rec = codec.unpack(payload)
        assert codec.decode_mask(rec.mask).shape == (SIZE, SIZE)


def test_shard_is_the_same_dataset_type_over_part_of_the_store(seg, cls):
    """Expected: shard() keeps the class, options and fast paths; its samples are the whole
    dataset's, random draws included (they follow the index in the store)."""
    from mxnet.gluon.data.vision import transforms as VT
    full = seg.make(mode="train", base_size=24, crop_size=20, seed=7)
    part = full.shard(3, 1)
    assert type(part) is type(full) and len(part) == 3 and part.mode == "train"
    start = len(full) // 3 + 1  # Gluon's layout: 8 records -> 3, 3, 2
    for j in range(len(part)):
        a, b = part[SampleKey(j, 2)], full[SampleKey(start + j, 2)]
        np.testing.assert_array_equal(a[0].asnumpy(), b[0].asnumpy())
    assert sum(len(full.shard(3, k)) for k in range(3)) == len(full)
    with pytest.raises(IndexError):
        part[3]
    with pytest.raises(ValueError, match="index"):
        full.shard(3, 3)
    fast = cls.make(seed=1).transform_first(VT.Compose([VT.CenterCrop(8), VT.ToTensor()]))
    piece = fast.shard(2, 1)
    assert type(piece) is type(fast) and piece.fast_path is fast.fast_path
    np.testing.assert_array_equal(piece[0][0].asnumpy(), fast[len(fast) // 2][0].asnumpy())
