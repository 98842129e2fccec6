"""One decoder decides what is valid: the full decode (libjpeg-turbo in simplejpeg).

The region decoder links the system's libjpeg-turbo, another version: it refused lossless
(SOF3) JPEGs that convert and ``verify --deep`` accept, and it read JPEGs with unusual chroma
sampling that the full decode refuses, so one record gave a sample or a DecodeError
depending on the random box. Here every path (region decoding forced, default, off, without
the extension; a dataset under random crops; a converted record; ``verify --deep``) must
give the decoder of record's answer: its pixels, or its DecodeError.
"""
import os
import tracemalloc

import numpy as np
import pytest
from mxnet.gluon.data.vision import transforms as VT

from gluon_data import ImageRecordDataset
from gluon_data.format import codec, decode
from gluon_data import convert
from gluon_data.tools import verify
from gluon_data.errors import DecodeError
from gluon_data.stores.recordio import RecordFile
from gluon_data.sampling.sampler import SampleKey
from jpeg_variants import ODD_SAMPLINGS, baseline_jpeg, lossless_jpeg
from test_region_decode import _write_stock_rec, boxes, needs_ext, photo

_STANDARD = {"444": ((1, 1),) * 3, "420": ((2, 2), (1, 1), (1, 1)),
             "441": ((1, 4), (1, 1), (1, 1))}


def variant(name, h=37, w=45, seed=0):
    """The JPEG variant ``name``: ``lossless`` (RGB) / ``lossless-grey`` (SOF3), an odd
    sampling of :data:`ODD_SAMPLINGS`, a standard one of ``_STANDARD``, ``grey-2x2`` (grey
    with sampling factors that mean nothing), ``422-alt`` (4:2:2 written as Y 2x2, chroma
    1x2: read by both libraries, but not a layout the region decoder is given)."""
    img = photo(h, w, seed)
    if name == "lossless":
        return lossless_jpeg(img, predictor=1 + seed % 7)
    if name == "lossless-grey":
        return lossless_jpeg(img[:, :, 1], predictor=1 + seed % 7)
    if name == "grey-2x2":
        return baseline_jpeg(img[:, :, 0], [(2, 2)])
    if name == "422-alt":
        return baseline_jpeg(img, ((2, 2), (1, 2), (1, 2)))
    return baseline_jpeg(img, ODD_SAMPLINGS.get(name) or _STANDARD[name])


ODD = sorted(ODD_SAMPLINGS)
VARIANTS = ["lossless", "lossless-grey"] + ODD + sorted(_STANDARD) + ["grey-2x2", "422-alt"]


def outcome(fn, *args, **kwargs):
    """``("pixels", array)`` or ``("error", exception type)``."""
    try:
        return "pixels", fn(*args, **kwargs)
    except DecodeError as e:
        return "error", type(e)


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    return a[1] is b[1] if a[0] == "error" else np.array_equal(a[1], b[1])


@pytest.fixture(params=["region forced", "default", "region off", "no extension"])
def mode(request, monkeypatch):
    """The ways a box gets decoded: through the extension wherever it may be used (any box
    size), as configured by default, with GLUON_DATA_REGION_DECODE=0, without the extension."""
    monkeypatch.setenv("GLUON_DATA_REGION_DECODE", "0" if request.param == "region off" else "1")
    if request.param == "region forced":
        if decode._jpegregion is None:
            pytest.skip("the region decoder extension is not built")
        monkeypatch.setattr(decode, "REGION_MAX_FRACTION", 1.0)
    if request.param == "no extension":
        monkeypatch.setattr(decode, "_jpegregion", None)
    return request.param


def test_the_decoder_of_record_reads_lossless_and_refuses_odd_sampling():
    """What the tests below hold every path to (and that the generated files are what they
    claim: the lossless one decodes to its source exactly)."""
    img = photo(37, 45, 0)
    for predictor in range(1, 8):
        assert np.array_equal(codec.decode_image(lossless_jpeg(img, predictor), 1), img)
    assert np.array_equal(codec.decode_image(variant("lossless-grey"), 0)[:, :, 0], img[:, :, 1])
    for name in ODD:
        with pytest.raises(DecodeError, match="unsupported JPEG variant.*subsampling"):
            codec.decode_image(variant(name), 1)
        with pytest.raises(DecodeError, match="unsupported JPEG variant"):
            codec.decode_image(variant(name), 0)


@pytest.mark.parametrize("hw", [(37, 45), (9, 70), (2, 3)])
@pytest.mark.parametrize("name", VARIANTS)
def test_every_box_gives_the_full_decodes_answer(name, hw, mode):
    """Pixels or the same DecodeError type as ``decode_image``, for the whole image, every
    edge and corner and random boxes, in colour and grey, in every mode."""
    h, w = hw
    buf = variant(name, h, w, seed=h + w)
    rng = np.random.default_rng(h * w)
    for flag in (1, 0):
        full = outcome(codec.decode_image, buf, flag)
        for box in boxes(rng, h, w, 40):
            y0, x0, y1, x1 = box
            want = full if full[0] == "error" else ("pixels", full[1][y0:y1, x0:x1])
            got = outcome(decode.decode_region, buf, box, flag)
            ok = same(got, want)
            assert ok, (name, mode, flag, box, got[0], want[0])


