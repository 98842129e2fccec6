"""Converters: round trips, options, determinism and every kind of bad input."""
import io
import json
import os
import shutil

import cv2
import numpy as np
import pytest
from PIL import Image

from gluon_data import ImageRecordDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.errors import ConversionError
from gluon_data.stores.recordio import RecordFile
from gluon_data.convert.sample import synthetic_pair

from conftest import run_im2rec


def files_of(tmp):
    return sorted(os.listdir(tmp))


def make_pairs(root, n=6, mode="P", maxid=20, size=(24, 32), ext=".png"):
    os.makedirs(os.path.join(root, "images"))
    os.makedirs(os.path.join(root, "masks"))
    rng = np.random.default_rng(5)
    for i in range(n):
        img, mask = synthetic_pair(rng, *size, num_classes=maxid + 1)
        Image.fromarray(img).save(os.path.join(root, "images", "s%02d%s" % (i, ext)))
        if mode == "I;16":
            m = mask.astype(np.uint16) * 50  # ids up to 1000
            m[mask == 255] = 255
            Image.fromarray(m).save(os.path.join(root, "masks", "s%02d.png" % i))
        else:
            Image.fromarray(mask, mode="L").save(os.path.join(root, "masks", "s%02d.png" % i))
    return root


# ---------------------------------------------------------------- round trips
def test_pairs_layout_round_trip_lossless(tmp_path):
    src = make_pairs(str(tmp_path / "src"))
    out = str(tmp_path / "p.rec")
    rep = convert(src, out, "pairs", num_classes=21)
    ds = SegmentationRecordDataset(out, ignore_value=None)
    assert rep.written == {"train": 6} and len(ds) == 6 and ds.num_class == 21
    for i in range(6):
        img, mask = ds[i]
        name = "s%02d.png" % i
        np.testing.assert_array_equal(img.asnumpy(),
                                      np.asarray(Image.open(os.path.join(src, "images", name))))
        np.testing.assert_array_equal(mask.asnumpy(),
                                      np.asarray(Image.open(os.path.join(src, "masks", name))))


def test_sixteen_bit_masks_keep_ids_above_255(tmp_path):
    src = make_pairs(str(tmp_path / "src"), mode="I;16")
    out = str(tmp_path / "p16.rec")
    # 255 is a class id of 1001 classes: as the ignore label its pixels would read as
    # unlabelled, so it is refused, before anything is written
    with pytest.raises(ValueError, match=r"--ignore-label 255 \(the default\) is a class id "
                       r"of the 1001 classes \(0\.\.1000\)"):
        convert(src, out, "pairs", num_classes=1001, ignore_label=255)
    assert not os.path.exists(out)
    convert(src, out, "pairs", num_classes=1001, ignore_label=65535)
    ds = SegmentationRecordDataset(out, ignore_value=None)
    got = np.concatenate([ds[i][1].asnumpy().ravel() for i in range(len(ds))])
    assert got.max() > 255
    for i in range(len(ds)):
        want = np.asarray(Image.open(os.path.join(src, "masks", "s%02d.png" % i)))
        np.testing.assert_array_equal(ds[i][1].asnumpy(), want)


def test_palette_masks_are_stored_as_indices_with_palette_in_metadata(voc_rec, voc_root):
    meta = json.load(open(voc_rec[:-4] + ".meta.json"))
    assert meta["palette"][15] == [192, 128, 128] and meta["task"] == "segmentation"
    assert meta["num_records"] == 16 and meta["format_version"] == 1
    assert sum(meta["class_pixels"].values()) == sum(
        np.asarray(Image.open(os.path.join(voc_root, "SegmentationClass", f))).size
        for f in os.listdir(os.path.join(voc_root, "SegmentationClass")))
    mask = codec.unpack(RecordFile(voc_rec).read(0)).mask
    assert codec.decode_mask(mask).ndim == 2  # single-channel indices, not colours


