"""Importing LMDBs in the original recipe's layout and Caffe's, built here with py-lmdb."""
import os
import pickle

import lmdb
import numpy as np
import pytest
from PIL import Image

from gluon_data import ImageRecordDataset, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data import convert
from gluon_data.errors import ConversionError
from legacy_lmdbs import datum_bytes, make_caffe_lmdb, make_recipe_lmdb  # noqa: F401


def test_recipe_lmdb_imports_in_numeric_key_order(tmp_path):
    src = str(tmp_path / "recipe")
    pairs = make_recipe_lmdb(src)
    for out in (str(tmp_path / "r.rec"), str(tmp_path / "r.lmdb")):
        rep = convert(src, out, "raw-lmdb", split="train", image_shape=(24, 32, 3),
                      num_classes=21)
        assert rep.written == {"train": 12}
        ds = (SegmentationLMDBDataset(out) if out.endswith(".lmdb")
              else SegmentationRecordDataset(out, ignore_value=None))
        assert ds.meta["image_encoding"] == "passthrough" and ds.meta["mask_encoding"] == "rle"
        for i, (img, mask) in enumerate(pairs):  # 0, 1, 2, ..., 10, 11 — not "0", "1", "10"
            np.testing.assert_array_equal(ds[i][0].asnumpy(), img)
            got = ds[i][1].asnumpy()
            np.testing.assert_array_equal(got if out.endswith(".rec") else
                                          np.where(got == -1, 255, got), mask)


def test_recipe_lmdb_channels_first_bgr(tmp_path):
    src = str(tmp_path / "recipe")
    pairs = make_recipe_lmdb(src, channels_first=True, bgr=True)
    out = str(tmp_path / "r.rec")
    convert(src, out, "raw-lmdb", image_shape=(3, 24, 32), channels_first=True, bgr=True,
            encoding="raw")
    ds = SegmentationRecordDataset(out)
    np.testing.assert_array_equal(ds[5][0].asnumpy(), pairs[5][0])
    assert ds.meta["mask_encoding"] == "raw"


@pytest.mark.reliability
def test_recipe_lmdb_errors_name_the_key_and_sizes(tmp_path):
    src = str(tmp_path / "recipe")
    make_recipe_lmdb(src)
    with pytest.raises(ConversionError, match=r"train_data/0\].*2304 bytes, but shape"):
        convert(src, str(tmp_path / "a.rec"), "raw-lmdb", image_shape=(24, 30, 3))
    with pytest.raises(ConversionError, match="found: train_data, train_label, val_data"):
        convert(src, str(tmp_path / "a.rec"), "raw-lmdb", split="test", image_shape=(24, 32, 3))
    with pytest.raises(ConversionError, match="--image-shape"):
        convert(src, str(tmp_path / "a.rec"), "raw-lmdb")
    assert sorted(os.listdir(tmp_path)) == ["recipe"]


class _Boom:
    def __reduce__(self):
        return (open, ("/tmp/gluon-data-unpickled-%d" % os.getpid(), "w"))


@pytest.mark.reliability
def test_pickled_values_are_never_unpickled(tmp_path):
    src = str(tmp_path / "evil")
    env = lmdb.open(src, max_dbs=4)
    d, lab = env.open_db(b"train_data"), env.open_db(b"train_label")
    with env.begin(write=True) as txn:
        txn.put(b"0", pickle.dumps(_Boom()), db=d)
        txn.put(b"0", pickle.dumps(_Boom()), db=lab)
        txn.put(b"1", pickle.dumps(_Boom()))
    env.close()
    marker = "/tmp/gluon-data-unpickled-%d" % os.getpid()
    with pytest.raises(ConversionError, match="not a raw uint8 array"):
        convert(src, str(tmp_path / "a.rec"), "raw-lmdb", image_shape=(2, 2, 3))
    assert not os.path.exists(marker)


def test_caffe_lmdb_imports_encoded_and_raw_datums(tmp_path, folder_root):
    src = str(tmp_path / "caffe")
    want = make_caffe_lmdb(src, folder_root)
    out = str(tmp_path / "c.rec")
    rep = convert(src, out, "caffe-lmdb")
    assert rep.written == {"train": len(want)}
    ds = ImageRecordDataset(out)
    import mxnet as mx
    stock = mx.gluon.data.vision.ImageRecordDataset(out)  # PNG/JPEG: stock-readable
    for i, (full, label, encoded) in enumerate(want):
        img, lab = ds[i]
        assert lab == label == stock[i][1]
        ref = (mx.image.imread(full).asnumpy() if encoded
               else np.asarray(Image.open(full).convert("RGB")))
        np.testing.assert_array_equal(img.asnumpy(), ref)


@pytest.mark.reliability
def test_caffe_lmdb_garbage_value_is_named(tmp_path):
    src = str(tmp_path / "bad")
    env = lmdb.open(src)
    with env.begin(write=True) as txn:
        txn.put(b"00000000_x.jpg", b"\xff\xff\xff not protobuf")
    env.close()
    with pytest.raises(ConversionError, match=r"00000000_x.jpg\]: value is not a caffe.Datum"):
        convert(src, str(tmp_path / "a.rec"), "caffe-lmdb")


@pytest.mark.slow
def test_recipe_lmdb_read_in_place_through_forked_workers(tmp_path):
    from gluon_data import RecipeLMDBDataset, SegmentationBatchify
    import mxnet as mx
    src = str(tmp_path / "recipe")
    pairs = make_recipe_lmdb(src)
    ds = RecipeLMDBDataset(src, "train", image_shape=(24, 32, 3), ignore_label=255)
    assert len(ds) == 12 and "12 records" in repr(ds)
    for i, (img, mask) in enumerate(pairs):
        np.testing.assert_array_equal(ds[i][0].asnumpy(), img)
        np.testing.assert_array_equal(ds[i][1].asnumpy(), np.where(mask == 255, -1, mask))
    for _ in range(3):  # the parent has the environment open; workers fork each epoch
        loader = mx.gluon.data.DataLoader(ds, batch_size=4, num_workers=2,
                                          batchify_fn=SegmentationBatchify())
        assert sum(b[0].shape[0] for b in loader) == 12
    with pytest.raises(Exception, match="found: train_data"):
        RecipeLMDBDataset(src, "test", image_shape=(24, 32, 3))
    bad = RecipeLMDBDataset(src, "train", image_shape=(24, 31, 3))
    with pytest.raises(Exception, match=r"record 0: image holds 2304 bytes"):
        bad[0]


def test_caffe_lmdb_read_in_place(tmp_path, folder_root):
    from gluon_data import CaffeLMDBDataset
    import mxnet as mx
    src = str(tmp_path / "caffe")
    want = make_caffe_lmdb(src, folder_root)
    ds = CaffeLMDBDataset(src)
    assert len(ds) == len(want)
    for i, (full, label, encoded) in enumerate(want):
        img, lab = ds[i]
        ref = (mx.image.imread(full).asnumpy() if encoded
               else np.asarray(Image.open(full).convert("RGB")))
        np.testing.assert_array_equal(img.asnumpy(), ref)
        assert lab == label
    assert CaffeLMDBDataset(src, flag=0)[1][0].shape[2] == 1