def test_the_header_decides_which_jpegs_the_region_decoder_gets():
    frames = {name: codec.jpeg_frame(variant(name)) for name in VARIANTS}
    assert frames["lossless"] == codec.JpegFrame(0xC3, 8, 37, 45, ((1, 1),) * 3)
    assert frames["3x1"].sampling == ((3, 1), (1, 1), (1, 1))
    assert frames["mixed"].sampling == ((2, 2), (2, 1), (1, 2))
    exact = {name for name, frame in frames.items() if decode.region_exact(frame)}
    assert exact == set(_STANDARD) | {"grey-2x2"}
    assert not decode.region_exact(None)
    assert not decode.region_exact(codec.JpegFrame(0xC1, 12, 8, 8, ((1, 1),)))  # 12-bit
    assert not decode.region_exact(codec.JpegFrame(0xC9, 8, 8, 8, ((1, 1),)))  # arithmetic


@needs_ext
@pytest.mark.parametrize("name", VARIANTS)
def test_the_extension_is_given_exactly_the_exact_variants(name, monkeypatch):
    """The JPEGs ``region_exact`` admits do take the extension (and match); the others
    never reach it, whatever the box."""
    monkeypatch.setattr(decode, "REGION_MAX_FRACTION", 1.0)
    buf = variant(name, 40, 48, seed=1)
    got = decode._region(buf, (3, 5, 20, 30), 1, None, "image")
    if decode.region_exact(codec.jpeg_frame(buf)):
        assert np.array_equal(got, codec.decode_image(buf, 1)[3:20, 5:30])
    else:
        assert got is None


@needs_ext
def test_a_box_beyond_the_header_size_is_refused_before_allocating():
    """The private entry point reads the header, then allocates the box: a 40000x40000 box
    on an 8x8 image is a ValueError, not 4.8 GB."""
    buf = baseline_jpeg(photo(8, 8))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"box \(0, 0, 40000, 40000\) lies outside the 8x8"):
            decode._jpegregion.decode(buf, 0, 0, 40000, 40000, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    for box in ((0, 0, 9, 8), (0, 0, 8, 9), (0, 5, 4, 5), (-1, 0, 4, 4)):
        with pytest.raises(ValueError, match="box"):
            decode._jpegregion.decode(buf, *box, 1)
    out, channels = decode._jpegregion.decode(buf, 0, 0, 8, 8, 1)
    assert channels == 3 and len(out) == 8 * 8 * 3


def _crop_samples(path, epochs=4):
    """Every sample of a few epochs under RandomResizedCrop: outcomes by (epoch, index)."""
    fn = VT.Compose([VT.RandomResizedCrop(8, scale=(0.05, 0.5)), VT.ToTensor()])
    ds = ImageRecordDataset(path, seed=0).transform_first(fn)
    assert ds.fast_path is not None
    return {(e, i): outcome(lambda k: ds[k][0].asnumpy(), SampleKey(i, epoch=e))
            for e in range(epochs) for i in range(len(ds))}


def _modes_agree(path, monkeypatch):
    runs = {}
    for on in ("1", "0"):
        monkeypatch.setenv("GLUON_DATA_REGION_DECODE", on)
        runs[on] = _crop_samples(path)
    assert runs["1"].keys() == runs["0"].keys()
    bad = [k for k in runs["1"] if not same(runs["1"][k], runs["0"][k])]
    assert not bad, bad
    return runs["1"]


def test_a_stock_record_reads_as_it_verifies_under_random_crops(tmp_path, monkeypatch):
    """Stock records (kept as written, as im2rec does) of each variant: a sample or a
    DecodeError whatever the random box and the mode, and exactly the records ``verify
    --deep`` reports are the ones that do not read."""
    names = ["lossless"] + ODD + ["420"]
    path = _write_stock_rec(str(tmp_path / "stock.rec"),
                            [variant(n, 40, 48, seed=k) for k, n in enumerate(names)])
    samples = _modes_agree(path, monkeypatch)
    unreadable = {i for (_, i), (kind, _) in samples.items() if kind == "error"}
    assert unreadable == {names.index(n) for n in ODD}
    for (_, i), (kind, _) in samples.items():  # the same answer for every box
        assert (kind == "error") == (i in unreadable)
    report = verify(path, deep=True)
    assert {p["key"] for p in report.problems} == unreadable, str(report)


def test_what_converts_and_verifies_reads_under_random_crops(tmp_path, monkeypatch):
    """Sources of each variant convert (a lossless JPEG kept as is, an odd-sampled one the
    decoder of record refuses re-encoded), verify deep, and read in every mode."""
    root = tmp_path / "src"
    names = ["lossless"] + ODD + ["420"]
    for k, name in enumerate(names):
        os.makedirs(root / ("c%d" % (k % 2)), exist_ok=True)
        (root / ("c%d" % (k % 2)) / ("%s.jpg" % name)).write_bytes(variant(name, 40, 48, k))
    out = str(tmp_path / "conv.rec")
    convert(str(root), out, "imagefolder")
    assert verify(out, deep=True).ok
    samples = _modes_agree(out, monkeypatch)
    assert all(kind == "pixels" for kind, _ in samples.values())
    rf = RecordFile(out)
    try:
        stored = [codec.unpack(rf.read(i)).image for i in range(len(rf))]
    finally:
        rf.close()
    assert variant("lossless", 40, 48, 0) in stored  # passed through: SOF3 in the record
