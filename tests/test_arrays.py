"""The framework-free datasets (gluon_data.arrays): numpy samples, the Gluon datasets' samples.

The first part needs no MXNet and runs on any Python with numpy (``-o addopts=""`` without
pytest-xdist): length, dtypes, the ignore value, pickling, seeds, ``DistributedSampler``
ranks, a spawned pool, errors, and that nothing imports MXNet. The second compares every mode
and container with the Gluon datasets (skipped without MXNet); the last reads through
PyTorch's ``DataLoader`` with two workers (skipped without PyTorch) and compares with the Gluon
dataset, or without MXNet with the samples read in this process.
"""
import json
import multiprocessing
import os
import re
import pickle
import subprocess
import sys

import numpy as np
import pytest

from gluon_data import convert
from gluon_data.arrays import ClassificationDataset, SegmentationDataset
from gluon_data.arrays.tensorize import ImageCropNormalize, ToTensorNormalize
from gluon_data.sampling.sampler import DistributedSampler, SampleKey
from gluon_data.stores.base import open_store
from conftest import torch_client_env

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TRAIN = dict(base_size=40, crop_size=32)
#: Gluon's ``RandomResizedCrop(12)`` (default scale, ratio, bilinear) as ImageCropNormalize's crop
RANDOM_CROP = ("random", (12, 12), (0.08, 1.0), (3 / 4, 4 / 3), 1)


@pytest.fixture(scope="module")
def voc_lmdb(voc_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("arrays_voc_lmdb") / "voc.lmdb")
    convert(voc_root, out, "voc", split="trainval")
    return out


@pytest.fixture(scope="module")
def cls_lmdb(folder_root, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("arrays_cls_lmdb") / "cls.lmdb")
    convert(folder_root, out, "imagefolder")
    return out


@pytest.fixture(scope="module")
def voc_ids(voc_root):
    with open(os.path.join(voc_root, "ImageSets", "Segmentation", "trainval.txt")) as f:
        return f.read().split()


def _seg(container, voc_rec, voc_lmdb, **kw):
    if container == "rec":
        return SegmentationDataset(voc_rec, **kw)
    return SegmentationDataset(voc_lmdb, split="trainval", **kw)


def _cls(container, cls_rec, cls_lmdb, **kw):
    return ClassificationDataset(cls_rec if container == "rec" else cls_lmdb, **kw)


def _bytes(sample):
    """A sample as comparable bytes: arrays by dtype, shape and contents, the rest by value."""
    return tuple((str(x.dtype), x.shape, x.tobytes()) if isinstance(x, np.ndarray) else x
                 for x in sample)


def _read_all(args):
    """Every sample of ``ds`` at ``keys``, as bytes (for a pool of worker processes)."""
    ds, keys = args
    return [_bytes(ds[k]) for k in keys]


def _flip_joint(img, mask):
    """A joint numpy transform (module level: it pickles)."""
    assert isinstance(img, np.ndarray) and isinstance(mask, np.ndarray)
    return img[:, ::-1].copy(), mask[:, ::-1].copy()


# ---------------------------------------------------------------- without MXNet
@pytest.mark.parametrize("container", ["rec", "lmdb"])
def test_length_dtypes_and_the_ignore_value(container, voc_rec, voc_lmdb, voc_ids):
    ds = _seg(container, voc_rec, voc_lmdb)
    assert len(ds) == len(voc_ids) == 16
    raw = _seg(container, voc_rec, voc_lmdb, ignore_value=None)
    seen_ignore = False
    for i in range(len(ds)):
        img, mask = ds[i]
        assert type(img) is np.ndarray and type(mask) is np.ndarray
        assert img.dtype == np.uint8 and mask.dtype == np.int32
        assert img.ndim == 3 and img.shape[2] == 3 and img.shape[:2] == mask.shape
        stored = raw[i][1]
        np.testing.assert_array_equal(mask, np.where(stored == 255, -1, stored))
        assert not (mask == 255).any() and mask.min() >= -1
        seen_ignore |= bool((mask == -1).any())
    assert seen_ignore  # VOC's 255 boundaries come back as -1
    assert ds.num_class == 21 and ds.classes[0] == "background" and ds.ignore_label == 255
    assert "16 records" in repr(ds) and ds.store.location in repr(ds)
    assert repr(ds).startswith("SegmentationDataset(")


