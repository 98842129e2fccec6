"""Run-length masks (``GDRL``, FORMAT.md section 3): class ids as runs in row blocks.

A mask's pixels, in C order, are cut into blocks of ``block_rows`` rows; each block is a list
of runs ``(length, value)`` that never crosses a block's start, and a table gives the first
run of every block. Decoding expands runs (``memset`` in the optional C extension
``gluon_data.format._maskrle``, ``np.repeat`` without it: the same bytes, the same checks, the
same pixels), so rows ``y0:y1`` cost only the blocks they cover; encoding finds a uint8
mask's runs in one pass there too (numpy's arrays without it). Every field is checked
before anything is allocated: a record that is cut short, oversized or inconsistent is a
:class:`~gluon_data.errors.DecodeError`, never a crash or wrong pixels.
"""
from __future__ import annotations

import struct
from typing import Dict, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import DecodeError
from .headers import BytesLike, image_size
from .rawarray import is_raw, raw_shape

try:  # built by setup.py where a C compiler is present; numpy decodes the same bytes without
    from . import _maskrle as _ext  # type: ignore[attr-defined]  # C extension, no stub
except ImportError:  # pragma: no cover - depends on the install
    _ext = None

__all__ = ["RLE_MAGIC", "RLE_VERSION", "DEFAULT_BLOCK_ROWS", "MASK_ENCODINGS", "RleHeader",
           "encode_rle", "is_rle", "rle_header", "decode_rle", "mask_runs", "rle_bytes", "mask_size",
           "take_rows", "RunBox", "run_box", "sampled_by_runs"]

#: How converters store masks: ``rle`` (run-length row blocks, the default), ``zraw``
#: (one zlib stream, the previous default), ``png``; ``raw`` goes with ``encoding='raw'``.
MASK_ENCODINGS = ("rle", "zraw", "png")

RLE_MAGIC = b"GDRL"
RLE_VERSION = 1
#: Rows per block: a crop decodes at most 15 rows more than it keeps on each side.
DEFAULT_BLOCK_ROWS = 16
#: magic, version, dtype code, block rows, height, width, number of runs
_HEAD = struct.Struct("<4sBBHIII")
_DTYPES: Dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2")}
_CODES = {v: k for k, v in _DTYPES.items()}
_MAX_RUN = 0xFFFF


class RleHeader(NamedTuple):
    """The checked header of a run-length mask, and where its tables lie in the bytes."""

    dtype: np.dtype
    block_rows: int
    height: int
    width: int
    runs: int
    blocks: int
    lengths_at: int   # byte offset of the uint16 run lengths
    values_at: int    # byte offset of the run values


def is_rle(buf: BytesLike) -> bool:
    return bytes(buf[:4]) == RLE_MAGIC


def encode_rle(mask: np.ndarray, block_rows: int = DEFAULT_BLOCK_ROWS) -> bytes:
    """Encode a 2-D integer mask (ids 0..65535) as a run-length mask, in the smallest dtype
    that holds its ids (uint8, or uint16 when an id exceeds 255).

    >>> m = np.zeros((40, 30), np.uint8); m[5:20, 3:9] = 7
    >>> np.array_equal(decode_rle(encode_rle(m)), m)
    True
    """
    lengths, values, offsets = mask_runs(mask, block_rows)
    return rle_bytes(mask.shape, values.dtype, block_rows, lengths, values, offsets)


