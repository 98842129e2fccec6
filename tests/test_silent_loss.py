"""No silent loss or wrong result: every mask mode keeps its ids or is refused, no listed item
is dropped, what converts reads back, and verify catches whatever the readers refuse."""
import io
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
from PIL import Image

from gluon_data import ImageRecordDataset, RecordFile, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.tools import verify
from gluon_data.errors import ConversionError, CorruptRecordError, FormatError, GluonDataError
from gluon_data.stores.recordio import BINARY_INDEX_SUFFIX, read_index, write_binary_index

pytestmark = pytest.mark.reliability

IDS = np.array([[0, 1, 1, 0, 2], [2, 2, 0, 1, 1], [0, 0, 1, 2, 2], [1, 0, 0, 0, 1]], np.uint8)


def rgb(h=4, w=5, seed=0):
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def stored_masks(rec):
    f = RecordFile(rec)
    return [codec.decode_mask(codec.unpack(f.read(i), segmentation=True).mask)
            for i in range(len(f))]


def pairs_root(tmp_path, mask_writer, ext=".png"):
    root = tmp_path / "src"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    Image.fromarray(rgb()).save(str(root / "images" / "a.png"))
    mask_writer(str(root / "masks" / ("a" + ext)))
    return str(root)


def _save(arr, mode=None, fmt=None):
    def w(path):
        Image.fromarray(arr, mode=mode).save(path, format=fmt)
    return w


def _palette(path):
    im = Image.fromarray(IDS, mode="P")
    im.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (253 * 3))
    im.save(path)


def _cv2_save(arr):
    return lambda path: cv2.imwrite(path, arr)


