"""The record codec against MXNet's native writer and packer, plus fuzzing."""
import struct

import cv2
import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gluon_data.format import codec
from gluon_data.errors import CorruptRecordError, DecodeError, FormatError, GluonDataError

pytestmark = pytest.mark.reliability

MAGIC = struct.pack("<I", codec.RECORDIO_MAGIC)


def native_frame(tmp_path, payloads):
    path = str(tmp_path / "n.rec")
    w = mx.recordio.MXRecordIO(path, "w")
    for p in payloads:
        w.write(p)
    w.close()
    with open(path, "rb") as f:
        return f.read()


PAYLOADS = [b"", b"a", b"ab", b"abc", b"abcd", MAGIC, MAGIC + b"x", b"abcd" + MAGIC,
            MAGIC + b"abcd" + MAGIC + b"xyz", b"ab" + MAGIC + MAGIC, MAGIC * 3,
            b"a" + MAGIC + b"bcd"]  # the last one is unaligned: no split


@pytest.mark.parametrize("payload", PAYLOADS)
def test_frame_is_byte_identical_to_mxnet_writer(tmp_path, payload):
    ours = b"".join(codec.frame(payload))
    assert ours == native_frame(tmp_path, [payload])
    out, end = codec.unframe(ours)
    assert out == payload and end == len(ours)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=64),
                          st.lists(st.sampled_from([MAGIC, b"abcd", b"\0\0\0\0"]), max_size=6)
                          .map(b"".join)), min_size=1, max_size=4))
def test_frame_matches_native_for_generated_payloads(tmp_path_factory, payloads):
    stream = b"".join(b"".join(codec.frame(p)) for p in payloads)
    assert stream == native_frame(tmp_path_factory.mktemp("h"), payloads)
    pos = 0
    for p in payloads:
        out, pos = codec.unframe(stream, pos)
        assert out == p
    assert pos == len(stream)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_unframe_and_unpack_raise_only_typed_errors_on_garbage(data):
    try:
        payload, _ = codec.unframe(data)
        codec.unpack(payload)
    except GluonDataError:
        pass


def test_frame_refuses_records_over_the_recordio_limit():
    big = np.zeros(1 << 29, np.uint8)  # calloc'd: costs no real memory
    with pytest.raises(FormatError, match="2\\*\\*29"):
        codec.frame(big)


def test_unframe_reports_where_the_damage_is():
    rec = b"".join(codec.frame(b"hello world!"))
    with pytest.raises(CorruptRecordError, match="bad magic") as e:
        codec.unframe(b"\0" + rec[1:], path="x.rec", key=7, base_offset=100)
    assert (e.value.path, e.value.key, e.value.offset) == ("x.rec", 7, 100)
    with pytest.raises(CorruptRecordError, match="truncated record"):
        codec.unframe(rec[:10])
    with pytest.raises(CorruptRecordError, match="truncated record header"):
        codec.unframe(rec[:5])
    bad_flag = rec[:4] + struct.pack("<I", (2 << 29) | 12) + rec[8:]
    with pytest.raises(CorruptRecordError, match="continuation flag"):
        codec.unframe(bad_flag)


@pytest.mark.parametrize("label", [3, 2.5, [1.0, 2.0, 3.5]])
def test_classification_payload_is_what_mx_pack_writes(label):
    ours = codec.pack_classification(label, b"\xff\xd8imagebytes", id=42, checksum=False)
    assert ours == mx.recordio.pack(mx.recordio.IRHeader(0, label, 42, 0), b"\xff\xd8imagebytes")
    header, rest = mx.recordio.unpack(codec.pack_classification(label, b"img", id=42))
    assert rest == b"img" and header.id == 42
    np.testing.assert_allclose(header.label, label)


def test_checksum_detects_any_flipped_bit():
    payload = codec.pack_segmentation(b"IMAGE", b"MASK", id=5)
    rec = codec.unpack(payload)
    assert (rec.image, rec.mask, rec.id) == (b"IMAGE", b"MASK", 5)
    for byte in list(range(0, 16)) + list(range(24, len(payload))):
        damaged = bytearray(payload)
        damaged[byte] ^= 0x10
        with pytest.raises(FormatError):
            codec.unpack(bytes(damaged), segmentation=True)


def test_stock_payload_without_checksum_is_accepted():
    rec = codec.unpack(mx.recordio.pack(mx.recordio.IRHeader(0, 1, 0, 0), b"img"))
    assert rec.checksum is None and rec.image == b"img" and rec.label == 1.0


