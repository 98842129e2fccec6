"""Region decoding: exactly the full decode's crop, as strict as the full decode, and the
two-phase dataset transforms giving the samples a full decode gives (region on or off, 0 or
2 DataLoader workers)."""
import io
import os

import cv2
import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as VT
from PIL import Image

from gluon_data import ImageRecordDataset, SegmentationRecordDataset
from gluon_data.format import codec, decode
from gluon_data import convert
from gluon_data.arrays import transforms as T
from gluon_data.errors import DecodeError
from gluon_data.convert.sample import make_imagefolder, make_voc
from gluon_data.sampling.sampler import DistributedSampler, SampleKey

needs_ext = pytest.mark.skipif(decode._jpegregion is None,
                               reason="the region decoder extension is not built")
_SUB = {"444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
        "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
        "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411}


def photo(h, w, seed=0):
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
    return cv2.GaussianBlur(img, (0, 0), 1.5).reshape(h, w, 3)


def jpeg(h, w, sub="420", seed=0, progressive=False, restart=0):
    """A JPEG written by libjpeg (through OpenCV) with the given chroma subsampling."""
    img, params = photo(h, w, seed), [cv2.IMWRITE_JPEG_QUALITY, 90]
    if progressive:
        params += [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
    if restart:
        params += [cv2.IMWRITE_JPEG_RST_INTERVAL, restart]
    if sub == "grey":
        return cv2.imencode(".jpg", img[:, :, 0].copy(), params)[1].tobytes()
    params += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, _SUB[sub]]
    return cv2.imencode(".jpg", img[:, :, ::-1].copy(), params)[1].tobytes()


def boxes(rng, h, w, n):
    """The whole image, every edge and corner, then random boxes (a third of them one to
    three columns wide)."""
    yield from [(0, 0, h, w), (0, 0, 1, w), (h - 1, 0, h, w), (0, 0, h, 1), (0, w - 1, h, w),
                (0, 0, 1, 1), (0, w - 1, 1, w), (h - 1, 0, h, 1), (h - 1, w - 1, h, w)]
    for k in range(n):
        y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
        x_hi = min(w, x0 + int(rng.integers(1, 4))) if k % 3 == 0 else w
        yield y0, x0, int(rng.integers(y0 + 1, h + 1)), int(rng.integers(x0 + 1, x_hi + 1))


def damaged(buf, at):
    """``buf`` with 119 bytes overwritten ``at`` (0..1) of the way from its first scan to its
    end (a progressive JPEG's later scans refine the same blocks: damage anywhere counts)."""
    sos = buf.find(b"\xff\xda") + 20
    pos = sos + int((len(buf) - 20 - sos - 119) * at)
    return buf[:pos] + bytes(range(1, 120)) + buf[pos + 119:]


def test_extension_is_there_when_the_build_requires_it():
    """CI builds with GLUON_DATA_BUILD_EXT=1 (a failed build fails the install); there the
    region decoder must be importable, not silently replaced by the fallback."""
    if os.environ.get("GLUON_DATA_BUILD_EXT") != "1":
        pytest.skip("GLUON_DATA_BUILD_EXT=1 is not set: the extension is optional here")
    assert decode._jpegregion is not None, decode.region_decoder()
    assert decode.region_decoding() and decode.region_decoder().startswith("region decode")


@needs_ext
@pytest.mark.parametrize("sub", ["444", "422", "420", "440", "411", "grey"])
@pytest.mark.parametrize("kind", ["baseline", "progressive", "restart"])
@pytest.mark.parametrize("hw", [(97, 131), (17, 23), (1, 1), (2, 3), (33, 257)])
def test_region_equals_the_full_decode_crop(hw, kind, sub, monkeypatch):
    monkeypatch.setattr(decode, "REGION_MAX_FRACTION", 1.0)  # every box takes the region path
    h, w = hw
    buf = jpeg(h, w, sub, seed=h * w, progressive=kind == "progressive",
               restart=2 if kind == "restart" else 0)
    rng = np.random.default_rng(h + w)
    for flag in (1, 0):
        full = codec.decode_image(buf, flag)
        for y0, x0, y1, x1 in boxes(rng, h, w, 25 if h > 1 else 0):
            got = decode._region(buf, (y0, x0, y1, x1), flag, None, "image")
            assert got is not None  # the extension decoded it (no fallback)
            assert got.dtype == np.uint8 and got.flags.writeable
            assert np.array_equal(got, full[y0:y1, x0:x1]), ((y0, x0, y1, x1), flag)
            assert np.array_equal(decode.decode_region(buf, (y0, x0, y1, x1), flag),
                                  full[y0:y1, x0:x1])


@needs_ext
@pytest.mark.parametrize("kind", ["baseline", "progressive", "restart"])
@pytest.mark.parametrize("at", [0.02, 0.5, 0.97])
def test_corrupt_data_inside_or_outside_the_box_is_an_error(kind, at):
    """The box is the image's top-left corner; the damage lies in it (at the start of the
    scan) or far below it: both raise, as the full decode does."""
    buf = jpeg(400, 300, "420", seed=3, progressive=kind == "progressive",
               restart=4 if kind == "restart" else 0)
    bad = damaged(buf, at)
    with pytest.raises(DecodeError, match="corrupt JPEG data"):
        codec.decode_image(bad, 1)
    assert decode._region(buf, (0, 0, 20, 20), 1, None, "image") is not None
    with pytest.raises(DecodeError, match="^record 7: corrupt JPEG data"):
        decode.decode_region(bad, (0, 0, 20, 20), 1, what="record 7")


@needs_ext
@pytest.mark.parametrize("kind", ["baseline", "restart"])
def test_proven_bytes_skip_the_rows_below_the_box(kind):
    """``strict=False`` stops after the box's last row: damage below it goes unseen (the
    same pixels as the intact image's box); an intact image gives the strict decode's box."""
    buf = jpeg(400, 300, "420", seed=3, restart=4 if kind == "restart" else 0)
    box = (10, 20, 60, 200)
    want = codec.decode_image(buf, 1)[10:60, 20:200]
    below = damaged(buf, 0.9)
    with pytest.raises(DecodeError):
        decode.decode_region(below, box)  # strict: the whole stream is read
    assert np.array_equal(decode.decode_region(below, box, strict=False), want)
    assert np.array_equal(decode.decode_region(buf, box, strict=False), want)
    for box in boxes(np.random.default_rng(1), 400, 300, 12):
        assert np.array_equal(decode.decode_region(buf, box, strict=False),
                              codec.decode_image(buf, 1)[box[0]:box[2], box[1]:box[3]])


@needs_ext
def test_truncated_and_bad_header_and_bad_box_are_errors():
    buf = jpeg(200, 300, seed=4)
    for cut in (len(buf) * 2 // 3, len(buf) - 2, 400):
        with pytest.raises(DecodeError, match="image"):  # the box alone would not notice
            decode.decode_region(buf[:cut], (0, 0, 10, 10))
    with pytest.raises(DecodeError):
        decode.decode_region(buf[:2] + b"\xff\xc0\x00\x03" + buf[60:], (0, 0, 4, 4))
    with pytest.raises(DecodeError, match="max_pixels"):
        decode.decode_region(buf, (0, 0, 4, 4), max_pixels=1000)
    for box in ((0, 0, 201, 4), (5, 5, 5, 9), (-1, 0, 3, 3)):
        with pytest.raises(ValueError, match="box"):
            decode.decode_region(buf, box)


def test_png_raw_and_cmyk_images_fall_back_to_the_full_decode():
    img = photo(30, 41)
    png = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR))[1].tobytes()
    out = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(out, "JPEG", quality=90)
    cmyk = out.getvalue()
    if decode._jpegregion is not None:  # the extension declines what it cannot do exactly
        assert decode._jpegregion.decode(cmyk, 3, 5, 20, 40, 1) is None
    for buf, want in ((png, img), (codec.encode_raw(img), img),
                      (cmyk, codec.decode_image(cmyk, 1))):
        assert np.array_equal(decode.decode_region(buf, (3, 5, 20, 40)), want[3:20, 5:40])


