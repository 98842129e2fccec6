"""Conversion's mask part: run-length masks by default (counted from their runs, read back by
the reader's decoder), PNG and zraw on request, every check kept; a converted dataset with
run-length masks reads, crops by rows and passes ``verify --deep``; PNG datasets still do.
Framework-free (the core lane runs it)."""
import os

import numpy as np
import pytest
from PIL import Image

from gluon_data.arrays import SegmentationDataset
from gluon_data.convert import convert
from gluon_data.convert.encode import EncodeOptions, encode_item, encode_legacy, mask_part
from gluon_data.convert.sample import make_voc, synthetic_pair
from gluon_data.convert.sources import Item
from gluon_data.errors import SourceError
from gluon_data.format import codec, masks
from gluon_data.stores.recordio import RecordFile
from gluon_data.tools.verify import verify


def _pair(tmp_path, mask, name="a", size=None):
    h, w = mask.shape if size is None else size
    img = np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)
    ip, mp = str(tmp_path / (name + ".png")), str(tmp_path / (name + "_m.png"))
    Image.fromarray(img).save(ip)
    Image.fromarray(mask).save(mp)
    return Item(name=name, image=ip, mask=mp)


def _mask(h=40, w=52, top=20):
    return synthetic_pair(np.random.default_rng(3), h, w, num_classes=top + 1)[1]


def test_default_is_run_length_counted_from_its_runs(tmp_path):
    m = _mask()
    payload, info = encode_item(_pair(tmp_path, m), 0, EncodeOptions(task="segmentation"))
    rec = codec.unpack(payload)
    assert rec.mask[:4] == masks.RLE_MAGIC
    np.testing.assert_array_equal(codec.decode_mask(rec.mask), m)
    ids, counts = np.unique(m, return_counts=True)
    assert info["class_pixels"] == {int(i): int(c) for i, c in zip(ids, counts)}


@pytest.mark.parametrize("kind,magic", [("png", b"\x89PNG"), ("zraw", codec.RAWZ_MAGIC),
                                        ("rle", masks.RLE_MAGIC)])
def test_each_encoding_stores_the_same_ids_and_counts(tmp_path, kind, magic):
    m = _mask()
    opts = EncodeOptions(task="segmentation", mask_encoding=kind)
    payload, info = encode_item(_pair(tmp_path, m), 0, opts)
    rec = codec.unpack(payload)
    assert rec.mask[:4] == magic
    np.testing.assert_array_equal(codec.decode_mask(rec.mask), m)
    ref = {}
    mask_part(m, EncodeOptions(task="segmentation", mask_encoding="png"), "x", ref)
    assert info["class_pixels"] == ref["class_pixels"]


def test_sixteen_bit_ids_are_stored_in_uint16(tmp_path):
    m = _mask().astype(np.uint16) * 40
    payload, info = encode_item(_pair(tmp_path, m), 0, EncodeOptions(task="segmentation"))
    out = codec.decode_mask(codec.unpack(payload).mask)
    assert out.dtype == np.uint16 and out.max() > 255
    np.testing.assert_array_equal(out, m)
    assert sum(info["class_pixels"].values()) == m.size


def test_ids_outside_the_classes_are_still_refused(tmp_path):
    m = _mask()
    m[:5, :5], m[-3:, -3:] = 25, 255
    with pytest.raises(SourceError, match=r"class ids \[25\] outside the 10 declared"):
        encode_item(_pair(tmp_path, m), 0, EncodeOptions(task="segmentation", num_classes=10))
    opts = EncodeOptions(task="segmentation", num_classes=26, ignore_label=255)
    assert encode_item(_pair(tmp_path, m), 0, opts)[1]["class_pixels"][255] >= 9


def test_shape_mismatch_is_still_refused(tmp_path):
    item = _pair(tmp_path, _mask(), size=(41, 52))
    with pytest.raises(SourceError, match="mask is 52x40 but its image"):
        encode_item(item, 0, EncodeOptions(task="segmentation"))


def test_unknown_mask_encoding_is_refused():
    with pytest.raises(ValueError, match="mask_encoding 'bmp'"):
        mask_part(_mask(), EncodeOptions(task="segmentation", mask_encoding="bmp"), "x", {})


def test_legacy_masks_are_run_length_too():
    img, m = synthetic_pair(np.random.default_rng(1), 20, 30)
    payload, info = encode_legacy("lmdb key 0", img, m, 0, EncodeOptions(task="segmentation"),
                                  "png")
    rec = codec.unpack(payload)
    assert rec.mask[:4] == masks.RLE_MAGIC
    np.testing.assert_array_equal(codec.decode_mask(rec.mask), m)


@pytest.mark.parametrize("kind", ["rle", "png"])
def test_datasets_read_and_verify_deep_both_kinds(tmp_path, kind):
    root = make_voc(str(tmp_path / "voc"), num_images=6, size_range=(40, 80))
    out = str(tmp_path / "voc.rec")
    convert(root, out, "voc", split="train", **({} if kind == "rle" else {"mask_encoding": kind}))
    f = RecordFile(out)
    first = codec.unpack(f.read(0), segmentation=True).mask
    assert first[:4] == (masks.RLE_MAGIC if kind == "rle" else b"\x89PNG")
    assert f.meta["mask_encoding"] == kind
    src = np.asarray(Image.open(os.path.join(root, "SegmentationClass",
                                             f.meta["item_names"][0][:-4] + ".png")))
    whole = codec.decode_mask(first)
    np.testing.assert_array_equal(whole, src)
    np.testing.assert_array_equal(codec.decode_mask(first, rows=(5, 30)), src[5:30])
    assert codec.mask_size(first) == src.shape
    ds = SegmentationDataset(out, mode="train", base_size=64, crop_size=48, seed=1)
    img, lab = ds[0]
    assert img.shape[:2] == lab.shape == (48, 48)
    report = verify(out, deep=True)
    assert report.ok, report
