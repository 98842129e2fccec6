"""Nothing outside the source root is read, and no small input takes unbounded memory.

Cases that would exhaust memory or hang on a faulty implementation run in a subprocess with
an address-space limit and a timeout, so a regression fails the test instead of the machine.
"""
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from gluon_data import SegmentationLMDBDataset, SegmentationRecordDataset
from gluon_data.format import codec
from gluon_data import convert
from gluon_data.errors import ConversionError, DecodeError, GluonDataError
from gluon_data.convert.sample import make_ade20k, make_cityscapes, make_voc
from gluon_data.convert.sources import confine, open_source

pytestmark = pytest.mark.reliability


def run_limited(code: str, timeout: float = 120, mem_gb: int = 6, nofile=None, cwd=None):
    """Run ``code`` in a fresh interpreter with an address-space cap (and optionally a
    descriptor limit), so that an unbounded allocation is a MemoryError, not an OOM kill."""
    pre = ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (%d, %d))\n"
           % (mem_gb << 30, mem_gb << 30))
    if nofile:
        pre += "resource.setrlimit(resource.RLIMIT_NOFILE, (%d, %d))\n" % (nofile, nofile)
    return subprocess.run([sys.executable, "-c", pre + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def voc(tmp_path):
    return make_voc(str(tmp_path / "VOC2012"), num_images=4, size_range=(20, 32), seed=3)


def _add_voc_entry(voc, entry):
    with open(os.path.join(voc, "ImageSets", "Segmentation", "train.txt"), "a") as f:
        f.write(entry + "\n")


def _copy_pair(voc, image_dst, mask_dst):
    os.makedirs(os.path.dirname(image_dst), exist_ok=True)
    os.makedirs(os.path.dirname(mask_dst), exist_ok=True)
    shutil.copy(os.path.join(voc, "JPEGImages", "2007_000000.jpg"), image_dst)
    shutil.copy(os.path.join(voc, "SegmentationClass", "2007_000000.png"), mask_dst)


# ------------------------------------------------------------ one confinement rule
def test_voc_split_entries_with_dotdot_or_absolute_paths_are_refused(voc, tmp_path):
    # "../../secret" resolves to tmp_path/secret.{jpg,png}: a real pair outside the root
    _copy_pair(voc, str(tmp_path / "secret.jpg"), str(tmp_path / "secret.png"))
    _add_voc_entry(voc, "../../secret")
    with pytest.raises(ConversionError, match="secret.*leaves the image root"):
        convert(voc, str(tmp_path / "a.rec"), "voc")
    rep = convert(voc, str(tmp_path / "a.rec"), "voc", on_error="skip")
    assert rep.written == {"train": 3}
    assert [s["reason"] for s in rep.skipped] == ["path leaves the image root %s" % voc]

    absdir = tmp_path / "elsewhere"
    _copy_pair(voc, str(absdir / "abs.jpg"), str(absdir / "abs.png"))
    voc2 = make_voc(str(tmp_path / "v2" / "VOC2012"), num_images=3, size_range=(20, 32))
    _add_voc_entry(voc2, str(absdir / "abs"))
    with pytest.raises(ConversionError, match="abs.jpg.*leaves the image root"):
        convert(voc2, str(tmp_path / "b.rec"), "voc")
    assert not os.path.exists(tmp_path / "b.rec")


def test_symlinks_out_of_the_root_are_refused_in_every_layout_unless_opted_in(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    # voc: an image that is a symlink to a file outside the root
    voc = make_voc(str(tmp_path / "voc" / "VOC2012"), num_images=3, size_range=(20, 32))
    img = os.path.join(voc, "JPEGImages", "2007_000001.jpg")
    shutil.move(img, outside / "real.jpg")
    os.symlink(outside / "real.jpg", img)
    # ade20k: a mask that is a symlink out
    ade = make_ade20k(str(tmp_path / "ade"), 2, 1)
    m = os.path.join(ade, "annotations", "training", "ADE_train_00000001.png")
    shutil.move(m, outside / "ade.png")
    os.symlink(outside / "ade.png", m)
    # cityscapes: a whole city folder linked in from elsewhere
    cs = make_cityscapes(str(tmp_path / "cs"), per_city=1)
    city = os.path.join(cs, "leftImg8bit", "train", "bonn")
    shutil.move(city, outside / "bonn")
    os.symlink(outside / "bonn", city)

    cases = [(voc, "voc", 2), (ade, "ade20k", 2), (cs, "cityscapes", 2)]
    for root, layout, n in cases:
        out = str(tmp_path / (layout + ".rec"))
        with pytest.raises(ConversionError, match="symlink leaves the source root"):
            convert(root, out, layout)
        assert not os.path.exists(out)
        rep = convert(root, out, layout, follow_symlinks=True)  # the documented opt-in
        assert rep.written == {"train": n}, layout
    # the rule is one function, and it never lets '..' through, even when following links
    assert confine(voc, os.path.join(voc, "..", "x.jpg"), follow_symlinks=True)
    assert confine(voc, img) and confine(voc, img, follow_symlinks=True) is None


def test_confine_with_a_listings_folder_verdicts_says_what_the_full_rule_says(tmp_path):
    """A listing shares one dict across its files (each folder judged once, then one lstat a
    file): every path gets the answer the rule gives it alone, in any order."""
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "o.jpg").write_bytes(b"x")
    (root / "in" / "a.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "out" / "o.jpg", root / "in" / "link.jpg")  # a file linked out
    os.symlink(root / "in" / "a.jpg", root / "in" / "near.jpg")  # a link that stays inside
    os.symlink(tmp_path / "out", root / "away")  # a folder linked out...
    os.symlink(root, tmp_path / "out" / "_")  # ...holding a name that links back in
    os.symlink("in", root / "alias")  # a folder linked within
    under = tmp_path / "imgs" / "_"  # a root named as a probe name might be
    under.mkdir(parents=True)
    (under / "ok.jpg").write_bytes(b"x")
    (tmp_path / "imgs" / "private.jpg").write_bytes(b"x")
    r = str(root)
    cases = [(r, [os.path.join(r, "in", "a.jpg"), os.path.join(r, "in", "link.jpg"),
                  os.path.join(r, "in", "near.jpg"), os.path.join(r, "away", "o.jpg"),
                  os.path.join(r, "alias", "a.jpg"), os.path.join(r, "in", "missing.jpg"),
                  os.path.join(r, "in", "..", "..", "out", "o.jpg"), os.path.join(r, "..", "x"),
                  os.path.join(r, "in", ".."), os.path.join(r, "in", "."), r,
                  str(tmp_path / "out" / "o.jpg")]),
             (str(under), [str(under / "ok.jpg"), str(under / ".." / "private.jpg"),
                           str(tmp_path / "imgs" / "private.jpg")])]
    for follow in (False, True):
        for r, paths in cases:
            alone = [confine(r, p, follow) for p in paths]
            assert alone.count(None) < len(paths) and None in alone  # both answers tested
            for order in (paths, paths[::-1]):
                dirs: dict = {}
                shared = {p: confine(r, p, follow, dirs) for p in order}
                assert [shared[p] for p in paths] == alone, (follow, r)


def test_cli_follow_symlinks_flag(tmp_path):
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=3, size_range=(20, 32))
    img = os.path.join(voc, "JPEGImages", "2007_000001.jpg")
    shutil.move(img, tmp_path / "real.jpg")
    os.symlink(tmp_path / "real.jpg", img)
    cmd = [sys.executable, "-m", "gluon_data", "convert", voc, str(tmp_path / "o.rec"),
           "--layout", "voc", "--quiet", "--workers", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "symlink leaves the source root" in p.stderr
    assert "--follow-symlinks" in p.stderr
    p = subprocess.run(cmd + ["--follow-symlinks"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr


# ------------------------------------------------------------ special files
def test_a_device_behind_a_symlink_is_never_read(tmp_path):
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=2, size_range=(20, 32))
    img = os.path.join(voc, "JPEGImages", "2007_000000.jpg")  # the train split's one image
    os.remove(img)
    os.symlink("/dev/zero", img)
    code = """
        from gluon_data import convert
        from gluon_data.errors import ConversionError
        for follow in (False, True):
            try:
                convert(%r, %r, "voc", follow_symlinks=follow)
            except ConversionError as e:
                print("ERR", e)
    """ % (voc, str(tmp_path / "o.rec"))
    p = run_limited(code, timeout=120, mem_gb=4)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 2, p.stdout
    assert "symlink leaves the source root" in lines[0]
    assert "2007_000000.jpg" in lines[1] and "character device" in lines[1]


def test_a_fifo_does_not_hang_the_converter(tmp_path):
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=2, size_range=(20, 32))
    mask = os.path.join(voc, "SegmentationClass", "2007_000000.png")
    os.remove(mask)
    os.mkfifo(mask)
    code = """
        from gluon_data import convert
        from gluon_data.errors import ConversionError
        try:
            convert(%r, %r, "voc")
        except ConversionError as e:
            print("ERR", e)
    """ % (voc, str(tmp_path / "o.rec"))
    p = run_limited(code, timeout=60)  # an open() blocking on the FIFO would time out
    assert "ERR" in p.stdout and "FIFO" in p.stdout and "2007_000000.png" in p.stdout, \
        p.stdout + p.stderr[-2000:]


def test_source_files_over_the_size_cap_are_refused(voc, tmp_path):
    size = os.path.getsize(os.path.join(voc, "JPEGImages", "2007_000000.jpg"))
    with pytest.raises(ConversionError, match="exceeds max_file_bytes=%d" % (size - 1)):
        convert(voc, str(tmp_path / "o.rec"), "voc", max_file_bytes=size - 1)
    assert convert(voc, str(tmp_path / "o.rec"), "voc", max_file_bytes=1 << 20).written


# ------------------------------------------------------------ pixel caps
def _jpeg_claiming(h, w, comment_bytes=2 * 65000):
    """A real small JPEG whose frame header claims h x w, behind big COM segments."""
    ok, buf = cv2.imencode(".jpg", np.full((8, 8, 3), 128, np.uint8))
    data = bytearray(buf.tobytes())
    i = 2
    while True:  # patch the SOF0 dimensions
        marker, seglen = data[i + 1], struct.unpack(">H", data[i + 2:i + 4])[0]
        if marker == 0xC0:
            data[i + 5:i + 9] = struct.pack(">HH", h, w)
            break
        i += 2 + seglen
    com = b""
    while comment_bytes > 0:
        n = min(comment_bytes, 65000)
        com += b"\xff\xfe" + struct.pack(">H", n + 2) + b"x" * n
        comment_bytes -= n
    return bytes(data[:2]) + com + bytes(data[2:])


def test_jpeg_dimensions_behind_a_large_comment_are_capped(tmp_path):
    data = _jpeg_claiming(3000, 3000)
    assert len(data) > 64 * 1024
    assert codec.image_size(data) == (3000, 3000)
    with pytest.raises(DecodeError, match="3000x3000 pixels exceed the limit"):
        codec.decode_image(data, max_pixels=1_000_000)
    voc = make_voc(str(tmp_path / "VOC2012"), num_images=2, size_range=(20, 32))
    with open(os.path.join(voc, "JPEGImages", "2007_000000.jpg"), "wb") as f:
        f.write(data)
    with pytest.raises(ConversionError, match="2007_000000.jpg.*exceeds max_pixels"):
        convert(voc, str(tmp_path / "o.rec"), "voc", max_pixels=1_000_000)


def test_compressed_raw_arrays_are_capped_on_their_whole_shape():
    head = struct.pack("<4sBB", codec.RAWZ_MAGIC, 1, 3) + struct.pack("<3I", 1, 1, 10 ** 9)
    bomb = head + zlib.compress(b"\0" * (1 << 20))  # would inflate towards 1 GB
    for fn in (codec.decode_image, codec.decode_mask):
        with pytest.raises(DecodeError, match="1 to 4 channels"):
            fn(bomb, max_pixels=1 << 27)
    ok = codec.encode_raw(np.zeros((4, 5, 3), np.uint8), compress=1)
    assert codec.decode_image(ok).shape == (4, 5, 3)


def _strip_pairs(root, h, w):
    """A pairs source with one h x w image (an extreme aspect ratio) and its mask."""
    os.makedirs(os.path.join(root, "images"))
    os.makedirs(os.path.join(root, "masks"))
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
        os.path.join(root, "images", "strip.png"))
    Image.fromarray(np.zeros((h, w), np.uint8)).save(os.path.join(root, "masks", "strip.png"))
    return root


def test_resize_of_an_extreme_aspect_ratio_is_capped_before_allocating(tmp_path):
    src = _strip_pairs(str(tmp_path / "src"), 1, 30000)
    p = subprocess.run([sys.executable, "-c",
                        "import resource, sys\n"
                        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
                        "from gluon_data.cli import main\nsys.exit(main(sys.argv[1:]))",
                        "convert", src, str(tmp_path / "o.rec"), "--layout", "pairs",
                        "--resize", "500", "--quiet", "--workers", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr[-2000:]
    assert "strip.png" in p.stderr and "more than max_pixels" in p.stderr, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-2000:]
    assert os.listdir(tmp_path) == ["src"]


def test_val_mode_of_an_extreme_aspect_ratio_is_capped_before_allocating(tmp_path):
    src = _strip_pairs(str(tmp_path / "src"), 1, 30000)
    out = str(tmp_path / "strip.rec")
    convert(src, out, "pairs")  # 30000 pixels: a legitimate stored image
    lm = str(tmp_path / "strip.lmdb")
    convert(out, lm)
    code = """
        from gluon_data import SegmentationRecordDataset, SegmentationLMDBDataset
        from gluon_data.errors import DecodeError
        for ds in (SegmentationRecordDataset(%r, mode="val", crop_size=480),
                   SegmentationLMDBDataset(%r, "train", mode="val", crop_size=480)):
            try:
                ds[0]
                print("READ")
            except DecodeError as e:
                print("ERR", e)
    """ % (out, lm)
    p = run_limited(code, timeout=120)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) == 2, p.stdout + p.stderr[-2000:]
    for line, name in zip(lines, (out, lm)):
        assert line.startswith("ERR %s" % name) and "record 0" in line, line
        assert "more than max_pixels" in line
    # an ordinary image still reads in val mode
    ds = SegmentationRecordDataset(out, mode="val", crop_size=480, max_pixels=None)
    assert ds.mode == "val"


# ------------------------------------------------------------ LMDB shrinking under a reader
def test_lmdb_truncated_under_an_open_dataset_is_a_typed_error(voc_root, tmp_path):
    lm = str(tmp_path / "v.lmdb")
    convert(voc_root, lm, "voc", split="trainval", encoding="raw")
    data = os.path.join(lm, "data.mdb")
    assert os.path.getsize(data) > 64 * 1024
    code = """
        import os
        from gluon_data import SegmentationLMDBDataset
        from gluon_data.errors import FormatError
        ds = SegmentationLMDBDataset(%r, "trainval")
        ds[0]
        os.truncate(%r, 8192)   # keeps the two meta pages, drops the tree
        for i in range(len(ds)):
            try:
                ds[i]
                print("READ", i)
            except FormatError as e:
                print("ERR", e)
                break
    """ % (lm, data)
    p = run_limited(code, timeout=120)
    assert p.returncode == 0, "killed by signal %d" % -p.returncode if p.returncode < 0 \
        else p.stderr[-2000:]
    assert p.stdout.startswith("ERR") and "data.mdb shrank" in p.stdout, p.stdout


# ------------------------------------------------------------ descriptors and memory
def test_a_thousand_open_rec_datasets_under_a_small_descriptor_limit(voc_rec):
    code = """
        import os
        from gluon_data import SegmentationRecordDataset
        from gluon_data.errors import ResourceError
        statm = os.open("/proc/self/statm", os.O_RDONLY)  # opened before the limit bites
        def rss():
            return int(os.pread(statm, 100, 0).split()[1]) * os.sysconf("SC_PAGE_SIZE")
        ds = [SegmentationRecordDataset(%r) for _ in range(1000)]
        print("OPENED", len(ds))
        base = rss()
        read = 0
        try:
            for d in ds:
                d[0]
                read += 1
        except ResourceError as e:
            print("ERR", e)
        print("READ", read, "GREW_MB", (rss() - base) >> 20)
    """ % voc_rec
    p = run_limited(code, timeout=180, nofile=256)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.splitlines()
    assert out[0] == "OPENED 1000", p.stdout  # opening holds no descriptor
    err = [ln for ln in out if ln.startswith("ERR")]
    assert err and "too many open files" in err[0] and "ulimit -n" in err[0] \
        and voc_rec in err[0], p.stdout
    read, grew = (int(x) for x in out[-1].split()[1::2])
    assert 200 <= read < 256
    assert grew < 64, "%d readers grew RSS by %d MB (a scratch buffer each?)" % (read, grew)


def test_datasets_refuse_special_files_instead_of_blocking(voc_rec, tmp_path):
    code = """
        import os, shutil
        from gluon_data import SegmentationRecordDataset
        from gluon_data.errors import FormatError
        src = %r
        for victim in (".idx", ".meta.json", ".rec"):
            d = os.path.join(%r, victim.strip("."))
            os.makedirs(d)
            dst = os.path.join(d, "v.rec")
            for ext in (".rec", ".idx", ".meta.json"):
                if ext == victim:
                    os.mkfifo(dst[:-4] + ext)
                else:
                    shutil.copy(src[:-4] + ext, dst[:-4] + ext)
            try:
                SegmentationRecordDataset(dst)
                print("OPENED")
            except FormatError as e:
                print("ERR", e)
    """ % (voc_rec, str(tmp_path))
    p = run_limited(code, timeout=60)
    lines = p.stdout.splitlines()
    assert len(lines) == 3 and all("not a regular file (a FIFO)" in ln for ln in lines), \
        p.stdout + p.stderr[-2000:]


def test_other_formats_are_capped_from_their_header_before_decoding():
    ok, buf = cv2.imencode(".bmp", np.zeros((4, 4, 3), np.uint8))
    bmp = bytearray(buf.tobytes())
    bmp[18:26] = struct.pack("<ii", 8000, 8000)  # claims 8000x8000 (192 MB decoded)
    with pytest.raises(DecodeError, match="8000x8000 pixels exceed the limit"):
        codec.decode_image(bytes(bmp), max_pixels=1_000_000)
    assert codec.decode_image(buf.tobytes()).shape == (4, 4, 3)
