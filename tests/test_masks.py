"""Run-length masks (``GDRL``): round trips in both dtypes, row ranges, the C expansion and
numpy's giving the same pixels and the same refusals, and every field checked on read
(truncated, oversized, inconsistent: a DecodeError, never a crash or wrong pixels)."""
import struct
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gluon_data.errors import DecodeError
from gluon_data.format import codec, masks

EXPANDERS = ["c", "c-built-before-check", "numpy"]


@pytest.fixture(params=EXPANDERS)
def expander(request, monkeypatch):
    if request.param.startswith("c"):
        if masks._ext is None:
            pytest.skip("the C expansion is not built here")
        if request.param == "c-built-before-check":  # an extension without check(): numpy's
            monkeypatch.setattr(masks, "_ext", types.SimpleNamespace(expand=masks._ext.expand))
    else:
        monkeypatch.setattr(masks, "_ext", None)
    return request.param


def _both(buf, **kw):
    """Decode with the C expansion and with numpy: the same pixels, or the same refusal."""
    results = []
    ext = masks._ext
    for e in ([ext] if ext is not None else []) + [None]:
        masks._ext = e
        try:
            results.append(codec.decode_mask(buf, **kw))
        except DecodeError as err:
            results.append(err)
        finally:
            masks._ext = ext
    first = results[0]
    for other in results[1:]:
        if isinstance(first, DecodeError):
            assert isinstance(other, DecodeError), "C refused, numpy decoded"
        else:
            assert not isinstance(other, DecodeError), "C decoded, numpy refused: %s" % other
            assert other.dtype == first.dtype and np.array_equal(other, first)
    if isinstance(first, DecodeError):
        raise first
    return first


def _street(h=96, w=130, seed=0):
    rng = np.random.default_rng(seed)
    m = np.zeros((h, w), np.uint8)
    for _ in range(6):
        y, x = rng.integers(0, h), rng.integers(0, w)
        m[y:y + rng.integers(3, 40), x:x + rng.integers(3, 60)] = rng.integers(1, 21)
    m[::17, :] = 255
    return m


@pytest.mark.parametrize("dtype,top", [(np.uint8, 255), (np.uint16, 65535), (np.int64, 300)])
def test_round_trip_in_the_smallest_dtype(dtype, top, expander):
    m = np.random.default_rng(1).integers(0, top + 1, (37, 23)).astype(dtype)
    m[:5] = top
    buf = masks.encode_rle(m)
    out = codec.decode_mask(buf)
    assert out.dtype == (np.uint8 if top <= 255 else np.uint16)
    np.testing.assert_array_equal(out, m)
    assert codec.mask_size(buf) == m.shape


def test_uint16_mask_with_small_ids_is_stored_in_uint8():
    m = _street().astype(np.uint16)
    assert codec.decode_mask(masks.encode_rle(m)).dtype == np.uint8


@pytest.mark.parametrize("block_rows", [1, 3, 16, 500])
def test_rows_decode_only_their_blocks_and_equal_the_full_decode(block_rows, expander):
    m = _street()
    buf = masks.encode_rle(m, block_rows=block_rows)
    for y0, y1 in [(0, 96), (0, 1), (95, 96), (15, 17), (16, 32), (33, 80)]:
        out = codec.decode_mask(buf, rows=(y0, y1))
        np.testing.assert_array_equal(out, m[y0:y1])
        assert out.flags.c_contiguous


def test_long_runs_are_cut_at_65535_and_at_block_starts():
    m = np.full((300, 700), 4, np.uint8)  # 210000 pixels of one id: blocks of 16 rows
    lengths, values, offsets = masks.mask_runs(m, 300)
    assert lengths.max() == 65535 and lengths.sum() == m.size and (values == 4).all()
    assert len(offsets) == 2 and offsets[-1] == len(lengths) == 4
    lengths, _, offsets = masks.mask_runs(m)
    assert len(offsets) == 300 // 16 + 2 and np.all(np.diff(offsets) == 1)
    np.testing.assert_array_equal(_both(masks.encode_rle(m, 300)), m)


def test_class_counts_come_from_the_runs():
    m = _street()
    lengths, values, _ = masks.mask_runs(m)
    counts = np.bincount(values, weights=lengths, minlength=256).astype(np.int64)
    np.testing.assert_array_equal(counts, np.bincount(m.ravel(), minlength=256))