def test_region_decoding_can_be_turned_off(monkeypatch):
    buf = jpeg(120, 160, seed=5)
    monkeypatch.setenv("GLUON_DATA_REGION_DECODE", "0")
    assert not decode.region_decoding() and decode.region_decoder().startswith("full decode")
    calls = []
    monkeypatch.setattr(decode, "_region", lambda *a: calls.append(a))
    assert np.array_equal(decode.decode_region(buf, (10, 20, 30, 40)),
                          codec.decode_image(buf, 1)[10:30, 20:40])
    assert calls == []
    monkeypatch.delenv("GLUON_DATA_REGION_DECODE")
    assert decode.region_decoding() is (decode._jpegregion is not None)


def _write_stock_rec(path, images):
    """A .rec whose records carry no CRC-32 (as stock tools write them)."""
    w = mx.recordio.MXIndexedRecordIO(path[:-4] + ".idx", path, "w")
    for i, buf in enumerate(images):
        w.write_idx(i, codec.pack_classification(i % 2, buf, id=i, checksum=False))
    w.close()
    return path


def test_corrupt_jpeg_outside_the_crop_is_an_error_in_a_dataset(tmp_path):
    buf = jpeg(120, 160, seed=6)
    path = _write_stock_rec(str(tmp_path / "stock.rec"), [buf, damaged(buf, 0.97)])
    ds = ImageRecordDataset(path, seed=0).transform_first(
        VT.Compose([VT.RandomResizedCrop(32, scale=(0.05, 0.2)), VT.ToTensor()]))
    assert ds.fast_path is not None
    assert ds[0][0].shape == (3, 32, 32)
    with pytest.raises(DecodeError, match="corrupt JPEG"):
        ds[1]