def test_segmentation_image_part_decodes_with_stock_unpack_img():
    img = np.random.default_rng(0).integers(0, 255, (12, 9, 3), dtype=np.uint8)
    png = cv2.imencode(".png", img)[1].tobytes()
    payload = codec.pack_segmentation(png, codec.encode_mask(np.ones((12, 9), np.uint8)))
    _, decoded = mx.recordio.unpack_img(payload)
    np.testing.assert_array_equal(decoded, img)


def test_segmentation_lengths_are_exact_and_validated():
    payload = codec.pack_segmentation(b"a" * 1000, b"b" * 7, checksum=False)
    rec = codec.unpack(payload)
    assert len(rec.image) == 1000 and len(rec.mask) == 7
    with pytest.raises(CorruptRecordError, match="trailer"):
        codec.unpack(payload[:30] + payload[31:], segmentation=True)
    with pytest.raises(FormatError, match="not a segmentation record"):
        codec.unpack(codec.pack_classification(1, b"x"), segmentation=True)


@pytest.mark.parametrize("dtype,maxid", [(np.uint8, 255), (np.uint16, 1000)])
def test_masks_round_trip_bit_exact(dtype, maxid):
    m = np.random.default_rng(1).integers(0, maxid + 1, (17, 23)).astype(dtype)
    out = codec.decode_mask(codec.encode_mask(m))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, m)


def test_raw_arrays_round_trip():
    img = np.random.default_rng(2).integers(0, 255, (5, 4, 3), dtype=np.uint8)
    np.testing.assert_array_equal(codec.decode_image(codec.encode_raw(img)), img)
    m = np.arange(12, dtype=np.uint16).reshape(3, 4) * 300
    np.testing.assert_array_equal(codec.decode_mask(codec.encode_raw(m)), m)
    with pytest.raises(DecodeError):
        codec.decode_image(codec.encode_raw(img)[:-1])


@pytest.mark.parametrize("dtype,maxid", [(np.uint8, 255), (np.uint16, 1000)])
def test_compressed_masks_round_trip_bit_exact(dtype, maxid):
    m = np.random.default_rng(1).integers(0, maxid + 1, (17, 23)).astype(dtype)
    buf = codec.encode_raw(m, compress=6)
    assert buf[:4] == codec.RAWZ_MAGIC and codec.is_raw(buf)
    out = codec.decode_mask(buf)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, m)


def test_compressed_arrays_refuse_damage_and_bombs():
    m = np.zeros((64, 64), np.uint8)
    m[10:20, 5:50] = 7
    good = codec.encode_raw(m, compress=6)
    head = len(good) - len(codec.zlib.compress(m.tobytes(), 6))
    for bad, why in [(good[:-3], "cut short"), (good[:head] + b"\x00" * 20, "corrupt"),
                     (good + b"junk", "more|expected"),
                     (good[:head] + codec.zlib.compress(m[:32].tobytes()), "expected")]:
        with pytest.raises(DecodeError, match=why):
            codec.decode_mask(bad)
    # a header claiming 40000 x 40000 pixels is refused before anything is inflated
    bomb = codec._RAW_HEAD.pack(codec.RAWZ_MAGIC, 1, 2) + struct.pack("<2I", 40000, 40000)
    bomb += codec.zlib.compress(b"\0" * (1 << 20))
    with pytest.raises(DecodeError, match="max_pixels"):
        codec.decode_mask(bomb)


def _jpeg(h=16, w=16):
    img = np.random.default_rng(3).integers(0, 255, (h, w, 3), dtype=np.uint8)
    return cv2.imencode(".jpg", img)[1].tobytes()


def _png(h=16, w=16):
    return cv2.imencode(".png", np.zeros((h, w, 3), np.uint8))[1].tobytes()


def test_decode_image_matches_mx_imdecode():
    buf = _jpeg()
    np.testing.assert_array_equal(codec.decode_image(buf), mx.image.imdecode(buf).asnumpy())
    np.testing.assert_array_equal(codec.decode_image(buf, 0),
                                  mx.image.imdecode(buf, 0).asnumpy())