def test_lst_pass_through_matches_stock_im2rec_payloads(tmp_path, folder_root):
    prefix = str(tmp_path / "stock")
    stock = run_im2rec(folder_root, prefix, "--pass-through")
    ours = str(tmp_path / "ours.rec")
    convert(prefix + ".lst", ours, "lst", lst_root=folder_root)
    a, b = RecordFile(stock), RecordFile(ours)
    assert list(a.keys()) == list(b.keys())
    for i in range(len(a)):
        pa, pb = a.read(i), b.read(i)
        assert pa[:16] == pb[:16] and pa[24:] == pb[24:]  # all but id2 (our checksum)


def test_imagefolder_labels_follow_sorted_class_folders(cls_rec, folder_root):
    ds = ImageRecordDataset(cls_rec)
    assert ds.classes == ["cat", "dog", "fish"]
    assert [ds[i][1] for i in range(len(ds))] == [0.0] * 4 + [1.0] * 4 + [2.0] * 4


def test_output_is_deterministic_whatever_the_worker_count(tmp_path, voc_root):
    outs = []
    for workers in (1, 2):
        out = str(tmp_path / ("w%d.rec" % workers))
        convert(voc_root, out, "voc", split="trainval", workers=workers, shuffle=True, seed=3)
        outs.append(out)
    for ext in (".rec", ".idx"):
        assert open(outs[0][:-4] + ext, "rb").read() == open(outs[1][:-4] + ext, "rb").read()
    other = str(tmp_path / "seed4.rec")
    convert(voc_root, other, "voc", split="trainval", shuffle=True, seed=4)
    assert open(other, "rb").read() != open(outs[0], "rb").read()


def test_val_ratio_and_multiple_splits(tmp_path, voc_root):
    rep = convert(voc_root, str(tmp_path / "r.rec"), "voc", split="trainval", val_ratio=0.25,
                  shuffle=True)
    assert rep.written == {"train": 12, "val": 4}
    assert set(files_of(tmp_path)) >= {"r_train.rec", "r_val.rec", "r_val.idx",
                                       "r_train.meta.json"}
    rep = convert(voc_root, str(tmp_path / "v.rec"), "voc", split="train,val")
    assert rep.written == {"train": 12, "val": 4}
    assert SegmentationRecordDataset(str(tmp_path / "v_val.rec")).meta["split"] == "val"


def test_resize_and_reencode(tmp_path, voc_root):
    out = str(tmp_path / "small.rec")
    convert(voc_root, out, "voc", split="train", resize=16, encoding="png")
    ds = SegmentationRecordDataset(out, ignore_value=None)
    for i in range(len(ds)):
        img, mask = ds[i]
        assert min(img.shape[:2]) == 16 and img.shape[:2] == mask.shape
        assert codec.unpack(RecordFile(out).read(i)).image[:4] == b"\x89PNG"
        assert set(np.unique(mask.asnumpy())) <= set(range(21)) | {255}


def test_refuses_to_overwrite_unless_asked(tmp_path, voc_root):
    out = str(tmp_path / "o.rec")
    convert(voc_root, out, "voc")
    before = open(out, "rb").read()
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert(voc_root, out, "voc", split="val")
    assert open(out, "rb").read() == before
    convert(voc_root, out, "voc", split="val", overwrite=True)
    assert len(SegmentationRecordDataset(out)) == 4


# ---------------------------------------------------------------- bad input
@pytest.fixture
def voc_copy(tmp_path, voc_root):
    dst = str(tmp_path / "VOC")
    shutil.copytree(voc_root, dst)
    return dst


