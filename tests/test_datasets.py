"""Dataset contract: outputs, stock compatibility, DataLoader correctness, errors."""
import json
import multiprocessing
import os
import pickle
import shutil

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from gluon_data import ImageRecordDataset, SegmentationBatchify, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data.errors import CorruptRecordError, FormatError
from gluon_data.stores.recordio import RecordFile


class Tagged(mx.gluon.data.Dataset):
    """(index, image checksum, mask/label checksum) of each sample, to audit loaders."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        a, b = self.base[i]
        b = b.asnumpy() if isinstance(b, mx.nd.NDArray) else np.asarray(b)
        return np.int64(i), np.int64(a.asnumpy().astype(np.int64).sum()), \
            np.float64(b.astype(np.float64).sum())


def expected_table(ds):
    t = Tagged(ds)
    return {i: t[i][1:] for i in range(len(ds))}


def audit_loader(ds, epochs, **loader_kw):
    want = expected_table(ds)
    loader = mx.gluon.data.DataLoader(Tagged(ds), batch_size=3, shuffle=True, **loader_kw)
    for _ in range(epochs):
        seen = []
        for idx, isum, osum in loader:
            for i, a, b in zip(idx.asnumpy(), isum.asnumpy(), osum.asnumpy()):
                assert (a, b) == want[int(i)], "wrong contents for sample %d" % i
                seen.append(int(i))
        assert sorted(seen) == list(range(len(ds)))  # every sample exactly once


# ---------------------------------------------------------------- classification
def test_ours_equals_stock_dataset_on_im2rec_output(im2rec_rec):
    ours = ImageRecordDataset(im2rec_rec)
    stock = mx.gluon.data.vision.ImageRecordDataset(im2rec_rec)
    assert len(ours) == len(stock) > 0
    for i in range(len(ours)):
        (a, la), (b, lb) = ours[i], stock[i]
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
        assert la == lb and type(la) is type(lb)
    assert ours.classes is None
    gray, _ = ImageRecordDataset(im2rec_rec, flag=0)[0]
    assert gray.shape[2] == 1


def test_stock_readers_read_our_classification_files(cls_rec):
    ours = ImageRecordDataset(cls_rec)
    stock = mx.gluon.data.vision.ImageRecordDataset(cls_rec)
    for i in range(len(ours)):
        np.testing.assert_array_equal(ours[i][0].asnumpy(), stock[i][0].asnumpy())
        assert ours[i][1] == stock[i][1]
    it = mx.io.ImageRecordIter(path_imgrec=cls_rec, path_imgidx=cls_rec[:-4] + ".idx",
                               data_shape=(3, 16, 16), resize=16, batch_size=1,
                               preprocess_threads=1)
    labels = sorted(float(b.label[0].asscalar()) for b in it)
    assert labels == sorted(ours[i][1] for i in range(len(ours)))


def test_multilabel_vectors_come_back_as_float32_arrays(tmp_path, folder_root):
    lst = tmp_path / "multi.lst"
    files = sorted(os.path.relpath(os.path.join(d, f), folder_root)
                   for d, _, fs in os.walk(folder_root) for f in fs)
    lst.write_text("".join("%d\t%d\t%d.5\t%s\n" % (i, i % 3, i, f) for i, f in enumerate(files)))
    from gluon_data import convert
    out = str(tmp_path / "multi.rec")
    convert(str(lst), out, "lst", lst_root=folder_root)
    ours, stock = ImageRecordDataset(out), mx.gluon.data.vision.ImageRecordDataset(out)
    for i in range(len(ours)):
        la, lb = ours[i][1], stock[i][1]
        assert la.dtype == np.float32 and la.shape == (2,)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(la, [i % 3, i + 0.5])


# ---------------------------------------------------------------- segmentation
def test_segmentation_samples_match_the_source_files(voc_rec, voc_root):
    ds = SegmentationRecordDataset(voc_rec)
    ids = open(os.path.join(voc_root, "ImageSets/Segmentation/trainval.txt")).read().split()
    assert len(ds) == len(ids)
    f = RecordFile(voc_rec)
    for i, name in enumerate(ids):
        img, mask = ds[i]
        assert img.dtype == np.uint8 and mask.dtype == np.int32
        assert img.shape[:2] == mask.shape and img.shape[2] == 3
        jpg = open(os.path.join(voc_root, "JPEGImages", name + ".jpg"), "rb").read()
        assert codec.unpack(f.read(i)).image == jpg  # pass-through: bytes unchanged
        np.testing.assert_array_equal(img.asnumpy(), mx.image.imdecode(jpg).asnumpy())
        src = np.asarray(Image.open(os.path.join(voc_root, "SegmentationClass", name + ".png")))
        want = src.astype(np.int32)
        want[src == 255] = -1  # gluoncv's convention
        np.testing.assert_array_equal(mask.asnumpy(), want)
    raw = SegmentationRecordDataset(voc_rec, ignore_value=None)
    assert (raw[0][1].asnumpy() == 255).any()


def test_segmentation_dataset_properties_and_repr(voc_rec):
    ds = SegmentationRecordDataset(voc_rec)
    assert ds.num_class == 21 and ds.classes[0] == "background" and ds.ignore_label == 255
    assert ds.palette[1] == [128, 0, 0]
    r = repr(ds)
    assert "16 records" in r and voc_rec in r and "background" in r
    assert ds[-1][0].shape == ds[len(ds) - 1][0].shape
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_transform_and_transform_first_work(voc_rec):
    ds = SegmentationRecordDataset(voc_rec, transform=lambda im, m: (im.shape, m.shape))
    a, b = ds[0]
    assert a[:2] == b
    tf = SegmentationRecordDataset(voc_rec).transform_first(lambda im: im.astype("float32") / 255)
    assert tf[0][0].dtype == np.float32


# ---------------------------------------------------------------- loaders
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seg", "cls"])
def test_dataloader_workers_every_sample_once_per_epoch(voc_rec, cls_rec, kind):
    ds = SegmentationRecordDataset(voc_rec) if kind == "seg" else ImageRecordDataset(cls_rec)
    audit_loader(ds, epochs=3, num_workers=2)


@pytest.mark.slow
def test_dataloader_thread_pool_every_sample_once_per_epoch(voc_rec, im2rec_rec):
    audit_loader(SegmentationRecordDataset(voc_rec), epochs=3, num_workers=2, thread_pool=True)
    audit_loader(ImageRecordDataset(im2rec_rec), epochs=3, num_workers=2, thread_pool=True)


def test_thread_pool_many_reads_zero_wrong_records(voc_rec):
    """apache/mxnet#13945: a shared seek-then-read handle returns wrong records."""
    from concurrent.futures import ThreadPoolExecutor
    f = RecordFile(voc_rec)
    want = [f.read(i) for i in range(len(f))]
    order = np.random.default_rng(0).integers(0, len(f), 4000)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(f.read, order))
    assert sum(g != want[i] for g, i in zip(got, order)) == 0


