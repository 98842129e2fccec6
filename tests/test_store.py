"""The record-store layer: open_store over every built-in backend, the protocol, no MXNet
below the datasets, and the identity stamp that catches a dataset replaced underneath."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from gluon_data import ImageLMDBDataset, SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.errors import FormatError
from gluon_data.stores.lmdbio import LMDBFile
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import make_voc
from gluon_data.stores.base import RecordStore, open_store


def test_store_and_codec_layers_import_no_mxnet(voc_rec, tmp_path):
    """Expected: opening and reading every built-in store leaves mxnet out of sys.modules."""
    lm = str(tmp_path / "v.lmdb")
    convert(voc_rec, lm)
    code = ("import sys\n"
            "import gluon_data.stores.base, gluon_data.format.codec, gluon_data.stores.recordio, gluon_data.stores.lmdbio\n"
            "import gluon_data.stores.legacy, gluon_data.sampling.sampler, gluon_data.format.meta\n"
            "from gluon_data.stores.base import open_store\n"
            "for loc, split in ((%r, None), (%r, 'trainval')):\n"
            "    s = open_store(loc, split)\n"
            "    r = gluon_data.format.codec.unpack(s.read(0))\n"
            "    gluon_data.format.codec.decode_image(r.image); gluon_data.format.codec.decode_mask(r.mask)\n"
            "    assert sum(1 for _ in s.scan()) == len(s)\n"
            "bad = [m for m in sys.modules if m == 'mxnet' or m.startswith('mxnet.')]\n"
            "assert not bad, bad\n"
            "print('clean')\n" % (voc_rec, lm))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "clean"


def test_open_store_dispatches_and_stores_satisfy_the_protocol(voc_rec, tmp_path):
    lm = str(tmp_path / "v.lmdb")
    convert(voc_rec, lm)
    rec, lmd = open_store(voc_rec), open_store(lm, "trainval")
    assert type(rec) is RecordFile and type(lmd) is LMDBFile
    for s in (rec, lmd):
        assert isinstance(s, RecordStore)
        assert len(s) == 16 and s.meta["num_records"] == 16
        assert s.location in (voc_rec, lm)
        scanned = [bytes(p) for p in s.scan()]
        assert scanned == [s.read(i) for i in range(len(s))]
        assert [bytes(s.view(i)) for i in range(len(s))] == scanned
        assert list(s.keys()) == [s.key(i) for i in range(len(s))]
    assert rec.split is None and lmd.split == "trainval"
    assert [rec.read(i) for i in range(16)] == [lmd.read(i) for i in range(16)]
    assert rec.offset(1) > rec.offset(0) and lmd.offset(0) is None
    # pickled stores read the same bytes and carry no descriptor
    for s in (rec, lmd):
        clone = pickle.loads(pickle.dumps(s))
        assert clone.read(5) == s.read(5) and clone.identity() == s.identity()


def test_open_store_errors_are_typed(voc_rec, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.rec"):
        open_store(str(tmp_path / "nope.rec"))
    with pytest.raises(FormatError, match="not an LMDB"):
        open_store(str(tmp_path))
    lm = str(tmp_path / "v.lmdb")
    convert(voc_rec, lm)
    with pytest.raises(FormatError, match="split 'val' not found; available splits: trainval"):
        open_store(lm, "val")
    with pytest.raises(ValueError, match="holds split 'trainval', not 'val'"):
        open_store(voc_rec, "val")
    with pytest.raises(ValueError, match="unknown LMDB layout"):
        open_store(lm, layout="nope")
    with pytest.raises(TypeError, match="no options"):
        open_store(voc_rec, storage_options={})


def test_metadata_carries_a_deterministic_conversion_id(voc_root, tmp_path):
    a = convert(voc_root, str(tmp_path / "a.rec"), "voc", split="train").outputs["train"]
    b = convert(voc_root, str(tmp_path / "b.rec"), "voc", split="train").outputs["train"]
    c = convert(voc_root, str(tmp_path / "c.rec"), "voc", split="train",
                encoding="png").outputs["train"]
    ids = [open_store(p).meta["conversion_id"] for p in (a, b, c)]
    assert len(ids[0]) == 32 and ids[0] == ids[1] != ids[2]
    assert open_store(a).identity().startswith(ids[0] + "/")


def _reconvert(path, seed):
    """A newer conversion published at ``path`` (other images: other records)."""
    root = make_voc(os.path.join(os.path.dirname(path), "voc%d" % seed, "VOC2012"),
                    num_images=16, size_range=(20, 48), seed=seed)
    out = convert(root, path, "voc", split="train", overwrite=True).outputs["train"]
    assert out == path


@pytest.fixture(params=["rec", "lmdb"])
def replaceable(request, tmp_path):
    if request.param == "rec":
        path = str(tmp_path / "d.rec")
        _reconvert(path, 1)
        return path, lambda: SegmentationRecordDataset(path)
    path = str(tmp_path / "d.lmdb")
    _reconvert(path, 1)
    return path, lambda: SegmentationLMDBDataset(path, split="train")


@pytest.mark.reliability
@pytest.mark.parametrize("same_inputs", [False, True])
def test_pickled_dataset_of_a_replaced_file_raises(replaceable, same_inputs):
    """Expected: a dataset unpickled after its file was re-converted raises FormatError naming
    the file on its first read, instead of reading the new file through the old index
    (even when the new conversion had the same inputs: the file is not the one opened)."""
    path, make = replaceable
    ds = make()
    first = ds[3][0].asnumpy()
    blob = pickle.dumps(ds)
    _reconvert(path, 1 if same_inputs else 2)
    np.testing.assert_array_equal(ds[3][0].asnumpy(), first)  # the open one keeps its file
    clone = pickle.loads(blob)
    with pytest.raises(FormatError, match="replaced") as e:
        clone[3]
    assert e.value.path == path
    assert make()[3][0].shape[2] == 3  # opening it again reads the new file


@pytest.mark.reliability
def test_dataloader_workers_of_a_replaced_file_raise(replaceable):
    """Expected: forked DataLoader workers open the file anew, notice it was replaced and the
    typed error reaches the training loop. (Our loader: Gluon's raises the same error but
    then calls Pool.terminate(), which deadlocked here twice under load.)"""
    from gluon_data import DataLoader
    path, make = replaceable
    ds = make()
    _reconvert(path, 2)
    loader = DataLoader(ds, batch_size=4, num_workers=2, batchify_fn=len)
    with pytest.raises(FormatError, match="replaced"):
        for _ in loader:
            pass


def test_legacy_layouts_are_stores(tmp_path, folder_root):
    from test_legacy import make_caffe_lmdb, make_recipe_lmdb
    src = str(tmp_path / "recipe")
    pairs = make_recipe_lmdb(src)
    s = open_store(src, "train", layout="raw-lmdb", image_shape=(24, 32, 3), ignore_label=255)
    assert isinstance(s, RecordStore) and len(s) == 12 and s.meta["task"] == "segmentation"
    r = codec.unpack(s.read(2))
    np.testing.assert_array_equal(codec.decode_image(r.image), pairs[2][0])
    np.testing.assert_array_equal(codec.decode_mask(r.mask), pairs[2][1])
    assert len(list(s.scan())) == 12
    csrc = str(tmp_path / "caffe")
    want = make_caffe_lmdb(csrc, folder_root)
    c = open_store(csrc, layout="caffe-lmdb")
    assert isinstance(c, RecordStore) and len(c) == len(want)
    assert [codec.unpack(p).label for p in c.scan()] == [float(w[1]) for w in want]
    with pytest.raises(FormatError, match="legacy layouts"):
        open_store(csrc)


def test_lmdb_split_is_keyword_only_with_a_warning_for_the_old_call(voc_rec, tmp_path):
    lm = str(tmp_path / "v.lmdb")
    convert(voc_rec, lm)
    with pytest.warns(DeprecationWarning, match="split is keyword-only"):
        old = SegmentationLMDBDataset(lm, "trainval")
    assert len(old) == len(SegmentationLMDBDataset(lm, split="trainval")) == 16
    with pytest.raises(TypeError):
        SegmentationRecordDataset(voc_rec, split="train")
    with pytest.warns(DeprecationWarning):
        with pytest.raises(FormatError, match="SegmentationLMDBDataset"):
            ImageLMDBDataset(lm, "trainval")