def test_png_and_raw_masks_still_read_with_rows():
    m = _street()
    for buf in (codec.encode_mask(m), codec.encode_raw(m), codec.encode_raw(m, compress=1)):
        np.testing.assert_array_equal(codec.decode_mask(buf), m)
        np.testing.assert_array_equal(codec.decode_mask(buf, rows=(10, 40)), m[10:40])
        assert codec.mask_size(buf) == m.shape
        with pytest.raises(DecodeError, match="rows 90:97"):
            codec.decode_mask(buf, rows=(90, 97))


@pytest.mark.parametrize("rows", [(-1, 5), (5, 5), (10, 4), (0, 97)])
def test_rows_outside_the_mask_are_refused(rows):
    with pytest.raises(DecodeError, match="rows"):
        codec.decode_mask(masks.encode_rle(_street()), rows=rows)


def test_encoder_refuses_what_it_cannot_store():
    for bad in (np.zeros((3,), np.uint8), np.zeros((0, 4), np.uint8),
                np.full((2, 2), 70000, np.int64), np.full((2, 2), -1, np.int64),
                np.zeros((2, 2), np.float32)):
        with pytest.raises(ValueError):
            masks.encode_rle(bad)
    with pytest.raises(ValueError, match="block_rows"):
        masks.encode_rle(np.zeros((2, 2), np.uint8), block_rows=0)


_HEAD = struct.Struct("<4sBBHIII")


def _rebuilt(buf, **fields):
    """The bytes with header fields replaced."""
    names = ("magic", "version", "code", "brows", "h", "w", "runs")
    vals = dict(zip(names, _HEAD.unpack_from(buf, 0)))
    vals.update(fields)
    return _HEAD.pack(*(vals[n] for n in names)) + bytes(buf[_HEAD.size:])


@pytest.mark.parametrize("change,reason", [
    (dict(version=2), "version 2"),
    (dict(code=3), "dtype code 3"),
    (dict(brows=0), "blocks of 0 rows"),
    (dict(h=0), "130x0 pixels"),
    (dict(h=97), "bytes"),           # one block more: the table no longer fits
    (dict(w=131), "add up|bytes"),   # wider rows: blocks no longer filled exactly
    (dict(runs=1), "bytes"),
    (dict(h=1 << 20, w=1 << 20), "max_pixels"),
])
def test_every_header_field_is_checked(change, reason, expander):
    buf = _rebuilt(masks.encode_rle(_street()), **change)
    with pytest.raises(DecodeError, match=reason) as err:
        codec.decode_mask(buf, what="mask of rec 7")
    assert str(err.value.reason).startswith("mask of rec 7: ")


def test_inconsistent_block_tables_and_runs_are_refused(expander):
    m = _street()
    buf = bytearray(masks.encode_rle(m))
    hd = masks.rle_header(buf)
    table_at = _HEAD.size
    swapped = bytearray(buf)  # two block starts swapped: not increasing
    a, b = table_at + 4, table_at + 8
    swapped[a:a + 4], swapped[b:b + 4] = buf[b:b + 4], buf[a:a + 4]
    with pytest.raises(DecodeError, match="block table"):
        codec.decode_mask(bytes(swapped))
    moved = bytearray(buf)  # a block's first run moved by one: its runs no longer add up
    struct.pack_into("<I", moved, table_at + 4, struct.unpack_from("<I", buf, table_at + 4)[0]
                     + 1)
    with pytest.raises(DecodeError, match="add up"):
        codec.decode_mask(bytes(moved))
    longer = bytearray(buf)  # one run one pixel longer
    struct.pack_into("<H", longer, hd.lengths_at, struct.unpack_from("<H", buf,
                                                                    hd.lengths_at)[0] + 1)
    with pytest.raises(DecodeError, match="block 0: runs add up"):
        codec.decode_mask(bytes(longer))
    with pytest.raises(DecodeError, match="block 0: runs add up"):  # rows in the bad block
        codec.decode_mask(bytes(longer), rows=(0, 4))
    # rows in good blocks read: only the blocks decoded are checked, and they are right
    np.testing.assert_array_equal(codec.decode_mask(bytes(longer), rows=(40, 60)), m[40:60])