def _sums(args):
    ds, idx = args
    return [int(ds[i][0].asnumpy().astype(np.int64).sum()) for i in idx]


@pytest.mark.slow
def test_pickled_dataset_works_in_spawned_process(voc_rec):
    ds = SegmentationRecordDataset(voc_rec)
    ds[0]  # open the file in this process first: nothing of it may leak into the pickle
    clone = pickle.loads(pickle.dumps(ds))
    assert [int(clone[i][0].asnumpy().astype(np.int64).sum()) for i in range(3)] == \
        _sums((ds, range(3)))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.map(_sums, [(ds, range(len(ds)))])[0] == _sums((ds, range(len(ds))))


# ---------------------------------------------------------------- errors
def copy_rec(src, dst_dir, name="copy"):
    stem = os.path.join(str(dst_dir), name)
    for ext in (".rec", ".idx", ".meta.json"):
        if os.path.exists(src[:-4] + ext):
            shutil.copy(src[:-4] + ext, stem + ext)
    return stem + ".rec"


def test_wrong_task_or_missing_metadata_is_a_clear_error(voc_rec, cls_rec, im2rec_rec):
    with pytest.raises(FormatError, match="SegmentationRecordDataset"):
        ImageRecordDataset(voc_rec)
    with pytest.raises(FormatError, match="ImageRecordDataset"):
        SegmentationRecordDataset(cls_rec)
    with pytest.raises(FormatError, match="no metadata"):
        SegmentationRecordDataset(im2rec_rec)


@pytest.mark.reliability
def test_unknown_format_version_is_refused(voc_rec, tmp_path):
    path = copy_rec(voc_rec, tmp_path)
    meta_file = path[:-4] + ".meta.json"
    meta = json.load(open(meta_file))
    meta["format_version"] = 99
    json.dump(meta, open(meta_file, "w"))
    with pytest.raises(FormatError, match="version 99 is not supported.*supports 1"):
        SegmentationRecordDataset(path)
    open(meta_file, "w").write("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        SegmentationRecordDataset(path)


@pytest.mark.reliability
def test_metadata_count_mismatch_is_detected(voc_rec, tmp_path):
    path = copy_rec(voc_rec, tmp_path)
    lines = open(path[:-4] + ".idx").read().splitlines(True)
    open(path[:-4] + ".idx", "w").write("".join(lines[:-1]))
    with pytest.raises(FormatError, match="promises 16"):
        SegmentationRecordDataset(path)


@pytest.mark.reliability
def test_flipped_bit_raises_checksum_error_naming_file_key_offset(voc_rec, tmp_path):
    path = copy_rec(voc_rec, tmp_path)
    f = RecordFile(path)
    off = f.offset(3)
    data = bytearray(open(path, "rb").read())
    data[off + 8 + 40] ^= 0x01  # inside record 3's payload
    open(path, "wb").write(bytes(data))
    ds = SegmentationRecordDataset(path)
    ds[2]
    with pytest.raises(CorruptRecordError, match="checksum") as e:
        ds[3]
    assert (e.value.path, e.value.key, e.value.offset) == (path, 3, off)
    assert "copy.rec" in str(e.value) and "record 3" in str(e.value)


@pytest.mark.slow
@pytest.mark.reliability
def test_worker_error_reaches_the_training_loop_with_file_and_key(voc_rec, tmp_path):
    path = copy_rec(voc_rec, tmp_path)
    f = RecordFile(path)
    data = bytearray(open(path, "rb").read())
    data[f.offset(5) + 8 + 40] ^= 0x01
    open(path, "wb").write(bytes(data))
    loader = mx.gluon.data.DataLoader(SegmentationRecordDataset(path), batch_size=4,
                                      num_workers=2, batchify_fn=SegmentationBatchify())
    with pytest.raises(Exception, match="copy.rec, record 5"):
        for _ in loader:
            pass
