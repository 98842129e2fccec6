"""Scaled decoding (DCT-domain 1/2, 1/4, 1/8, opt-in): off by default and where the shrink is
under 2x (the exact path's pixels), on: the requested size, aligned with the exact path and
close to it, as strict as the exact path on bad bytes."""
import cv2
import numpy as np
import pytest

from gluon_data.errors import DecodeError
from gluon_data.format import decode

needs_ext = pytest.mark.skipif(decode._jpegregion is None,
                               reason="the region decoder extension is not built")


def street(h=512, w=1024, seed=0, sub=cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420):
    """A photographic-looking JPEG: gradients, flat discs with hard edges, sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255.0 / w, y * 255.0 / h, (x + y) % 256.0], -1).astype(np.float32)
    for _ in range(30):
        cv2.circle(img, (int(rng.integers(0, w)), int(rng.integers(0, h))),
                   int(rng.integers(5, h // 4)), rng.integers(0, 255, 3).tolist(), -1)
    img = cv2.GaussianBlur(img + rng.normal(0, 10, img.shape), (0, 0), 1.0)
    img = np.clip(img, 0, 255).astype(np.uint8)
    params = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, sub]
    return cv2.imencode(".jpg", img, params)[1].tobytes()


def exact(buf, box, size, flag=1):
    part = decode.decode_region(buf, box, flag)
    out = cv2.resize(part, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
    return out.reshape(size[0], size[1], -1)


@pytest.fixture
def scaled(monkeypatch):
    monkeypatch.setenv("GLUON_DATA_DECODE_SCALED", "1")
    monkeypatch.delenv("GLUON_DATA_REGION_DECODE", raising=False)


def test_off_by_default_shrink_to_changes_nothing(monkeypatch):
    monkeypatch.delenv("GLUON_DATA_DECODE_SCALED", raising=False)
    buf = street()
    assert not decode.scaled_decoding()
    box = (10, 20, 500, 1000)
    np.testing.assert_array_equal(decode.decode_region(buf, box, shrink_to=(100, 200)),
                                  decode.decode_region(buf, box))


@needs_ext
def test_region_off_turns_scaled_off(monkeypatch):
    monkeypatch.setenv("GLUON_DATA_DECODE_SCALED", "1")
    monkeypatch.setenv("GLUON_DATA_REGION_DECODE", "0")
    assert not decode.scaled_decoding()


@needs_ext
@pytest.mark.parametrize("box,size,denom", [
    ((0, 0, 512, 1024), (256, 512), 2),
    ((3, 5, 509, 1021), (120, 240), 4),
    ((0, 0, 512, 1024), (64, 128), 8),
    ((37, 101, 400, 777), (90, 160), 4),
])
def test_scaled_close_to_exact_and_aligned(scaled, box, size, denom):
    buf = street()
    assert decode.scaled_decoding()
    assert decode._denom((box[2] - box[0], box[3] - box[1]), size) == denom
    got = decode.decode_region(buf, box, shrink_to=size)
    ref = exact(buf, box, size)
    assert got.shape == ref.shape == (size[0], size[1], 3) and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - ref.astype(int))
    # the DCT reduction averages where the bilinear resize samples: small on average...
    assert diff.mean() < 2.5, diff.mean()
    # ...and aligned: shifting the result by one output pixel makes it worse, not better
    for dy, dx in ((1, 0), (0, 1), (-1, 0), (0, -1)):
        moved = np.roll(got, (dy, dx), (0, 1))[2:-2, 2:-2].astype(int)
        assert np.abs(moved - ref[2:-2, 2:-2]).mean() > diff[2:-2, 2:-2].mean()


@needs_ext
def test_under_2x_is_the_exact_path(scaled):
    buf = street()
    box = (0, 0, 400, 800)
    np.testing.assert_array_equal(decode.decode_region(buf, box, shrink_to=(300, 600)),
                                  decode.decode_region(buf, box))


@needs_ext
def test_grey(scaled):
    buf = street()
    grey = decode.decode_region(buf, (0, 0, 512, 1024), 0, shrink_to=(128, 256))
    assert grey.shape == (128, 256, 1)
    assert np.abs(grey.astype(int) - exact(buf, (0, 0, 512, 1024), (128, 256), 0)).mean() < 2.5


@needs_ext
def test_as_strict_as_the_exact_path(scaled):
    buf = bytearray(street())
    cut = bytes(buf[:len(buf) // 2])  # truncated: damage after the box too
    with pytest.raises(DecodeError):
        decode.decode_region(cut, (0, 0, 64, 64), shrink_to=(16, 16))
    with pytest.raises(DecodeError):
        decode.decode_region(cut, (0, 0, 64, 64))
    with pytest.raises(ValueError, match="box"):
        decode.decode_region(bytes(buf), (0, 0, 600, 64), shrink_to=(16, 16))
    with pytest.raises(ValueError, match="shrink_to"):
        decode.decode_region(bytes(buf), (0, 0, 64, 64), shrink_to=(0, 16))
    with pytest.raises(ValueError, match="denom"):
        decode._jpegregion.decode(bytes(buf), 0, 0, 8, 8, 1, True, 3)


@needs_ext
def test_datasets_pass_the_output_size(tmp_path, monkeypatch):
    """``train`` and the classification fast path hand ``decode_region`` the size the box
    becomes: scaled on gives samples of the same shapes, close to the exact ones; off, the
    exact samples."""
    from gluon_data import convert
    from gluon_data.arrays import ClassificationDataset, SegmentationDataset
    from gluon_data.arrays.tensorize import ImageCropNormalize
    from gluon_data.convert.sample import make_imagefolder, make_voc

    voc = make_voc(str(tmp_path / "voc"), num_images=6, size_range=(400, 600), photo=True)
    rec = str(tmp_path / "voc.rec")
    convert(voc, rec, "voc", split="trainval")

    def samples(on):
        monkeypatch.setenv("GLUON_DATA_DECODE_SCALED", "1" if on else "0")
        ds = SegmentationDataset(rec, mode="train", base_size=96, crop_size=64, seed=3)
        return [ds[i] for i in range(len(ds))]

    off, on = samples(False), samples(True)
    for (ie, me), (i_s, m_s) in zip(off, on):
        assert ie.shape == i_s.shape and me.shape == m_s.shape
        np.testing.assert_array_equal(me, m_s)  # the mask is never scaled
        assert np.abs(ie.astype(float) - i_s.astype(float)).mean() < 0.2 * np.abs(ie).mean()
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(off, on))  # it did change some

    folder = make_imagefolder(str(tmp_path / "folder"))
    crec = str(tmp_path / "cls.rec")
    convert(folder, crec, "imagefolder")

    def tensors(on):
        monkeypatch.setenv("GLUON_DATA_DECODE_SCALED", "1" if on else "0")
        crop = ImageCropNormalize(("random", (16, 16), (0.5, 1.0), (0.75, 4 / 3), 1), seed=1)
        ds = ClassificationDataset(crec, image_transform=crop, seed=1)
        return [ds[i][0] for i in range(len(ds))]

    off, on = tensors(False), tensors(True)
    assert all(a.shape == b.shape == (3, 16, 16) for a, b in zip(off, on))
    assert any(not np.array_equal(a, b) for a, b in zip(off, on))
    assert np.mean([np.abs(a - b).mean() for a, b in zip(off, on)]) < 0.1