@pytest.mark.parametrize("container", ["rec", "lmdb"])
def test_classification_length_dtypes_and_labels(container, cls_rec, cls_lmdb):
    ds = _cls(container, cls_rec, cls_lmdb)
    assert len(ds) == 12 and ds.classes == ["cat", "dog", "fish"]
    labels = []
    for i in range(len(ds)):
        img, label = ds[i]
        assert type(img) is np.ndarray and img.dtype == np.uint8 and img.shape[2] == 3
        assert type(label) is float
        labels.append(label)
    assert sorted(labels) == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    gray = _cls(container, cls_rec, cls_lmdb, flag=0)[0][0]
    assert gray.shape[2] == 1 and gray.shape[:2] == ds[0][0].shape[:2]
    assert "12 records" in repr(ds) and repr(ds).startswith("ClassificationDataset(")


def test_modes_shapes_and_names(voc_rec, voc_ids):
    train = SegmentationDataset(voc_rec, mode="train", seed=0, **TRAIN)
    img, mask = train[SampleKey(0, 0)]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8
    assert mask.shape == (32, 32) and mask.dtype == np.int32
    assert any((train[SampleKey(i, 0)][1] == -1).any() for i in range(len(train)))
    val = SegmentationDataset(voc_rec, mode="val", crop_size=24)
    assert val[0][0].shape == (24, 24, 3) and val[0][1].shape == (24, 24)
    full = SegmentationDataset(voc_rec)
    for i in (0, 5):
        np.testing.assert_array_equal(SegmentationDataset(voc_rec, mode="testval")[i][0],
                                      full[i][0])
    img, name = SegmentationDataset(voc_rec, mode="test")[3]
    assert name == voc_ids[3] + ".jpg" and img.shape == full[3][0].shape
    tensor, _ = SegmentationDataset(voc_rec, mode="val", crop_size=24,
                                    transform=ToTensorNormalize(MEAN, STD))[1]
    assert tensor.dtype == np.float32 and tensor.shape == (3, 24, 24)
    np.testing.assert_array_equal(tensor, ToTensorNormalize(MEAN, STD).image(val[1][0]))
    small, _ = SegmentationDataset(voc_rec, mode="val", crop_size=24, output="uint8")[1]
    assert small.dtype == np.uint8 and small.shape == (3, 24, 24)
    np.testing.assert_array_equal(small, val[1][0].transpose(2, 0, 1))
    with pytest.raises(ValueError, match="unknown mode"):
        SegmentationDataset(voc_rec, mode="nope")
    for bad in (dict(crop_size=(8, 16)), dict(crop_size=0), dict(base_size=24.5)):
        with pytest.raises(ValueError, match="crop_size and base_size must be positive "
                                             "integers"):
            SegmentationDataset(voc_rec, mode="train", **bad)


def test_uint8_output_refuses_a_normalising_transform_naming_it(voc_rec):
    """``output='uint8'`` with a transform that normalises is refused, naming the recipe as
    the user wrote it (not ``<bound method ToTensorNormalize.image of ...>``)."""
    with pytest.raises(ValueError, match="normalises") as e:
        SegmentationDataset(voc_rec, mode="train", base_size=48, crop_size=32, output="uint8",
                            transform=ToTensorNormalize(MEAN, STD))
    assert "transform=ToTensorNormalize(" in str(e.value) and "bound method" not in str(e.value)


def test_an_ignore_value_that_is_a_class_id_is_refused(voc_rec):
    """``ignore_value=0`` would return VOC's 255 outlines as class 0 (background), and train
    them as such: refused, naming the class and what to give; -1, 255 and None are taken."""
    with pytest.raises(ValueError, match=r"ignore_value=0 is the id of class 0 of the 21"):
        SegmentationDataset(voc_rec, ignore_value=0)
    for fine in (-1, 255, None):
        assert len(SegmentationDataset(voc_rec, ignore_value=fine)) > 0