KEPT = {  # how the mask is written -> the ids it must convert to
    "1 (PNG from a bool array)": (_save(IDS == 1), ".png", (IDS == 1).astype(np.uint8)),
    "1 (TIFF)": (_save(IDS == 1), ".tif", (IDS == 1).astype(np.uint8)),
    "L": (_save(IDS), ".png", IDS),
    "P": (_palette, ".png", IDS),
    "I;16": (_save(IDS.astype(np.uint16) * 150), ".png", IDS.astype(np.uint16) * 150),
    "I (TIFF)": (_save(IDS.astype(np.int32) * 150), ".tif", IDS.astype(np.uint16) * 150),
    "LA": (_save(np.dstack([IDS, np.full_like(IDS, 255)])), ".png", IDS),
    "RGB grey": (_save(np.dstack([IDS] * 3)), ".png", IDS),
    "RGBA grey": (_save(np.dstack([IDS] * 3 + [np.full_like(IDS, 255)])), ".png", IDS),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_every_mask_mode_keeps_its_ids_exactly(tmp_path, case):
    writer, ext, expect = KEPT[case]
    root = pairs_root(tmp_path, writer, ext)
    out = str(tmp_path / "m.rec")
    convert(root, out, "pairs")
    (mask,) = stored_masks(out)
    assert mask.dtype == expect.dtype and np.array_equal(mask, expect)
    assert verify(out, deep=True).ok


REFUSED = {
    "RGB colour": (_save(np.dstack([IDS, IDS * 2, IDS])), ".png", "colour"),
    "RGB 16-bit": (_cv2_save(np.dstack([IDS.astype(np.uint16) * 300] * 3)), ".png", "16-bit"),
    "F (float TIFF)": (_save(IDS.astype(np.float32)), ".tif", "unsupported mask mode F"),
    "CMYK (TIFF)": (lambda p: Image.fromarray(np.dstack([IDS] * 3)).convert("CMYK").save(p),
                    ".tif", "unsupported mask mode CMYK"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_mask_modes_that_cannot_keep_ids_are_refused(tmp_path, case):
    writer, ext, reason = REFUSED[case]
    root = pairs_root(tmp_path, writer, ext)
    out = str(tmp_path / "m.rec")
    with pytest.raises(ConversionError, match=reason) as e:
        convert(root, out, "pairs")
    assert e.value.path.endswith("a" + ext)
    assert not os.path.exists(out)


# ------------------------------------------------------------------- nothing dropped
def test_pairs_with_two_images_sharing_a_stem_fail_naming_both(tmp_path):
    root = tmp_path / "src"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for stem, seed in (("a", 0), ("b", 1)):
        Image.fromarray(rgb(seed=seed)).save(str(root / "images" / (stem + ".png")))
        Image.fromarray(IDS).save(str(root / "masks" / (stem + ".png")))
    Image.fromarray(rgb(seed=2)).save(str(root / "images" / "a.jpg"))
    out = str(tmp_path / "p.rec")
    r = subprocess.run([sys.executable, "-m", "gluon_data", "convert", str(root), out,
                        "--layout", "pairs", "--workers", "1", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "a.jpg" in r.stderr and "a.png" in r.stderr and "stem" in r.stderr
    report = convert(str(root), out, "pairs", on_error="skip")
    assert [os.path.basename(s["file"]) for s in report.skipped] == ["a.png"]
    assert "a.jpg" in report.skipped[0]["reason"]
    ds = SegmentationRecordDataset(out)
    assert len(ds) == report.total_written == 2 and verify(out, deep=True).ok


def test_imagefolder_keeps_every_file_even_when_stems_repeat(tmp_path):
    root = tmp_path / "folder"
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        Image.fromarray(rgb(seed=1)).save(str(root / cls / "x.png"))
        Image.fromarray(rgb(seed=2)).save(str(root / cls / "x.jpg"))
    out = str(tmp_path / "f.rec")
    report = convert(str(root), out, "imagefolder")
    ds = ImageRecordDataset(out)
    assert len(ds) == report.total_written == 4 and not report.skipped
    assert sorted(float(ds[i][1]) for i in range(4)) == [0.0, 0.0, 1.0, 1.0]


def _lst(tmp_path):
    root = tmp_path / "lst"
    root.mkdir()
    for i in range(3):
        Image.fromarray(rgb(seed=i)).save(str(root / ("%d.png" % i)))
    lst = root / "l.lst"
    lst.write_text("0\t0\t0.png\n1\t1\t1.png\n1\t2\t2.png\n")
    return str(lst)


def test_duplicate_lst_indices_fail_or_are_reported_never_unreadable(tmp_path):
    lst = _lst(tmp_path)
    out = str(tmp_path / "l.rec")
    r = subprocess.run([sys.executable, "-m", "gluon_data", "convert", lst, out,
                        "--layout", "lst", "--workers", "1", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "1.png" in r.stderr and "2.png" in r.stderr, r.stderr
    assert not os.path.exists(out)
    report = convert(lst, out, "lst", on_error="skip")
    assert len(report.skipped) == 1 and "2.png" in report.skipped[0]["reason"]
    ds = ImageRecordDataset(out)
    assert len(ds) == report.total_written == 2
    assert [float(ds[i][1]) for i in range(2)] == [0.0, 1.0]
    assert verify(out, deep=True).ok


# ------------------------------------------------------------ what converts must read
def test_png_with_bytes_after_iend_converts_to_something_that_reads(tmp_path):
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    buf = io.BytesIO()
    Image.fromarray(rgb(8, 9)).save(buf, format="PNG")
    (root / "junk.png").write_bytes(buf.getvalue() + b"\x00trailing junk" * 8)
    out = str(tmp_path / "j.rec")
    convert(str(root.parent), out, "imagefolder")
    img, _ = ImageRecordDataset(out)[0]
    assert np.array_equal(img.asnumpy(), rgb(8, 9))  # the pixels, losslessly
    assert verify(out, deep=True).ok


def test_verify_deep_catches_what_the_reader_refuses(tmp_path, voc_rec):
    """A record holding a PNG the reader refuses (bytes after IEND), written directly."""
    from gluon_data import RecordWriter
    from gluon_data.format.meta import read_meta
    buf = io.BytesIO()
    Image.fromarray(rgb()).save(buf, format="PNG")
    bad = buf.getvalue() + b"x" * 40
    out = str(tmp_path / "r.rec")
    meta = dict(read_meta(voc_rec), task="classification", num_records=1)
    with RecordWriter(out) as w:
        w.write(0, codec.pack_classification(0.0, bad, id=0))
        w.finish(meta)
        w.publish()
    with pytest.raises(GluonDataError):
        ImageRecordDataset(out)[0]
    rep = verify(out, deep=True)
    assert not rep.ok and "IEND" in rep.problems[0]["reason"]


# ------------------------------------------------------------------ index damage
def _copy(src, dst):
    for ext in (".rec", ".idx", ".meta.json", ".idx.gdx"):
        if os.path.exists(src[:-4] + ext):
            with open(src[:-4] + ext, "rb") as f, open(dst[:-4] + ext, "wb") as g:
                g.write(f.read())
    return dst


def _rewrite_idx(rec, fn):
    idx = rec[:-4] + ".idx"
    keys, offs = read_index(idx, binary=False)
    keys, offs = fn(keys.copy(), offs.copy())
    with open(idx, "w") as f:
        f.write("".join("%d\t%d\n" % kv for kv in zip(keys, offs)))


def test_swapped_index_offsets_are_caught_by_reader_and_verify(voc_rec, tmp_path):
    rec = _copy(voc_rec, str(tmp_path / "s.rec"))

    def swap(k, o):
        o[[2, 5]] = o[[5, 2]]
        return k, o
    _rewrite_idx(rec, swap)
    with pytest.raises(FormatError, match="reordered"):
        SegmentationRecordDataset(rec)
    for deep in (False, True):
        rep = verify(rec, deep=deep)
        assert {2, 5} <= {p["key"] for p in rep.problems}, rep
        assert any("id 5, not its key 2" in p["reason"] for p in rep.problems), rep


def test_swapped_index_keys_are_caught_by_reader_and_verify(voc_rec, tmp_path):
    rec = _copy(voc_rec, str(tmp_path / "k.rec"))

    def swap(k, o):
        k[[1, 3]] = k[[3, 1]]
        return k, o
    _rewrite_idx(rec, swap)
    ds = SegmentationRecordDataset(rec)
    with pytest.raises(CorruptRecordError, match="id 1, not its key 3"):
        ds[1]
    ds[0]  # untouched records still read
    rep = verify(rec, deep=True)
    # (and the .idx.gdx, which still describes the index before the rewrite)
    assert sorted(p["key"] for p in rep.problems if not p["where"].endswith(".gdx")) == [1, 3]


def test_duplicated_index_offsets_are_refused(voc_rec, tmp_path):
    rec = _copy(voc_rec, str(tmp_path / "d.rec"))

    def dup(k, o):
        o[3] = o[1]
        return k, o
    _rewrite_idx(rec, dup)
    with pytest.raises(FormatError, match="listed twice"):
        SegmentationRecordDataset(rec)
    rep = verify(rec, deep=True)
    assert not rep.ok and "listed twice" in rep.problems[0]["reason"]


def test_damaged_binary_index_body_is_not_trusted(voc_rec, tmp_path):
    rec = _copy(voc_rec, str(tmp_path / "g.rec"))
    gdx = rec[:-4] + ".idx" + BINARY_INDEX_SUFFIX
    data = bytearray(open(gdx, "rb").read())
    assert data[:8] == b"GDIDX\x00\x03\x00"  # version 3: header and body checksummed
    good = bytes(data)
    # the header's facts (flags: keys 0..n-1, file order, clean) are trusted only intact
    for pos in (40, 48):  # the flags, the largest offset
        data[pos] ^= 0x0A
        open(gdx, "wb").write(bytes(data))
        assert read_index(rec[:-4] + ".idx")[1].flags.writeable  # parsed, not mapped
        data[:] = good
    data[-5] ^= 0x10  # an offset's high bits: a wrong but plausible position
    open(gdx, "wb").write(bytes(data))
    text = read_index(rec[:-4] + ".idx", binary=False)
    got = read_index(rec[:-4] + ".idx")
    assert all(np.array_equal(a, b) for a, b in zip(got, text))
    ds = SegmentationRecordDataset(rec)
    ref = SegmentationRecordDataset(voc_rec)
    for i in range(len(ds)):
        assert np.array_equal(ds[i][1].asnumpy(), ref[i][1].asnumpy())
    # readers ignore it, so verify reports it (it used to say OK) with its rebuild
    rep = verify(rec, deep=True)
    assert [p["where"] for p in rep.problems] == [gdx], rep
    assert "write_binary_index" in rep.problems[0]["reason"]
    write_binary_index(rec[:-4] + ".idx")  # rewritten, it is used again
    assert open(gdx, "rb").read() != bytes(data)
    assert verify(rec, deep=True).ok


@pytest.mark.parametrize("fmt", ["rec", "lmdb"])
def test_skipped_items_leave_header_ids_equal_to_keys(tmp_path, fmt):
    """Items skipped in the middle: every later record's header id is still its key, so the
    readers' id check holds, and copies between containers keep reading."""
    from gluon_data import ImageLMDBDataset
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    for i in range(5):
        Image.fromarray(rgb(seed=i)).save(str(root / ("%d.png" % i)))
    (root / "1.png").write_bytes(b"not an image")
    out = str(tmp_path / ("o." + fmt))
    report = convert(str(root.parent), out, "imagefolder", on_error="skip")
    assert len(report.skipped) == 1
    ds = ImageRecordDataset(out) if fmt == "rec" else ImageLMDBDataset(out)
    imgs = [ds[i][0].asnumpy() for i in range(len(ds))]
    assert [next(j for j in range(5) if np.array_equal(im, rgb(seed=j))) for im in imgs] \
        == [0, 2, 3, 4]
    assert verify(out, deep=True).ok
    back = str(tmp_path / ("back." + ("lmdb" if fmt == "rec" else "rec")))
    convert(out, back)
    assert verify(back, deep=True).ok