@pytest.mark.parametrize("cut", [0, 3, 19, 30, -1])
def test_truncated_masks_are_refused(cut):
    buf = masks.encode_rle(_street())
    with pytest.raises(DecodeError):
        codec.decode_mask(buf[:cut] if cut >= 0 else buf + b"\0")


@settings(max_examples=150, deadline=None)
@given(h=st.integers(1, 40), w=st.integers(1, 40), brows=st.integers(1, 20),
       top=st.sampled_from([1, 3, 255, 256, 65535]), seed=st.integers(0, 2 ** 16),
       data=st.data())
def test_property_round_trip_and_rows(h, w, brows, top, seed, data):
    rng = np.random.default_rng(seed)
    m = rng.integers(0, top + 1, (h, w))
    if data.draw(st.booleans()):  # smooth: few runs
        m = np.repeat(m[:, :1], w, axis=1)
    buf = masks.encode_rle(m, block_rows=brows)
    np.testing.assert_array_equal(_both(buf), m)
    y0 = data.draw(st.integers(0, h - 1))
    y1 = data.draw(st.integers(y0 + 1, h))
    np.testing.assert_array_equal(_both(buf, rows=(y0, y1)), m[y0:y1])


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_damaged_masks_raise_decode_error_only(data):
    """Any byte flipped, cut or inserted: a DecodeError or, where the damage is in a run's
    value (which no structure can check), a mask of the header's shape; never another
    exception, and both expansions agree."""
    m = _street(h=data.draw(st.integers(1, 50)), w=data.draw(st.integers(1, 50)),
                seed=data.draw(st.integers(0, 99)))
    buf = bytearray(masks.encode_rle(m, block_rows=data.draw(st.integers(1, 20))))
    op = data.draw(st.sampled_from(["flip", "cut", "insert", "header"]))
    pos = data.draw(st.integers(0, len(buf) - 1))
    if op == "flip":
        buf[pos] ^= data.draw(st.integers(1, 255))
    elif op == "cut":
        del buf[pos:pos + data.draw(st.integers(1, 8))]
    elif op == "insert":
        buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        at = data.draw(st.integers(4, _HEAD.size - 1))
        buf[at] = data.draw(st.integers(0, 255))
    rows = None
    if data.draw(st.booleans()):
        rows = (0, data.draw(st.integers(1, 60)))
    try:
        out = _both(bytes(buf), rows=rows, max_pixels=1 << 22)
    except DecodeError:
        return
    hd = masks.rle_header(bytes(buf))
    assert out.shape == ((rows[1] if rows else hd.height), hd.width)


@pytest.mark.parametrize("w", [2**32 - 1, 2**31, 2**26 + 3])
@pytest.mark.parametrize("max_pixels", [None, 0, 1 << 62])
def test_a_declared_size_the_runs_cannot_fill_is_refused_before_allocating(w, max_pixels,
                                                                           expander):
    """Runs hold at most 65535 pixels each: a header declaring more pixels than its runs can
    cover is refused from the header, whatever max_pixels is, in both expansions (the C path
    used to allocate the declared 64-128 GiB first and fail with MemoryError)."""
    for dtype in (np.uint8, np.uint16):
        buf = _rebuilt(masks.encode_rle(np.zeros((32, 40), dtype)), w=w)
        with pytest.raises(DecodeError, match="runs for 2 blocks of %dx32 pixels" % w):
            masks.decode_rle(buf, "mask of rec 3", max_pixels)
        with pytest.raises(DecodeError, match="runs for 2 blocks"):
            masks.decode_rle(buf, "mask of rec 3", max_pixels, rows=(0, 1))