@pytest.mark.parametrize("bad", [
    b"", b"garbage that is not an image",
    _jpeg()[:-40],                     # truncated JPEG (cv2 would return grey rows)
    _jpeg()[:200],                     # header only
    _png()[:-20],                      # truncated PNG
    _png()[:33],                       # PNG header only
    b"\xff\xd8\xff\xda" + b"\x00" * 50 + b"\xff\xd9",  # structurally plausible garbage
])
def test_bad_image_bytes_give_one_uniform_error(bad):
    with pytest.raises(DecodeError):
        codec.decode_image(bad)


def _photo_jpeg(exif=None, h=48, w=64):
    import io
    from PIL import Image
    rng = np.random.default_rng(4)
    img = cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (0, 0), 2)
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=90,
                              **({"exif": exif} if exif is not None else {}))
    return out.getvalue()


def test_mid_stream_corrupt_jpeg_is_an_error_not_a_silent_picture():
    buf = bytearray(_photo_jpeg(h=300, w=400))
    mid = len(buf) // 2
    buf[mid:mid + 40] = b"\x55" * 40  # entropy data damaged; the file still ends in FFD9
    assert cv2.imdecode(np.frombuffer(bytes(buf), np.uint8), 1) is not None  # OpenCV: silent
    with pytest.raises(DecodeError, match="corrupt JPEG"):
        codec.decode_image(bytes(buf))


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_exif_orientation_is_ignored_as_mx_imdecode_ignores_it(orientation):
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = _photo_jpeg(exif.tobytes())
    np.testing.assert_array_equal(codec.decode_image(buf), mx.image.imdecode(buf).asnumpy())
    np.testing.assert_array_equal(codec.decode_image(buf, 0),
                                  mx.image.imdecode(buf, 0).asnumpy())


def test_image_size_read_from_headers_and_capped_before_decoding():
    assert codec.image_size(_jpeg(13, 21)) == (13, 21)
    assert codec.image_size(_png(7, 9)) == (7, 9)
    huge = bytearray(_png(7, 9))
    huge[16:24] = struct.pack(">II", 20000, 20000)
    with pytest.raises(DecodeError, match="exceed the limit"):
        codec.decode_image(bytes(huge))
    with pytest.raises(DecodeError, match="exceed the limit"):
        codec.decode_image(_png(64, 64), max_pixels=1000)


def test_mask_must_be_single_channel_png():
    with pytest.raises(DecodeError, match="single-channel"):
        codec.decode_mask(_png())
    with pytest.raises(DecodeError, match="PNG"):
        codec.decode_mask(_jpeg())


_IMG = cv2.imencode(".jpg", np.random.default_rng(5).integers(0, 255, (20, 24, 3),
                                                               dtype=np.uint8))[1].tobytes()
_MASK = codec.encode_mask(np.random.default_rng(6).integers(0, 21, (20, 24)).astype(np.uint8))
_VALID = [b"".join(codec.frame(codec.pack_segmentation(_IMG, _MASK, id=3))),
          b"".join(codec.frame(codec.pack_classification([1, 2], _IMG, id=4)))]
FUZZED = {"bytes": 0, "cases": 0}


@settings(max_examples=400, deadline=None)
@given(which=st.integers(0, 1), cut=st.integers(0, 4000), flips=st.lists(
    st.tuples(st.integers(0, 4000), st.integers(0, 7)), max_size=4),
    run=st.one_of(st.none(), st.tuples(st.integers(0, 4000), st.binary(min_size=1,
                                                                          max_size=16))))
def test_mutated_records_give_typed_errors_or_flagged_or_exact_data(which, cut, flips, run):
    """Truncate / flip bits / overwrite a run in a valid framed record. Whatever happens, the
    outcome is a GluonDataError, a record flagged as unchecked (checksum tag destroyed; the
    dataset layer then refuses it), or exactly the original content — never silent garbage."""
    data = bytearray(_VALID[which])
    original = codec.unframe(bytes(data))[0]
    for pos, bit in flips:
        data[pos % len(data)] ^= 1 << bit
    if run is not None:
        pos, junk = run
        pos %= len(data)
        data[pos:pos + len(junk)] = junk
    data = bytes(data[:max(1, cut % (len(data) + 1))])
    FUZZED["bytes"] += len(data)
    FUZZED["cases"] += 1
    try:
        payload, _ = codec.unframe(data)
        rec = codec.unpack(payload, segmentation=which == 0)
        if rec.checksum is None:
            return  # unchecked: SegmentationRecordDataset / verify refuse it as "checksum missing"
        assert payload == original
        codec.decode_image(rec.image)
        if rec.mask is not None:
            codec.decode_mask(rec.mask)
    except GluonDataError:
        pass