@pytest.fixture(scope="module")
def seg_rec(tmp_path_factory):
    root = make_voc(str(tmp_path_factory.mktemp("rvoc") / "VOC2012"), num_images=8,
                    size_range=(60, 97), seed=5, photo=True)
    out = str(tmp_path_factory.mktemp("rvoc_rec") / "voc.rec")
    convert(root, out, "voc", split="trainval")
    return out


@pytest.fixture(scope="module")
def jpeg_cls_rec(tmp_path_factory):
    root = make_imagefolder(str(tmp_path_factory.mktemp("rfolder") / "data"), per_class=3,
                            size_range=(60, 120), seed=2)
    out = str(tmp_path_factory.mktemp("rcls") / "cls.rec")
    convert(root, out, "imagefolder")
    return out


@pytest.fixture
def region_calls(monkeypatch):
    """The boxes the extension decodes in this process (the real extension still does it)."""
    seen, real = [], decode._jpegregion

    class Spy:
        LIBJPEG_TURBO_VERSION = getattr(real, "LIBJPEG_TURBO_VERSION", 0)

        @staticmethod
        def decode(buf, *box):
            seen.append(box[:4])
            return real.decode(buf, *box)
    if real is not None:
        monkeypatch.setattr(decode, "_jpegregion", Spy)
    return seen


def _seg_train(seg_rec, seed=3):
    return SegmentationRecordDataset(seg_rec, mode="train", base_size=48, crop_size=40, seed=seed)


@needs_ext
def test_segmentation_train_decodes_only_the_crop_and_gives_the_same_samples(seg_rec,
                                                                          region_calls):
    ds = _seg_train(seg_rec)
    for i in range(len(ds)):
        img, mask = ds[SampleKey(i, epoch=1)]
        rec = codec.unpack(ds._file.view(i), segmentation=True)  # today's path: decode all
        with T.sample_context(1, i):
            want_img, want_mask = ds._joint(codec.decode_image(rec.image, 1),
                                            codec.decode_mask(rec.mask))
        assert np.array_equal(img.asnumpy(), want_img)
        assert np.array_equal(mask.asnumpy(), ds._labels(want_mask))
    assert region_calls  # small crops took the region path


@needs_ext
@pytest.mark.parametrize("verify", [True, False])
def test_datasets_stop_after_the_box_only_for_records_they_verified(seg_rec, jpeg_cls_rec,
                                                                    monkeypatch, tmp_path,
                                                                    verify):
    """A converted dataset's records (checksum verified) are decoded up to the box's last
    row; unverified ones, and stock records (no checksum), to the end of the image."""
    seen, real = [], decode._jpegregion

    class Spy:
        LIBJPEG_TURBO_VERSION = getattr(real, "LIBJPEG_TURBO_VERSION", 0)

        @staticmethod
        def decode(buf, y0, x0, y1, x1, flag, strict=True, *rest):
            seen.append(bool(strict))
            return real.decode(buf, y0, x0, y1, x1, flag, strict, *rest)
    monkeypatch.setattr(decode, "_jpegregion", Spy)
    seg = SegmentationRecordDataset(seg_rec, mode="train", base_size=48, crop_size=40,
                                    seed=3, verify=verify)
    cls = ImageRecordDataset(jpeg_cls_rec, seed=9, verify=verify).transform_first(
        VT.Compose([VT.RandomResizedCrop(16), VT.ToTensor()]))
    for ds in (seg, cls):
        for i in range(len(ds)):
            ds[SampleKey(i, epoch=1)]
    assert seen and set(seen) == {not verify}
    seen.clear()
    buf = jpeg(120, 160, seed=6)
    stock = ImageRecordDataset(_write_stock_rec(str(tmp_path / "stock.rec"),
                                                [buf] * 4), seed=0).transform_first(
        VT.Compose([VT.RandomResizedCrop(32, scale=(0.05, 0.2)), VT.ToTensor()]))
    for i in range(len(stock)):
        stock[i]
    assert seen and set(seen) == {True}
    # a dataset whose metadata does not say its images were checked (an earlier writer's)
    import shutil
    from gluon_data.format.meta import dumps_meta, meta_path, read_meta
    old = str(tmp_path / "older.rec")
    shutil.copy(seg_rec, old)
    shutil.copy(seg_rec[:-4] + ".idx", old[:-4] + ".idx")
    meta = read_meta(seg_rec)
    assert meta["images_checked"] == "strict"  # what a conversion writes
    del meta["images_checked"]
    with open(meta_path(old), "wb") as f:
        f.write(dumps_meta(meta))
    seen.clear()
    ds = SegmentationRecordDataset(old, mode="train", base_size=48, crop_size=40, seed=3)
    for i in range(len(ds)):
        ds[SampleKey(i, epoch=1)]
    assert seen and set(seen) == {True}