def mask_runs(mask: np.ndarray, block_rows: int = DEFAULT_BLOCK_ROWS):
    """``(lengths, values, offsets)`` of a mask: its runs in C order, cut at every block's
    first pixel and at 65535 pixels, and the first run of each block (then the run count).
    ``np.bincount(values, lengths)`` counts the pixels of each id without another pass. A
    uint8 mask's runs come from the optional C routine where it is built (the same arrays,
    read-only)."""
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError("a mask must be 2-D, got shape %s" % (m.shape,))
    h, w = m.shape
    if not (1 <= h <= 0xFFFFFFFF and 1 <= w <= 0xFFFFFFFF):
        raise ValueError("a run-length mask needs at least one row and one column, got %s"
                         % (m.shape,))
    if not 1 <= block_rows <= 0xFFFF:
        raise ValueError("block_rows must lie in 1..65535, got %r" % (block_rows,))
    if m.dtype.kind not in "iub":
        raise ValueError("mask ids must be integers, got %s" % m.dtype)
    runs = getattr(_ext, "runs", None)  # (an extension built before it has none)
    if m.dtype == np.uint8 and runs is not None:  # the same runs, in one pass
        lengths, values, offsets = runs(np.ascontiguousarray(m), w, block_rows)
        return (np.frombuffer(lengths, "<u2"), np.frombuffer(values, np.uint8),
                np.frombuffer(offsets, "<u4"))
    lo, hi = (int(m.min()), int(m.max()))
    if lo < 0 or hi > 65535:
        raise ValueError("mask ids must lie in 0..65535, got %d..%d" % (lo, hi))
    dt = np.dtype("<u2") if hi > 255 else np.dtype("u1")
    flat = np.ascontiguousarray(m, dtype=dt).reshape(-1)
    step = block_rows * w
    change = np.empty(flat.size, bool)
    change[0] = True
    np.not_equal(flat[1:], flat[:-1], out=change[1:])
    change[::step] = True  # a run never crosses a block's start
    starts = np.flatnonzero(change)
    lengths = np.diff(starts, append=flat.size)
    block_of = starts // step
    if lengths.size and lengths.max() > _MAX_RUN:  # cut long runs into pieces of 65535
        pieces = -(-lengths // _MAX_RUN)
        which = np.repeat(np.arange(lengths.size), pieces)
        first = np.cumsum(pieces) - pieces
        part = np.arange(which.size) - first[which]
        cut = np.minimum(lengths[which] - part * _MAX_RUN, _MAX_RUN)
        starts, lengths, block_of = starts[which] + part * _MAX_RUN, cut, block_of[which]
    nblocks = -(-h // block_rows)
    offsets = np.searchsorted(block_of, np.arange(nblocks + 1)).astype("<u4")
    return lengths.astype("<u2"), flat[starts], offsets


def rle_bytes(shape, dtype, block_rows: int, lengths, values, offsets) -> bytes:
    """The bytes of a run-length mask from its runs (:func:`mask_runs`)."""
    dt = np.dtype(dtype)
    dt = dt.newbyteorder("<") if dt.itemsize > 1 else dt
    return b"".join((_HEAD.pack(RLE_MAGIC, RLE_VERSION, _CODES[dt], block_rows, shape[0],
                                shape[1], lengths.size),
                     np.asarray(offsets, "<u4").tobytes(), np.asarray(lengths, "<u2").tobytes(),
                     np.asarray(values, dt).tobytes()))


def rle_header(buf: BytesLike, what: str = "mask", max_pixels: Optional[int] = None) -> RleHeader:
    """Read and check a run-length mask's header and sizes (nothing decoded)."""
    n = len(buf)
    if n < _HEAD.size:
        raise DecodeError("%s: run-length mask of %d bytes is shorter than its %d-byte header"
                          % (what, n, _HEAD.size))
    magic, version, code, brows, h, w, runs = _HEAD.unpack_from(buf, 0)
    if magic != RLE_MAGIC:
        raise DecodeError("%s: not a run-length mask (magic %r)" % (what, magic))
    if version != RLE_VERSION:
        raise DecodeError("%s: run-length mask version %d; this reader knows version %d "
                          "(upgrade gluon_data)" % (what, version, RLE_VERSION))
    if code not in _DTYPES:
        raise DecodeError("%s: run-length mask dtype code %d (1 = uint8, 2 = uint16)"
                          % (what, code))
    if not (brows and h and w):
        raise DecodeError("%s: run-length mask header says %dx%d pixels in blocks of %d rows"
                          % (what, w, h, brows))
    if max_pixels and h * w > max_pixels:
        raise DecodeError("%s: %dx%d pixels exceed the limit of %d (max_pixels)"
                          % (what, w, h, max_pixels))
    dt = _DTYPES[code]
    blocks = -(-h // brows)
    lengths_at = _HEAD.size + 4 * (blocks + 1)
    values_at = lengths_at + 2 * runs
    need = values_at + dt.itemsize * runs
    if n != need:
        raise DecodeError("%s: run-length mask of %dx%d pixels, %d blocks and %d runs takes "
                          "%d bytes, %d present (%s)" % (what, w, h, blocks, runs, need, n,
                                                         "cut short" if n < need else
                                                         "bytes after its end"))
    if runs < blocks or runs > h * w or h * w > runs * _MAX_RUN:
        raise DecodeError("%s: %d runs for %d blocks of %dx%d pixels (a run covers 1 to %d "
                          "pixels)" % (what, runs, blocks, w, h, _MAX_RUN))
    return RleHeader(dt, brows, h, w, runs, blocks, lengths_at, values_at)


class _Blocks(NamedTuple):
    """The checked run blocks of a run-length mask that rows ``y0:y1`` lie in."""

    header: RleHeader
    y0: int
    y1: int
    first_row: int   # the mask row of the first block's first row
    rows: int        # the rows of the blocks
    lengths: memoryview
    values: memoryview
    offsets: np.ndarray
    block_px: int
    last_px: int


def _blocks(buf: BytesLike, hd: RleHeader, what: str,
            rows: Optional[Tuple[int, int]]) -> _Blocks:
    """The blocks of ``rows = (y0, y1)`` (None: all) of the mask whose checked header is
    ``hd``, the block table and every block's runs checked (nothing the size of the mask
    allocated before that): :class:`DecodeError` where they do not fit. ``buf``: bytes, a
    bytearray or a byte memoryview."""
    h, w, brows = hd.height, hd.width, hd.block_rows
    y0, y1 = (0, h) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= y0 < y1 <= h:
        raise DecodeError("%s: rows %d:%d asked of a mask of %d rows" % (what, y0, y1, h))
    table = np.frombuffer(buf, "<u4", hd.blocks + 1, _HEAD.size)
    if table[0] != 0 or table[-1] != hd.runs or np.any(table[1:] <= table[:-1]):
        raise DecodeError("%s: run-length mask's block table is inconsistent (it must rise "
                          "from 0 to the %d runs, one run or more a block)" % (what, hd.runs))
    b0, b1 = y0 // brows, -(-y1 // brows)
    r0, r1 = int(table[b0]), int(table[b1])
    itemsize = hd.dtype.itemsize
    blocks = _Blocks(hd, y0, y1, b0 * brows, min(h, b1 * brows) - b0 * brows,
                     memoryview(buf)[hd.lengths_at + 2 * r0:hd.lengths_at + 2 * r1],
                     memoryview(buf)[hd.values_at + itemsize * r0:hd.values_at + itemsize * r1],
                     table[b0:b1 + 1] - table[b0], brows * w,
                     (min(h, b1 * brows) - (b1 - 1) * brows) * w)
    if _ext is not None and hasattr(_ext, "check"):  # (an extension built before it had one:
        try:                                         # numpy's check)
            _ext.check(blocks.lengths, blocks.offsets, blocks.block_px, blocks.last_px)
        except ValueError as e:
            raise DecodeError("%s: corrupt run-length mask (%s)" % (what, e)) from None
    else:
        _checked_lengths(blocks.lengths, blocks.offsets, blocks.block_px, blocks.last_px, what)
    return blocks


def decode_rle(buf: BytesLike, what: str = "mask", max_pixels: Optional[int] = None,
               rows: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """Decode a run-length mask to an HW uint8/uint16 array; with ``rows=(y0, y1)`` only
    the blocks those rows lie in are expanded, and rows ``y0:y1`` (full width) returned.

    Raises :class:`DecodeError` for bytes that are cut short, oversized or inconsistent (a
    block table that does not increase, runs that do not fill their block exactly), and
    for ``rows`` outside the mask.
    """
    mv = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    bl = _blocks(mv, rle_header(mv, what, max_pixels), what, rows)
    try:
        return _expanded(bl)[bl.y0 - bl.first_row:bl.y1 - bl.first_row]
    except ValueError as e:  # (checked already: kept for an extension's own checks)
        raise DecodeError("%s: corrupt run-length mask (%s)" % (what, e)) from None


def _expanded(bl: _Blocks) -> np.ndarray:
    """Every row of the (checked) blocks ``bl``: the C expansion, or numpy's."""
    if _ext is not None:
        out = np.empty((bl.rows, bl.header.width), bl.header.dtype)
        _ext.expand(bl.lengths, bl.values, bl.header.dtype.itemsize, bl.offsets, bl.block_px,
                    bl.last_px, out)
        return out
    lens = np.frombuffer(bl.lengths, "<u2")
    return np.repeat(np.frombuffer(bl.values, bl.header.dtype), lens).reshape(
        bl.rows, bl.header.width)


class RunBox:
    """A box ``(y0, x0, y1, x1)`` of a uint8 run-length mask, checked but not expanded
    (:func:`run_box`). ``numpy.asarray`` gives its pixels (the rows' blocks expanded, the
    columns cut); :meth:`sample` reads nearest samples of it through a table straight from
    the runs, each run one fill of the output, no pixel of the mask expanded."""

    def __init__(self, blocks: _Blocks, box: Tuple[int, int, int, int]):
        self._blocks, self.box = blocks, box
        self.shape = (box[2] - box[0], box[3] - box[1])
        self.dtype = blocks.header.dtype

    def __array__(self, dtype=None, copy=None) -> np.ndarray:  # (always a new array)
        bl, (y0, x0, y1, x1) = self._blocks, self.box
        box = _expanded(bl)[y0 - bl.first_row:y1 - bl.first_row, x0:x1]
        return box if dtype is None else box.astype(dtype)

    def sample(self, rows: np.ndarray, cols: np.ndarray, table: np.ndarray, out: np.ndarray,
               flip: bool = False) -> np.ndarray:
        """``out[j, x] = table[box[rows[j], cols[x]]]`` for the box's rows and columns given
        (each non-decreasing), with ``x`` mirrored (``vw - 1 - x``) under ``flip``, into the
        first ``len(rows)`` x ``len(cols)`` of ``out`` (a C-contiguous HxW array of
        ``table``'s dtype, 1, 2 or 4 bytes an entry); returns ``out``."""
        bl, (y0, x0), (h, w) = self._blocks, self.box[:2], self.shape
        if not sampled_by_runs(table, out):
            raise ValueError("out must be an aligned, C-contiguous 2-D array of the dtype of "
                             "table, 256 entries of 1, 2 or 4 bytes")
        if len(rows) and len(cols) and not (0 <= rows[0] and rows[-1] < h
                                            and 0 <= cols[0] and cols[-1] < w):
            raise ValueError("rows and cols must be non-decreasing and inside the box")
        _ext.sample(bl.lengths, bl.values, bl.offsets, bl.block_px, bl.last_px,
                    bl.header.width, bl.first_row, np.ascontiguousarray(rows + y0, np.int64),
                    np.ascontiguousarray(cols + x0, np.int64),
                    np.ascontiguousarray(table), table.dtype.itemsize, flip, out, out.shape[1])
        return out


def sampled_by_runs(table: np.ndarray, out: np.ndarray) -> bool:
    """Whether :meth:`RunBox.sample` writes through ``table`` into ``out``: 256 entries of 1,
    2 or 4 bytes, ``out`` an aligned, C-contiguous 2-D array of their dtype."""
    return (table.shape == (256,) and table.dtype.itemsize in (1, 2, 4)
            and out.dtype == table.dtype and out.ndim == 2 and out.flags.c_contiguous
            and out.flags.aligned)


def run_box(buf: BytesLike, *, box: Tuple[int, int, int, int], what: str = "mask",
            max_pixels: Optional[int] = None) -> Optional[RunBox]:
    """The :class:`RunBox` ``box = (y0, x0, y1, x1)`` of a uint8 run-length mask, its blocks
    checked; ``None`` for other masks or without the C routine (decode those). Raises
    :class:`DecodeError` as :func:`decode_rle` does, and for a box outside the mask. A
    buffer other than ``bytes`` is copied (the box must not change under it)."""
    if _ext is None or not hasattr(_ext, "sample") or not is_rle(buf):
        return None
    buf = buf if isinstance(buf, bytes) else bytes(buf)
    hd = rle_header(buf, what, max_pixels)
    if hd.dtype != np.uint8:
        return None
    y0, x0, y1, x1 = (int(v) for v in box)
    bl = _blocks(buf, hd, what, (y0, y1))
    if not 0 <= x0 < x1 <= bl.header.width:
        raise DecodeError("%s: columns %d:%d asked of a mask of %d columns"
                          % (what, x0, x1, bl.header.width))
    return RunBox(bl, (y0, x0, y1, x1))


def _checked_lengths(lengths, starts, block_px: int, last_px: int, what: str) -> np.ndarray:
    """The run lengths of the blocks decoded (``starts`` rise from 0, checked), once their
    runs are known to fill each block exactly (the C extension's ``check``, in numpy):
    nothing the size of the mask is allocated for runs that do not."""
    lens = np.frombuffer(lengths, "<u2")
    sums = np.add.reduceat(lens, starts[:-1].astype(np.intp), dtype=np.int64)
    want = np.full(sums.size, block_px, np.int64)
    want[-1] = last_px
    bad = np.flatnonzero(sums != want)
    if bad.size:
        b = int(bad[0])
        raise DecodeError("%s: corrupt run-length mask (block %d: runs add up to %d pixels, "
                          "%d expected)" % (what, b, sums[b], want[b]))
    return lens


def take_rows(m: np.ndarray, rows: Optional[Tuple[int, int]], what: str) -> np.ndarray:
    """Rows ``y0:y1`` of a decoded mask (all of it for ``None``); others are a DecodeError."""
    if rows is None:
        return m
    y0, y1 = int(rows[0]), int(rows[1])
    if not 0 <= y0 < y1 <= m.shape[0]:
        raise DecodeError("%s: rows %d:%d asked of a mask of %d rows" % (what, y0, y1,
                                                                         m.shape[0]))
    return m[y0:y1]


def mask_size(buf: BytesLike, what: str = "mask") -> Optional[Tuple[int, int]]:
    """``(height, width)`` of stored mask bytes from their header alone (run-length, PNG or
    raw); ``None`` when the header is not one of those (``decode_mask`` then says why)."""
    if is_rle(buf):
        hd = rle_header(buf, what)
        return hd.height, hd.width
    if is_raw(buf):
        shape = raw_shape(buf)
        return None if shape is None or len(shape) < 2 else (shape[0], shape[1])
    return image_size(buf)