def test_transform_is_a_numpy_callable(voc_rec, cls_rec):
    plain = SegmentationDataset(voc_rec)
    flipped = SegmentationDataset(voc_rec, transform=_flip_joint)
    img, mask = flipped[2]
    np.testing.assert_array_equal(img, plain[2][0][:, ::-1])
    np.testing.assert_array_equal(mask, plain[2][1][:, ::-1])
    cls = ClassificationDataset(cls_rec, transform=lambda im, lab: (im.shape, lab + 1))
    assert cls[0] == (ClassificationDataset(cls_rec)[0][0].shape,
                      ClassificationDataset(cls_rec)[0][1] + 1)


def test_a_fixed_seed_repeats_and_epochs_and_seeds_differ(voc_rec, cls_rec):
    a = SegmentationDataset(voc_rec, mode="train", seed=5, **TRAIN)
    b = SegmentationDataset(voc_rec, mode="train", seed=5, **TRAIN)
    n = len(a)
    e2 = [_bytes(a[SampleKey(i, 2)]) for i in range(n)]
    assert e2 == [_bytes(b[SampleKey(i, 2)]) for i in range(n)]
    assert e2 == [_bytes(b[SampleKey(i, 2)]) for i in range(n)]  # again: the same draws
    assert e2 != [_bytes(a[SampleKey(i, 3)]) for i in range(n)]
    other = SegmentationDataset(voc_rec, mode="train", seed=6, **TRAIN)
    assert e2 != [_bytes(other[SampleKey(i, 2)]) for i in range(n)]
    # plain ints: the k-th request of a sample is epoch k, in every fresh dataset
    c = SegmentationDataset(voc_rec, mode="train", seed=5, **TRAIN)
    first = [_bytes(c[i]) for i in range(n)]
    assert first == [_bytes(a[SampleKey(i, 0)]) for i in range(n)]
    assert [_bytes(c[i]) for i in range(n)] == [_bytes(a[SampleKey(i, 1)]) for i in range(n)]
    crop = ImageCropNormalize(RANDOM_CROP, flip=True, mean=MEAN, std=STD)
    x = ClassificationDataset(cls_rec, image_transform=crop, seed=1)
    y = ClassificationDataset(cls_rec, image_transform=crop, seed=1)
    z = ClassificationDataset(cls_rec, image_transform=crop, seed=2)
    m = len(x)
    assert x[SampleKey(0, 0)][0].shape == (3, 12, 12)
    assert [_bytes(x[SampleKey(i, 4)]) for i in range(m)] == \
        [_bytes(y[SampleKey(i, 4)]) for i in range(m)]
    assert [_bytes(x[SampleKey(i, 4)]) for i in range(m)] != \
        [_bytes(z[SampleKey(i, 4)]) for i in range(m)]
    assert crop.rng.seed is None  # the dataset's seed went to its own copy


_FORKED = None


def _forked_first_pass(n):  # in a forked child: the plain-int samples it reads first
    return [_bytes(_FORKED[i]) for i in range(n)]


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="needs the fork start method")
def test_a_forked_worker_starts_its_plain_int_passes_at_epoch_0(voc_rec):
    """Samples the main process looked at before the workers started (a sanity check) do
    not move a forked worker's first pass off epoch 0: the request counts are each
    process's own, as they are in a spawned worker."""
    global _FORKED
    _FORKED = SegmentationDataset(voc_rec, mode="train", seed=5, **TRAIN)
    n = len(_FORKED)
    epoch0 = [_bytes(_FORKED[SampleKey(i, 0)]) for i in range(n)]
    assert [_bytes(_FORKED[i]) for i in range(2)] == epoch0[:2]  # read here first
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_forked_first_pass, (n,)) == epoch0
    assert _bytes(_FORKED[0]) == _bytes(_FORKED[SampleKey(0, 1)])  # here: the second pass


def test_pickling_keeps_samples_and_options(voc_rec, voc_lmdb):
    for ds in (SegmentationDataset(voc_rec, mode="train", seed=3, **TRAIN),
               SegmentationDataset(voc_lmdb, split="trainval", mode="val", crop_size=24),
               SegmentationDataset(voc_rec, transform=_flip_joint)):
        want = [_bytes(ds[SampleKey(i, 1)]) for i in range(len(ds))]  # opens the store here
        copy = pickle.loads(pickle.dumps(ds))
        assert type(copy) is type(ds) and copy.mode == ds.mode and len(copy) == len(ds)
        assert [_bytes(copy[SampleKey(i, 1)]) for i in range(len(ds))] == want