@needs_ext
def test_classification_crop_decodes_only_its_box_and_gives_the_same_tensor(jpeg_cls_rec,
                                                                           region_calls):
    fn = VT.Compose([VT.RandomResizedCrop(16), VT.RandomFlipLeftRight(), VT.ToTensor(),
                     VT.Normalize([.485, .456, .406], [.229, .224, .225])])
    ds = ImageRecordDataset(jpeg_cls_rec, seed=9).transform_first(fn)
    fast = ds.fast_path
    for i in range(len(ds)):
        got = ds[SampleKey(i, epoch=2)][0].asnumpy()
        rec = codec.unpack(ds._file.view(i))
        with T.sample_context(2, i):
            want = fast(codec.decode_image(rec.image, 1))
        assert np.array_equal(got, want)
    assert region_calls


def _loader_samples(ds, workers):
    sampler = DistributedSampler(len(ds), batch_size=4, seed=1)
    loader = mx.gluon.data.DataLoader(ds, batch_sampler=sampler.batch_sampler(),
                                      num_workers=workers)
    return [tuple(x.asnumpy() for x in batch[:2]) for batch in loader]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_samples_are_the_same_with_region_decoding_on_and_off(seg_rec, jpeg_cls_rec,
                                                              monkeypatch, workers):
    fn = VT.Compose([VT.RandomResizedCrop(24), VT.RandomFlipLeftRight(), VT.ToTensor()])
    runs = []
    for on in ("1", "0"):
        monkeypatch.setenv("GLUON_DATA_REGION_DECODE", on)  # before the workers start
        runs.append([_loader_samples(_seg_train(seg_rec, seed=11), workers),
                     _loader_samples(ImageRecordDataset(jpeg_cls_rec, seed=4)
                                     .transform_first(fn), workers)])
    for kind_on, kind_off in zip(*runs):
        assert len(kind_on) == len(kind_off) > 0
        for a, b in zip(kind_on, kind_off):
            assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_region_bench_rows_and_ratios(seg_rec, jpeg_cls_rec):
    """The benchmark's rows on tiny data: every ratio names rows it produces, times are
    positive, and both datasets' boxes were drawn."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_region.py"
    spec = importlib.util.spec_from_file_location("bench_region", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    boxes = bench.crops(seg_rec, jpeg_cls_rec)
    assert {k: len(v) for k, v in boxes.items()} == {bench.SEG: 8, bench.CLS: 9}
    rows = bench.decode_rows(boxes, 1)
    rows.update(bench.loader_rows(seg_rec, jpeg_cls_rec, 0, 1))
    for name, num, den, _ in bench.RATIOS:
        assert rows[num] > 0 and rows[den] > 0, name


@needs_ext
def test_region_decodes_agree_across_threads():
    """The extension decodes without the GIL: threads decoding at once get exact boxes."""
    import threading
    bufs = [jpeg(150 + k, 200, seed=k) for k in range(6)]
    want = [codec.decode_image(b, 1)[10:120, 30:150] for b in bufs]
    bad = []

    def work():
        for _ in range(10):
            bad.extend(k for k, b in enumerate(bufs)
                       if not np.array_equal(decode.decode_region(b, (10, 30, 120, 150)),
                                             want[k]))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads) and bad == []