def test_runs_that_do_not_fill_their_blocks_are_refused_before_allocating(expander):
    """A header the runs could fill (enough of them) whose runs do not add up: refused
    before the mask is allocated, in both expansions (bounded memory, not a MemoryError)."""
    import tracemalloc
    h, w, brows = 32, 2**32 - 1, 16
    runs = -(-h * w // 65535) + 2
    table = np.array([0, runs // 2, runs], "<u4").tobytes()
    buf = (_HEAD.pack(b"GDRL", 1, 2, brows, h, w, runs) + table
           + np.ones(runs, "<u2").tobytes() + np.zeros(runs, "<u2").tobytes())
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match="block 0: runs add up to %d pixels" % (runs // 2)):
            masks.decode_rle(buf, "mask", None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def _runs_both_ways(m, block_rows):
    ext = masks._ext
    try:
        masks._ext = None
        want = masks.mask_runs(m, block_rows)
    finally:
        masks._ext = ext
    return masks.mask_runs(m, block_rows), want


@pytest.mark.parametrize("shape,block_rows", [((96, 128), 16), ((1, 1), 16), ((1, 200000), 3),
                                              ((300, 700), 300), ((17, 1), 4), ((50, 33), 7)])
def test_the_c_runs_are_numpys_runs(shape, block_rows):
    """The encoder's runs from the optional C routine: the same lengths, values and block
    table as numpy's, for masks of few and many runs, long runs cut at 65535, blocks of one
    row or of the whole mask."""
    if getattr(masks._ext, "runs", None) is None:
        pytest.skip("the C run finder is not built here")
    rng = np.random.default_rng(shape[0] * shape[1])
    for m in (np.zeros(shape, np.uint8), np.full(shape, 255, np.uint8),
              rng.integers(0, 3, shape, dtype=np.uint8),
              np.repeat(rng.integers(0, 256, (shape[0], 1), dtype=np.uint8), shape[1], 1),
              np.asfortranarray(rng.integers(0, 2, shape, dtype=np.uint8))):
        got, want = _runs_both_ways(m, block_rows)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        assert masks.encode_rle(m, block_rows) == masks.rle_bytes(
            m.shape, np.uint8, block_rows, *want)
        np.testing.assert_array_equal(_both(masks.encode_rle(m, block_rows)), m)
    with pytest.raises(ValueError, match="whole rows"):
        masks._ext.runs(np.zeros(10, np.uint8), 3, 16)


needs_sample = pytest.mark.skipif(not hasattr(masks._ext, "sample"),
                                  reason="the C run sampler is not built here")


def _nearest(dst, src):
    from gluon_data.arrays.scalecrop import nearest_index
    return nearest_index(dst, src)


@needs_sample
@settings(max_examples=300, deadline=None)
@given(h=st.integers(1, 60), w=st.integers(1, 60), brows=st.integers(1, 20),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_property_runs_sampled_are_the_expanded_box_resized_and_mapped(h, w, brows, seed,
                                                                       data):
    """``RunBox.sample`` = the expanded box, nearest-resized on the same map, mirrored and
    looked up in the table: for any box, output size, flip and entry size, runs crossing
    rows and blocks' last rows included."""
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 4, (h, w)).astype(np.uint8) * 60
    if data.draw(st.booleans()):  # long runs across rows
        m = np.repeat(m.ravel()[:: max(1, w // 2)], max(1, w // 2))[:h * w]
        m = np.resize(m, (h, w)).astype(np.uint8)
    buf = masks.encode_rle(m, block_rows=brows)
    y0 = data.draw(st.integers(0, h - 1))
    y1 = data.draw(st.integers(y0 + 1, h))
    x0 = data.draw(st.integers(0, w - 1))
    x1 = data.draw(st.integers(x0 + 1, w))
    vh, vw = data.draw(st.integers(1, 90)), data.draw(st.integers(1, 90))
    flip = data.draw(st.booleans())
    dtype = data.draw(st.sampled_from([np.uint8, np.int16, np.int32]))
    table = rng.integers(-100 if dtype != np.uint8 else 0, 127, 256).astype(dtype)
    box = masks.run_box(buf, box=(y0, x0, y1, x1))
    assert box.shape == (y1 - y0, x1 - x0)
    np.testing.assert_array_equal(np.asarray(box), m[y0:y1, x0:x1])
    rows, cols = _nearest(vh, y1 - y0), _nearest(vw, x1 - x0)
    want = table[m[y0:y1, x0:x1][rows][:, cols]]
    if flip:
        want = want[:, ::-1]
    out = np.full((vh + 3, vw + 2), 77, dtype)
    box.sample(rows, cols, table, out, flip)
    np.testing.assert_array_equal(out[:vh, :vw], want)
    assert (out[vh:] == 77).all() and (out[:vh, vw:] == 77).all()  # nothing else written


def test_run_box_is_for_uint8_run_length_masks_only(monkeypatch):
    m = _street()
    assert masks.run_box(masks.encode_rle(m.astype(np.uint16) * 300),
                         box=(0, 0, 5, 5)) is None
    assert masks.run_box(codec.encode_mask(m), box=(0, 0, 5, 5)) is None  # a PNG
    monkeypatch.setattr(masks, "_ext", types.SimpleNamespace(expand=None))  # an older build
    assert masks.run_box(masks.encode_rle(m), box=(0, 0, 5, 5)) is None


@needs_sample
def test_run_box_refuses_a_box_outside_the_mask_and_damaged_runs():
    m = _street(h=40, w=30)
    buf = masks.encode_rle(m, block_rows=8)
    for box in ((0, 0, 41, 5), (0, 5, 3, 31), (3, 4, 3, 9), (0, 9, 5, 9)):
        with pytest.raises(DecodeError, match="asked of a mask"):
            masks.run_box(buf, box=box, what="record 3")
    hd = masks.rle_header(buf)
    bad = bytearray(buf)
    bad[hd.lengths_at] ^= 0x40  # the first run's length: block 0 no longer adds up
    with pytest.raises(DecodeError, match="^record 3: corrupt run-length mask"):
        masks.run_box(bytes(bad), box=(0, 0, 8, 30), what="record 3")


@needs_sample
def test_the_c_sampler_refuses_rows_and_columns_outside_its_blocks():
    m = _street(h=40, w=30)
    box = masks.run_box(masks.encode_rle(m, block_rows=8), box=(8, 2, 16, 20))
    table = np.arange(256, dtype=np.int32)
    out = np.empty((4, 4), np.int32)
    for rows, cols in ((np.array([0, 9]), np.arange(4)), (np.array([2, 1]), np.arange(4)),
                       (np.arange(4), np.array([0, 18])), (np.arange(4), np.array([-1, 0]))):
        with pytest.raises(ValueError, match="non-decreasing"):
            box.sample(rows, cols, table, out)
    with pytest.raises(ValueError, match="dtype of table"):
        box.sample(np.arange(4), np.arange(4), table, np.empty((4, 4), np.int16))
    unaligned = np.frombuffer(bytearray(4 * 16 + 1), np.int32, 16, offset=1).reshape(4, 4)
    with pytest.raises(ValueError, match="aligned"):
        box.sample(np.arange(4), np.arange(4), table, unaligned)
    with pytest.raises(ValueError, match="1, 2 or 4 bytes"):
        box.sample(np.arange(4), np.arange(4), table.astype(np.int64),
                   np.empty((4, 4), np.int64))


@needs_sample
def test_the_c_sampler_checks_the_runs_itself():
    """Runs that do not fill their block are refused by the routine too, not only by the
    caller's check: nothing is read outside them."""
    m = _street(h=32, w=20)
    buf = masks.encode_rle(m, block_rows=16)
    hd = masks.rle_header(buf)
    lengths = bytes(hd.values_at - hd.lengths_at)  # every run 0 pixels long
    offsets = np.frombuffer(buf, "<u4", hd.blocks + 1, masks._HEAD.size).copy()
    with pytest.raises(ValueError, match="block 0: runs add up to 0 pixels"):
        masks._ext.sample(lengths, buf[hd.values_at:], offsets, 16 * 20, 16 * 20, 20, 0,
                          np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64),
                          np.arange(256, dtype=np.uint8), 1, False,
                          np.empty((4, 4), np.uint8), 4)


@needs_sample
def test_a_run_box_does_not_change_with_the_buffer_it_came_from():
    m = _street(h=40, w=30)
    ba = bytearray(masks.encode_rle(m, block_rows=8))
    box = masks.run_box(ba, box=(0, 0, 40, 30))
    ba[masks.rle_header(bytes(ba)).lengths_at:] = bytes(len(ba) - masks.rle_header(
        bytes(ba)).lengths_at)  # the caller's buffer zeroed after the box was taken
    out = np.empty((40, 30), np.uint8)
    box.sample(np.arange(40), np.arange(30), np.arange(256, dtype=np.uint8), out)
    np.testing.assert_array_equal(out, m)