def _damage(voc, what):
    jpg = os.path.join(voc, "JPEGImages", "2007_000002.jpg")
    png = os.path.join(voc, "SegmentationClass", "2007_000002.png")
    if what == "missing image":
        os.remove(jpg)
    elif what == "missing mask":
        os.remove(png)
    elif what == "zero-byte image":
        open(jpg, "wb").close()
    elif what == "garbage image":
        open(jpg, "wb").write(b"this is not a jpeg at all" * 10)
    elif what == "truncated image":
        data = open(jpg, "rb").read()
        open(jpg, "wb").write(data[:len(data) // 2])
    elif what == "size mismatch":
        Image.open(png).resize((7, 5)).save(png)
    elif what == "jpeg mask":
        Image.open(png).convert("L").save(png, format="JPEG")
    elif what == "ids outside classes":
        m = np.asarray(Image.open(png)).copy()
        m[0, 0] = 42
        Image.fromarray(m, mode="L").save(png)
    elif what == "colour mask":
        Image.open(png).convert("RGB").save(png)
    return jpg if "image" in what else png


BAD = {"missing image": "not found", "missing mask": "not found",
       "zero-byte image": "empty",
       "garbage image": r"corrupt or not an image \(its first bytes, b'this is ', start no",
       "truncated image": "corrupt or not an image", "size mismatch": "mask is 7x5",
       "jpeg mask": "JPEG", "ids outside classes": r"\[42\]", "colour mask": "colour"}


@pytest.mark.reliability
@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_item_fails_naming_the_file_and_writes_nothing(tmp_path, voc_copy, what):
    bad_file = _damage(voc_copy, what)
    out_dir = tmp_path / "out"
    with pytest.raises(ConversionError, match=BAD[what]) as e:
        convert(voc_copy, str(out_dir / "voc.rec"), "voc", split="trainval", workers=2)
    assert e.value.path == bad_file
    assert files_of(out_dir) == []  # no final names, no partial files left behind


@pytest.mark.reliability
@pytest.mark.parametrize("what", ["truncated image", "ids outside classes"])
def test_on_error_skip_lists_each_skip_in_report_and_metadata(tmp_path, voc_copy, what):
    bad_file = _damage(voc_copy, what)
    out = str(tmp_path / "skip.rec")
    rep = convert(voc_copy, out, "voc", split="trainval", on_error="skip")
    assert rep.written == {"trainval": 15}
    assert [s["file"] for s in rep.skipped] == [bad_file] and bad_file in str(rep)
    ds = SegmentationRecordDataset(out)
    assert len(ds) == 15 and ds.meta["skipped"][0]["file"] == bad_file


@pytest.mark.reliability
def test_nothing_convertible_is_an_error_even_when_skipping(tmp_path):
    src = make_pairs(str(tmp_path / "src"), n=2)
    for f in os.listdir(os.path.join(src, "images")):
        open(os.path.join(src, "images", f), "wb").close()
    with pytest.raises(ConversionError, match="no item could be converted"):
        convert(src, str(tmp_path / "o.rec"), "pairs", on_error="skip")
    assert not os.path.exists(str(tmp_path / "o.rec"))


def test_empty_source_and_unknown_layout_and_split(tmp_path, voc_root):
    empty = tmp_path / "empty"
    (empty / "images").mkdir(parents=True)
    (empty / "masks").mkdir()
    with pytest.raises(ConversionError, match="no items"):
        convert(str(empty), str(tmp_path / "o.rec"), "pairs")
    with pytest.raises(ConversionError, match="valid layouts: ade20k, caffe-lmdb, cityscapes, imagefolder, lst, pairs, "
                                            "raw-lmdb, voc"):
        convert(str(empty), str(tmp_path / "o.rec"), "coco")
    with pytest.raises(ConversionError, match="available: train, trainval, val"):
        convert(voc_root, str(tmp_path / "o.rec"), "voc", split="test")
    with pytest.raises(ConversionError, match="source not found"):
        convert(str(tmp_path / "nope"), str(tmp_path / "o.rec"))


@pytest.mark.reliability
def test_an_output_inside_an_imagefolder_source_is_not_read_as_a_class(tmp_path):
    """A conversion written into a folder of its imagefolder source: the next conversion of
    that source would read that folder as one more (empty) class and shift nothing but add a
    label; it is refused, naming the folder. An empty class folder keeps its label."""
    from gluon_data.convert.sample import make_imagefolder
    src = make_imagefolder(str(tmp_path / "cls"), per_class=2)
    out = os.path.join(src, "packed", "c.rec")
    convert(src, out, "imagefolder")
    with pytest.raises(ConversionError, match=r"packed: .*class folder 'packed' holds a "
                       r"RecordIO .*no image: a conversion's output written inside its source"):
        convert(src, out, "imagefolder", overwrite=True)
    shutil.rmtree(os.path.join(src, "packed"))
    lmdb_out = os.path.join(src, "out.lmdb")  # an LMDB output is a folder of the root itself
    convert(src, lmdb_out, "imagefolder")
    with pytest.raises(ConversionError, match=r"class folder 'out.lmdb' is an LMDB"):
        convert(src, str(tmp_path / "x.rec"), "imagefolder")
    shutil.rmtree(lmdb_out)
    os.mkdir(os.path.join(src, "aaa_empty"))  # kept in git by an empty hidden file
    open(os.path.join(src, "aaa_empty", ".gitkeep"), "w").close()
    ours = str(tmp_path / "o.rec")
    convert(src, ours, "imagefolder")
    meta = json.load(open(ours[:-4] + ".meta.json"))
    assert meta["classes"][0] == "aaa_empty" and len(RecordFile(ours)) == 6
    assert min(codec.unpack(RecordFile(ours).read(i)).label for i in range(6)) == 1.0


@pytest.mark.reliability
def test_a_voc_split_with_every_mask_missing_is_not_packed_as_images_only(tmp_path, voc_root):
    """Only VOC's own ``test`` split packs as images only: a ``train`` whose masks are all
    missing (a misnamed or absent SegmentationClass/) is a missing mask, not a dataset
    without labels that would pass every check until it is read."""
    tree = tmp_path / "VOC2012"
    shutil.copytree(voc_root, tree)
    masks = tree / "SegmentationClass"
    for f in os.listdir(masks):  # e.g. a tree whose masks were saved as .PNG
        os.rename(masks / f, masks / (f[:-4] + ".PNG"))
    with pytest.raises(ConversionError, match=r"SegmentationClass/.*\.png: mask file not found"):
        convert(str(tree), str(tmp_path / "o.rec"), "voc", split="train")
    assert not os.path.exists(str(tmp_path / "o.rec"))


@pytest.mark.reliability
def test_an_id_listed_twice_in_a_voc_split_file_is_refused(tmp_path, voc_root):
    tree = tmp_path / "VOC2012"
    shutil.copytree(voc_root, tree)
    listing = tree / "ImageSets" / "Segmentation" / "train.txt"
    lines = listing.read_text().splitlines()
    listing.write_text("\n".join(lines + [lines[1] + "  "]) + "\n")
    with pytest.raises(ConversionError, match=r"train\.txt: .*split file lists %r twice "
                       r"\(lines 2 and %d\)" % (lines[1], len(lines) + 1)):
        convert(str(tree), str(tmp_path / "o.rec"), "voc", split="train")
    assert not os.path.exists(str(tmp_path / "o.rec"))


@pytest.mark.reliability
def test_mask_without_image_and_lst_paths_leaving_the_root(tmp_path, folder_root):
    src = make_pairs(str(tmp_path / "src"), n=3)
    os.remove(os.path.join(src, "images", "s01.png"))
    with pytest.raises(ConversionError, match="no matching image"):
        convert(src, str(tmp_path / "o.rec"), "pairs")
    lst = tmp_path / "evil.lst"
    lst.write_text("0\t1\tcat/000.jpg\n1\t1\t../../etc/passwd\n2\t0\t/etc/hostname\n")
    with pytest.raises(ConversionError, match="leaves the image root"):
        convert(str(lst), str(tmp_path / "e.rec"), "lst", lst_root=folder_root)
    rep = convert(str(lst), str(tmp_path / "e.rec"), "lst", lst_root=folder_root,
                  on_error="skip")
    assert rep.written == {"train": 1} and len(rep.skipped) == 2


@pytest.mark.reliability
def test_disk_full_leaves_nothing_under_final_name(tmp_path, voc_root, monkeypatch):
    """A write failure (ENOSPC) mid-conversion aborts cleanly."""
    import errno
    from gluon_data.stores import recordio
    real = recordio.RecordWriter.write
    calls = {"n": 0}

    def failing(self, key, payload):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError(errno.ENOSPC, "No space left on device", self._tmp[0])
        return real(self, key, payload)

    monkeypatch.setattr(recordio.RecordWriter, "write", failing)
    out_dir = tmp_path / "out"
    with pytest.raises(ConversionError, match=r"No space left on device \(\d+ bytes free "
                       r"once the partial files were removed\)"):
        convert(voc_root, str(out_dir / "o.rec"), "voc", split="trainval")
    assert files_of(out_dir) == []


@pytest.mark.parametrize("shards", [None, 2])
def test_an_output_suffix_in_another_case_is_refused_not_read_as_rec(tmp_path, voc_root,
                                                                      shards):
    for name in ("x.LMDB", "x.Rec"):
        with pytest.raises(ValueError, match=r"its suffix chooses the container and is read "
                           r"in lower case only: name it %s" % name[1:].lower()):
            convert(voc_root, str(tmp_path / "o" / name), "voc", shards=shards)
    assert not os.path.exists(str(tmp_path / "o"))
    convert(voc_root, str(tmp_path / "o" / "x.LMDB"), "voc", format="lmdb")  # said outright
    assert os.path.isfile(str(tmp_path / "o" / "x.LMDB" / "data.mdb"))


def test_mask_encodings_store_the_same_labels(voc_root, tmp_path):
    from gluon_data import SegmentationRecordDataset
    from gluon_data.format import codec, masks
    from gluon_data.stores.recordio import RecordFile
    outs = {}
    magic = {"rle": masks.RLE_MAGIC, "zraw": codec.RAWZ_MAGIC, "png": b"\x89PNG"}
    for enc in ("rle", "zraw", "png"):
        out = str(tmp_path / ("m_%s.rec" % enc))
        convert(voc_root, out, "voc", split="train", mask_encoding=enc)
        ds = SegmentationRecordDataset(out)
        assert ds.meta["mask_encoding"] == enc
        first = codec.unpack(RecordFile(out).read(0), segmentation=True).mask
        assert first[:4] == magic[enc]
        outs[enc] = [ds[i][1].asnumpy() for i in range(len(ds))]
    for enc in ("zraw", "png"):
        assert all(np.array_equal(a, b) for a, b in zip(outs["rle"], outs[enc]))
    with pytest.raises(ValueError, match="mask_encoding"):
        convert(voc_root, str(tmp_path / "x.rec"), "voc", mask_encoding="bmp")


def test_jpeg_the_reader_cannot_decode_is_re_encoded_and_a_corrupt_one_refused(tmp_path,
                                                                              monkeypatch):
    from gluon_data.errors import DecodeError
    src = make_pairs(str(tmp_path / "src"), n=3, ext=".jpg")
    real = codec.decode_image

    def picky(data, *a, **k):  # as the strict decoder answers a JPEG flavour it lacks
        if data == open(os.path.join(src, "images", "s01.jpg"), "rb").read():
            raise DecodeError("image: corrupt JPEG data (Unsupported JPEG process)")
        return real(data, *a, **k)

    monkeypatch.setattr(codec, "decode_image", picky)
    out = str(tmp_path / "o.rec")
    convert(src, out, "pairs")
    payload = codec.unpack(RecordFile(out).read(1), segmentation=True).image
    assert payload != open(os.path.join(src, "images", "s01.jpg"), "rb").read()  # re-encoded
    monkeypatch.setattr(codec, "decode_image", real)
    assert SegmentationRecordDataset(out)[1][0].shape[:2] == (
        SegmentationRecordDataset(out)[1][1].shape)
    # damaged entropy data that Pillow decodes quietly into a smeared picture
    photo = np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8)
    buf = bytearray(cv2.imencode(".jpg", photo)[1].tobytes())
    buf[len(buf) // 2:len(buf) // 2 + 40] = b"\x55" * 40
    Image.open(io.BytesIO(bytes(buf))).load()
    open(os.path.join(src, "images", "s02.jpg"), "wb").write(bytes(buf))
    Image.fromarray(np.zeros((300, 400), np.uint8)).save(os.path.join(src, "masks", "s02.png"))
    with pytest.raises(ConversionError, match="s02.jpg.*corrupt"):
        convert(src, str(tmp_path / "p.rec"), "pairs")


def test_a_re_encode_decodes_jpegs_with_the_decoder_of_record_and_pillow_where_it_refuses(
        tmp_path, monkeypatch):
    """``encoding='jpg'`` decodes a JPEG source with the readers' decoder (faster than
    Pillow, the same pixels); one that decoder refuses as damaged but Pillow reads is still
    re-encoded, as before, where a pass-through conversion refuses it."""
    from PIL import Image as PILImage
    src = make_pairs(str(tmp_path / "src"), n=3, ext=".jpg")
    photo = np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8)
    buf = bytearray(cv2.imencode(".jpg", photo)[1].tobytes())
    buf[len(buf) // 2:len(buf) // 2 + 40] = b"\x55" * 40  # Pillow decodes it quietly
    open(os.path.join(src, "images", "s02.jpg"), "wb").write(bytes(buf))
    PILImage.fromarray(np.zeros((300, 400), np.uint8)).save(os.path.join(src, "masks",
                                                                         "s02.png"))
    decoded, opened, real_decode, real_open = [], [], codec.decode_image, PILImage.open

    def counted_decode(data, *a, **k):
        decoded.append(bytes(data[:2]))
        return real_decode(data, *a, **k)

    def counted_open(fp, *a, **k):
        opened.append(1)
        return real_open(fp, *a, **k)
    monkeypatch.setattr(codec, "decode_image", counted_decode)
    monkeypatch.setattr(PILImage, "open", counted_open)
    out = str(tmp_path / "o.rec")
    convert(src, out, "pairs", encoding="jpg", quality=90)
    assert decoded.count(b"\xff\xd8") >= 3  # every source JPEG tried by the decoder of record
    assert len(opened) >= 1 + 3  # Pillow: the damaged JPEG, and the three masks
    monkeypatch.undo()
    for i in range(3):
        rec = codec.unpack(RecordFile(out).read(i), segmentation=True)
        img = codec.decode_image(rec.image, 1)
        source = open(os.path.join(src, "images", "s%02d.jpg" % i), "rb").read()
        want = np.asarray(PILImage.open(io.BytesIO(source)).convert("RGB"))
        want = codec.decode_image(cv2.imencode(".jpg", want[:, :, ::-1], [
            cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes(), 1)  # Pillow's pixels, re-encoded
        assert np.array_equal(img, want), i
    with pytest.raises(ConversionError, match="s02.jpg.*corrupt"):
        convert(src, str(tmp_path / "p.rec"), "pairs")


@pytest.mark.parametrize("tree", ["VOCdevkit", "VOC2012", "ade20k", "cityscapes", "pairs"])
def test_imagefolder_refuses_a_segmentation_tree_naming_the_layout_that_fits(tmp_path, tree):
    """Its folders are not classes: packing JPEGImages, SegmentationClass and ImageSets as
    three classes (exit 0) was the bug; refused, saying what the tree looks like."""
    from gluon_data.convert.sample import make_ade20k, make_cityscapes, make_voc
    from gluon_data.convert.sources import open_source
    from gluon_data.errors import SourceError
    if tree in ("VOCdevkit", "VOC2012"):
        voc = make_voc(str(tmp_path / "VOCdevkit" / "VOC2012"), num_images=4,
                       size_range=(16, 20))
        src, fits, seen = (str(tmp_path / "VOCdevkit") if tree == "VOCdevkit" else voc,
                           "voc", "JPEGImages/, SegmentationClass/, ImageSets/")
    elif tree == "ade20k":
        src, fits, seen = make_ade20k(str(tmp_path / "ade"), 2, 1), "ade20k", "images/"
    elif tree == "cityscapes":
        src, fits, seen = make_cityscapes(str(tmp_path / "cs"), 1), "cityscapes", "gtFine/"
    else:
        src, fits, seen = make_pairs(str(tmp_path / "pairs"), n=2), "pairs", "masks/"
    with pytest.raises(SourceError) as e:
        open_source(src, "imagefolder")
    msg = str(e.value)
    assert "does not fit" in msg and seen in msg and "--layout %s" % fits in msg, msg
    out = str(tmp_path / "o.rec")
    with pytest.raises(ConversionError, match="layout 'imagefolder' does not fit") as e:
        convert(src, out, "imagefolder")
    assert "--layout %s" % fits in str(e.value)
    assert not any(f.startswith("o.") for f in os.listdir(tmp_path))  # nothing written
    assert open_source(src).layout == fits  # the layout named is the one detected