def test_distributed_sampler_ranks_cover_every_index_once(voc_rec):
    ds = SegmentationDataset(voc_rec, mode="train", seed=9, **TRAIN)
    n, seen = len(ds), []
    for rank in range(2):
        sampler = DistributedSampler(n, num_replicas=2, rank=rank, seed=1, batch_size=3)
        sampler.set_epoch(4)
        for key in sampler:
            assert isinstance(key, SampleKey) and key.epoch == 4
            assert _bytes(ds[key]) == _bytes(ds[SampleKey(int(key), 4)])
            if not key.pad:
                seen.append(int(key))
    assert sorted(seen) == list(range(n))
    part = ds.shard(2, 1)  # Gluon's shard(): the draws follow the index in the whole store
    assert type(part) is SegmentationDataset and len(part) == n // 2
    assert _bytes(part[SampleKey(0, 4)]) == _bytes(ds[SampleKey(n // 2, 4)])


#: The jobs a forked pool's workers inherit (not pickled: the datasets as this process holds them)
_INHERITED = []


def _read_inherited(j):
    return _read_all(_INHERITED[j])


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_pool_of_processes_reads_what_this_process_reads(method, voc_rec, voc_lmdb, cls_rec):
    """Spawned workers get the datasets pickled; forked ones inherit them as they are after
    this process has read them (its files open), as a forked loader's workers do."""
    sets = [SegmentationDataset(voc_rec, mode="train", seed=2, **TRAIN),
            SegmentationDataset(voc_lmdb, split="trainval", mode="test"),
            ClassificationDataset(cls_rec, image_transform=ImageCropNormalize(
                RANDOM_CROP, flip=True), seed=2)]
    jobs = []
    for ds in sets:
        keys = [SampleKey(i, 1) for i in range(len(ds))]
        jobs += [(ds, keys[0::2]), (ds, keys[1::2])]
    want = [_read_all(job) for job in jobs]
    _INHERITED[:] = jobs
    try:
        with multiprocessing.get_context(method).Pool(2) as pool:
            if method == "fork":
                got = pool.map(_read_inherited, range(len(jobs)))
            else:
                got = pool.map(_read_all, jobs)
    finally:
        _INHERITED.clear()
    assert got == want
    assert [_read_all(job) for job in jobs] == want  # and this process reads on


def test_missing_paths_are_file_not_found_naming_them(tmp_path, voc_rec):
    for name in ("nothing.rec", "nothing.lmdb", "nothing"):
        path = str(tmp_path / name)
        for cls in (SegmentationDataset, ClassificationDataset):
            with pytest.raises(FileNotFoundError) as e:
                cls(path)
            assert path in str(e.value)


def test_a_missing_rec_beside_its_splits_or_its_shards_says_which_to_open(tmp_path):
    """``convert ... data/train.rec --shards 2`` writes no ``data/train.rec``; opening that
    name (as the docs' examples did) says where the dataset is: its manifest, or with
    several splits, its split files."""
    from gluon_data import convert
    from gluon_data.convert.sample import make_imagefolder
    from gluon_data.tools import salvage
    src = make_imagefolder(str(tmp_path / "src"), per_class=2)
    sharded, split = str(tmp_path / "s" / "train.rec"), str(tmp_path / "p" / "data.rec")
    convert(src, sharded, "imagefolder", shards=2)
    convert(src, split, "imagefolder", val_ratio=0.5)
    manifest = re.escape(str(tmp_path / "s" / "train.shards.json"))
    for open_it in (ClassificationDataset, lambda p: open_store(p), salvage):
        with pytest.raises(FileNotFoundError, match=r"beside it, the manifest of a sharded "
                           r"dataset: %s \(open that; each shard is a \.rec" % manifest):
            open_it(sharded)
    with pytest.raises(FileNotFoundError, match=r"one file per split: \S*data_train\.rec, "
                       r"\S*data_val\.rec"):
        ClassificationDataset(split)
    # shards of several splits: their manifests, never every shard as if it were a split
    several = str(tmp_path / "m" / "x.rec")
    convert(src, several, "imagefolder", val_ratio=0.5, shards=2)
    with pytest.raises(FileNotFoundError, match=r"manifest of a sharded dataset: "
                       r"\S*x_train\.shards\.json, \S*x_val\.shards\.json \(open") as e:
        ClassificationDataset(several)
    assert not re.search(r"-\d{5}-of-\d{5}", str(e.value))


def test_stores_and_options_are_checked(voc_rec, cls_rec):
    store = open_store(voc_rec)
    assert len(SegmentationDataset(store)) == 16
    with pytest.raises(ValueError, match="open already"):
        SegmentationDataset(store, split="train")
    with pytest.raises(ValueError, match="storage_options"):
        SegmentationDataset(voc_rec, storage_options={"anon": True})
    with pytest.raises(TypeError, match="record store"):
        SegmentationDataset(42)
    with pytest.raises(ValueError, match="classification dataset.*ClassificationDataset"):
        SegmentationDataset(cls_rec)
    with pytest.raises(ValueError, match="segmentation dataset.*SegmentationDataset"):
        ClassificationDataset(voc_rec)
    with pytest.raises(TypeError, match="image_transform"):
        ClassificationDataset(cls_rec, image_transform=_flip_joint)
    with pytest.raises(ValueError, match="normalis"):
        ClassificationDataset(cls_rec, output="uint8",
                              image_transform=ImageCropNormalize(RANDOM_CROP, mean=MEAN, std=STD))


def test_importing_and_reading_loads_no_mxnet(voc_rec, cls_rec):
    code = ("import sys\n"
            "import gluon_data.arrays as A\n"
            "from gluon_data.sampling.sampler import SampleKey\n"
            "ds = A.SegmentationDataset(%r, mode='train', base_size=40, crop_size=32, seed=0)\n"
            "ds[SampleKey(0, 1)]\n"
            "A.ClassificationDataset(%r, image_transform=A.tensorize.ImageCropNormalize("
            "('center', (8, 8), 1)))[0]\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mxnet', 'gluoncv'))\n"
            "assert not bad, bad\n"
            "assert not [m for m in sys.modules if m.startswith('gluon_data.gluon')]\n"
            "print('ok')\n" % (voc_rec, cls_rec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


# ---------------------------------------------------------------- the Gluon datasets' samples
@pytest.fixture(scope="module")
def gluon():
    """The Gluon layer (skips where MXNet is not installed)."""
    pytest.importorskip("mxnet", reason="the Gluon datasets to compare with need MXNet")
    import gluon_data.gluon.datasets as G
    return G


def _gluon_seg(G, container, voc_rec, voc_lmdb, **kw):
    if container == "rec":
        return G.SegmentationRecordDataset(voc_rec, **kw)
    return G.SegmentationLMDBDataset(voc_lmdb, split="trainval", **kw)


def _gluon_cls(G, container, cls_rec, cls_lmdb, **kw):
    if container == "rec":
        return G.ImageRecordDataset(cls_rec, **kw)
    return G.ImageLMDBDataset(cls_lmdb, **kw)


def _asnumpy(sample):
    return tuple(x.asnumpy() if hasattr(x, "asnumpy") else x for x in sample)


def _same_samples(ours, theirs, keys):
    """Every key gives equal samples: numpy arrays equal to the NDArrays' ``asnumpy()``, in
    dtype, shape and every value; names and labels equal."""
    assert len(ours) == len(theirs)
    for k in keys:
        a, b = ours[k], _asnumpy(theirs[k])
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(y, np.ndarray):
                assert type(x) is np.ndarray, type(x)
                assert x.dtype == y.dtype and x.shape == y.shape, (k, x.dtype, y.dtype)
                np.testing.assert_array_equal(x, y)
            else:
                assert type(x) is type(y) and x == y


@pytest.mark.parametrize("container", ["rec", "lmdb"])
@pytest.mark.parametrize("mode", ["train", "val", "testval", "test", None])
def test_segmentation_samples_are_the_gluon_datasets(gluon, container, mode, voc_rec,
                                                     voc_lmdb):
    kw = dict(mode=mode, seed=7, **TRAIN)
    ours = _seg(container, voc_rec, voc_lmdb, **kw)
    theirs = _gluon_seg(gluon, container, voc_rec, voc_lmdb, **kw)
    n = len(ours)
    _same_samples(ours, theirs, list(range(n)))  # plain ints: epoch 0, then 1
    _same_samples(ours, theirs, list(range(n)))
    _same_samples(ours, theirs, [SampleKey(i, e) for e in (0, 3) for i in range(n)])
    raw = dict(ignore_value=None) if mode != "test" else {}
    _same_samples(_seg(container, voc_rec, voc_lmdb, **raw, **kw),
                  _gluon_seg(gluon, container, voc_rec, voc_lmdb, **raw, **kw),
                  [SampleKey(i, 2) for i in range(n)])
    if mode is not None:  # the image transforms: a tensor, and uint8 for the consumer
        tf = gluon.numpy_image_transform  # (a Gluon ToTensor + Normalize is ToTensorNormalize)
        from mxnet.gluon.data.vision import transforms as VT
        gluon_tf = VT.Compose([VT.ToTensor(), VT.Normalize(MEAN, STD)])
        assert tf(gluon_tf) is not None
        _same_samples(_seg(container, voc_rec, voc_lmdb, transform=ToTensorNormalize(MEAN, STD),
                           **kw),
                      _gluon_seg(gluon, container, voc_rec, voc_lmdb, transform=gluon_tf, **kw),
                      [SampleKey(i, 1) for i in range(n)])
        _same_samples(_seg(container, voc_rec, voc_lmdb, output="uint8", **kw),
                      _gluon_seg(gluon, container, voc_rec, voc_lmdb, output="uint8", **kw),
                      [SampleKey(i, 1) for i in range(n)])


@pytest.mark.parametrize("region", ["1", "0"])
def test_crops_are_the_gluon_samples_with_region_decoding_on_and_off(gluon, region, voc_rec,
                                                                     cls_rec, monkeypatch):
    from mxnet.gluon.data.vision import transforms as VT
    from gluon_data.format import decode
    monkeypatch.delenv("GLUON_DATA_REGION_DECODE", raising=False)  # Gluon's: the default
    seg_keys = [SampleKey(i, 1) for i in range(16)]
    seg_want = [_bytes(_asnumpy(s)) for s in map(gluon.SegmentationRecordDataset(
        voc_rec, mode="train", seed=1, **TRAIN).__getitem__, seg_keys)]
    recipe = _recipe(VT.RandomResizedCrop(12), VT.RandomFlipLeftRight())
    cls_keys = [SampleKey(i, 1) for i in range(12)]
    cls_want = [_bytes(_asnumpy(s)) for s in map(gluon.ImageRecordDataset(
        cls_rec, seed=1).transform_first(recipe).__getitem__, cls_keys)]
    monkeypatch.setenv("GLUON_DATA_REGION_DECODE", region)
    assert decode.region_decoding() == (region == "1" and decode._jpegregion is not None)
    calls, real = [], decode._region
    monkeypatch.setattr(decode, "_region", lambda *a: calls.append(a[1]) or real(*a))
    seg = SegmentationDataset(voc_rec, mode="train", seed=1, **TRAIN)
    assert [_bytes(seg[k]) for k in seg_keys] == seg_want
    crop = ImageCropNormalize(RANDOM_CROP, flip=True, mean=MEAN, std=STD)
    cls = ClassificationDataset(cls_rec, image_transform=crop, seed=1)
    assert [_bytes(cls[k]) for k in cls_keys] == cls_want
    assert bool(calls) == decode.region_decoding()  # boxes went to the region decoder, or not


def _recipe(*head, normalize=True):
    from mxnet.gluon.data.vision import transforms as VT
    return VT.Compose(list(head) + [VT.ToTensor()]
                      + ([VT.Normalize(MEAN, STD)] if normalize else []))


@pytest.mark.parametrize("container", ["rec", "lmdb"])
def test_classification_samples_are_the_gluon_datasets(gluon, container, cls_rec, cls_lmdb):
    from mxnet.gluon.data.vision import transforms as VT
    n = len(_cls(container, cls_rec, cls_lmdb))
    keys = [SampleKey(i, e) for e in (0, 2) for i in range(n)]
    for flag in (1, 0):
        _same_samples(_cls(container, cls_rec, cls_lmdb, flag=flag),
                      _gluon_cls(gluon, container, cls_rec, cls_lmdb, flag=flag), keys)
    # Gluon's RandomResizedCrop + RandomFlipLeftRight + ToTensor + Normalize fast path
    theirs = _gluon_cls(gluon, container, cls_rec, cls_lmdb, seed=4).transform_first(
        _recipe(VT.RandomResizedCrop(12), VT.RandomFlipLeftRight()))
    ours = _cls(container, cls_rec, cls_lmdb, seed=4,
                image_transform=ImageCropNormalize(RANDOM_CROP, flip=True, mean=MEAN, std=STD))
    assert ours.fast_path.crop == theirs.fast_path.crop == RANDOM_CROP
    _same_samples(ours, theirs, keys)
    _same_samples(ours, theirs, list(range(n)))  # plain ints: the first pass
    theirs = _gluon_cls(gluon, container, cls_rec, cls_lmdb).transform_first(
        _recipe(VT.CenterCrop(10), normalize=False))
    ours = _cls(container, cls_rec, cls_lmdb,
                image_transform=ImageCropNormalize(("center", (10, 10), 1)))
    _same_samples(ours, theirs, keys)
    theirs = _gluon_cls(gluon, container, cls_rec, cls_lmdb, seed=3, output="uint8")
    ours = _cls(container, cls_rec, cls_lmdb, seed=3, output="uint8")
    _same_samples(ours, theirs, keys)
    theirs = theirs.transform_first(_recipe(VT.RandomResizedCrop(12), VT.RandomFlipLeftRight(),
                                            normalize=False))
    ours = _cls(container, cls_rec, cls_lmdb, seed=3, output="uint8",
                image_transform=ImageCropNormalize(RANDOM_CROP, flip=True))
    _same_samples(ours, theirs, keys)


def test_gluon_datasets_are_views_of_the_arrays_ones(gluon, voc_rec, cls_rec):
    import mxnet as mx
    from gluon_data.gluon import taskdatasets
    seg = gluon.SegmentationRecordDataset(voc_rec, mode="val", crop_size=24)
    assert isinstance(seg, SegmentationDataset) and isinstance(seg, mx.gluon.data.Dataset)
    assert isinstance(gluon.ImageRecordDataset(cls_rec), ClassificationDataset)
    for name in ("__getitem__", "_train_region", "_labels", "_image_out", "_record"):
        assert name not in vars(taskdatasets.SegmentationDataset), name
    assert "__getitem__" not in vars(taskdatasets.ClassificationDataset)
    img, mask = seg[0]
    assert isinstance(img, mx.nd.NDArray) and isinstance(mask, mx.nd.NDArray)


# ---------------------------------------------------------------- a PyTorch client
def _keep(sample):
    """A collate that keeps the dataset's numpy arrays (``batch_size=None``)."""
    return sample


def _reference(container, voc_rec, voc_lmdb, **kw):
    """The Gluon dataset where MXNet is installed, else ours read in this process."""
    try:
        import gluon_data.gluon.datasets as G
    except ImportError:  # no MXNet: the same samples read without workers
        return _seg(container, voc_rec, voc_lmdb, **kw)
    return _gluon_seg(G, container, voc_rec, voc_lmdb, **kw)


#: PyTorch's DataLoader over our datasets, in its own interpreter: gluoncv refuses to import
#: where torch >= 2 is importable, so torch lives outside the test environment (run.sh
#: installs the local CPU build into a folder and names it in GLUON_DATA_TORCH_PATH).
TORCH_CLIENT = r"""
import sys
import numpy as np
import torch
from gluon_data.arrays import SegmentationDataset
from gluon_data.sampling.sampler import DistributedSampler, SampleKey

location, split, out = sys.argv[1], sys.argv[2] or None, sys.argv[3]
ours = SegmentationDataset(location, split=split, mode="train", seed=12, base_size=40,
                           crop_size=32)
n, saved = len(ours), {}
for epoch in (0, 1):
    keys = [SampleKey(int(i), epoch) for i in np.random.default_rng(epoch).permutation(n)]
    loader = torch.utils.data.DataLoader(ours, sampler=keys, batch_size=None,
                                         collate_fn=lambda s: s, num_workers=2)
    for key, (img, mask) in zip(keys, loader):
        assert type(img) is np.ndarray and img.dtype == np.uint8, type(img)
        saved["%d_%d_img" % (epoch, key.index)] = img
        saved["%d_%d_mask" % (epoch, key.index)] = mask
# batched by torch's default collate: tensors of the same samples, in order
sampler = DistributedSampler(n, num_replicas=2, rank=1, seed=0, batch_size=4)
loader = torch.utils.data.DataLoader(ours, batch_sampler=sampler.batch_sampler(), num_workers=2)
for b, (keys, (imgs, masks)) in enumerate(zip(sampler.batch_sampler(), loader)):
    assert imgs.dtype == torch.uint8 and masks.dtype == torch.int32, (imgs.dtype, masks.dtype)
    for j, key in enumerate(keys):
        saved["b_%d_%d_img" % (key.epoch, key.index)] = imgs[j].numpy()
        saved["b_%d_%d_mask" % (key.epoch, key.index)] = masks[j].numpy()
np.savez(out, **saved)
print("torch", torch.__version__, len(saved))
"""


@pytest.mark.slow
def test_torch_dataloader_with_workers_yields_the_gluon_samples(voc_rec, voc_lmdb, tmp_path):
    env = torch_client_env()
    for container in ("rec", "lmdb"):
        location, split = (voc_rec, "") if container == "rec" else (voc_lmdb, "trainval")
        out = str(tmp_path / ("%s.npz" % container))
        run = subprocess.run([sys.executable, "-c", TORCH_CLIENT, location, split, out],
                             env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.startswith("torch 2."), run.stdout
        got = np.load(out)
        theirs = _reference(container, voc_rec, voc_lmdb, mode="train", seed=12, **TRAIN)
        n = len(theirs)
        sampler = DistributedSampler(n, num_replicas=2, rank=1, seed=0, batch_size=4)
        batched = {k for batch in sampler.batch_sampler() for k in batch}
        expected = {"%d_%d" % (e, i) for e in (0, 1) for i in range(n)}
        expected |= {"b_%d_%d" % (k.epoch, k.index) for k in batched}
        assert {k.rsplit("_", 1)[0] for k in got.files} == expected
        for name in expected:
            epoch, index = (int(v) for v in name.split("_")[-2:])
            want_img, want_mask = _asnumpy(theirs[SampleKey(index, epoch)])
            np.testing.assert_array_equal(got[name + "_img"], want_img)
            np.testing.assert_array_equal(got[name + "_mask"], want_mask)


#: Seeded ``train`` draws with plain-int indices through torch's DataLoader, workers new each
#: epoch (its default) and persistent: per epoch, per index, a hash of the image.
TORCH_EPOCHS = r"""
import hashlib, json, sys
import torch
from gluon_data.arrays import SegmentationDataset
train = SegmentationDataset(sys.argv[1], mode="train", base_size=40, crop_size=32, seed=0,
                            output="uint8")
out = {}
for persistent in (False, True):
    runs = []
    for _ in range(2):  # the same run twice: torch's generator seeded alike
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(train, batch_size=4, num_workers=2,
                                             persistent_workers=persistent)
        runs.append([[hashlib.sha1(x.numpy().tobytes()).hexdigest() for b, _ in loader
                      for x in b] for _ in range(3)])
    out[str(persistent)] = runs
print(json.dumps(out))
"""


@pytest.mark.slow
def test_torch_workers_new_each_epoch_draw_new_augmentations_each_epoch(voc_rec):
    """torch's DataLoader starts new worker processes every epoch (persistent_workers=False,
    its default), where every plain-int request counted as a first: every epoch drew the
    same crops, flips, scales and blurs. Its iterator's base seed now tells the epochs
    apart: different every epoch, the same run to run with torch's generator seeded alike."""
    env = torch_client_env()
    run = subprocess.run([sys.executable, "-c", TORCH_EPOCHS, voc_rec], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    for persistent, (first, again) in json.loads(run.stdout.splitlines()[-1]).items():
        assert first == again, persistent  # repeatable run to run
        for a, b in ((first[0], first[1]), (first[1], first[2])):
            same = sum(x == y for x, y in zip(a, b))
            assert same <= len(a) // 4, (persistent, same, len(a))  # (a rare crop may repeat)
