"""Raw arrays (FORMAT.md section 3): a uint8/uint16 array with its shape, as is (``GDRW``) or
as one zlib stream (``GDRZ``); images with ``--encoding raw``, masks with ``--mask-encoding
zraw``. Re-exported by :mod:`gluon_data.format.codec`."""
from __future__ import annotations

import struct
import zlib
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import DecodeError
from .headers import BytesLike

__all__ = ["RAW_MAGIC", "RAWZ_MAGIC", "RAW_HEAD", "encode_raw", "decode_raw", "is_raw", "raw_shape"]

RAW_MAGIC = b"GDRW"
#: A raw array whose data is one zlib stream (masks: 3x faster to decode than PNG, 7x faster
#: to encode, as small).
RAWZ_MAGIC = b"GDRZ"
RAW_HEAD = struct.Struct("<4sBB")
_RAW_DTYPES: Dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2")}
_RAW_CODES = {v: k for k, v in _RAW_DTYPES.items()}


def encode_raw(array: np.ndarray, compress: Optional[int] = None) -> bytes:
    """Store a uint8/uint16 array with its shape: ``GDRW``, dtype code, ndim, dims, data; or
    with ``compress=level``, ``GDRZ`` and the data as one zlib stream."""
    a = np.ascontiguousarray(array)
    dt = a.dtype.newbyteorder("<") if a.dtype.itemsize > 1 else a.dtype
    if dt not in _RAW_CODES:
        raise ValueError("raw encoding stores uint8 or uint16 arrays, not %s" % a.dtype)
    data = a.astype(dt, copy=False).tobytes()
    magic = RAW_MAGIC
    if compress is not None:
        magic, data = RAWZ_MAGIC, zlib.compress(data, compress)
    return (RAW_HEAD.pack(magic, _RAW_CODES[dt], a.ndim)
            + struct.pack("<%dI" % a.ndim, *a.shape) + data)


def is_raw(buf: BytesLike) -> bool:
    return bytes(buf[:4]) in (RAW_MAGIC, RAWZ_MAGIC)


def decode_raw(buf: BytesLike, what: str, max_pixels: Optional[int] = None) -> np.ndarray:
    mv = memoryview(buf)
    if len(mv) < RAW_HEAD.size:
        raise DecodeError("%s: truncated raw-array header" % what)
    magic, code, ndim = RAW_HEAD.unpack_from(mv, 0)
    if code not in _RAW_DTYPES or not 1 <= ndim <= 3:
        raise DecodeError("%s: invalid raw-array header (dtype code %d, ndim %d)"
                          % (what, code, ndim))
    off = RAW_HEAD.size + 4 * ndim
    if len(mv) < off:
        raise DecodeError("%s: truncated raw-array shape" % what)
    shape = struct.unpack_from("<%dI" % ndim, mv, RAW_HEAD.size)
    dt = _RAW_DTYPES[code]
    need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if ndim == 3 and not 1 <= shape[2] <= 4:
        raise DecodeError("%s: raw array of shape %s: images have 1 to 4 channels"
                          % (what, shape))
    if max_pixels and shape[0] * (shape[1] if ndim > 1 else 1) > max_pixels:
        raise DecodeError("%s: raw array of shape %s exceeds the limit of %d pixels "
                          "(max_pixels)" % (what, shape, max_pixels))
    if magic == RAWZ_MAGIC:
        inflate = zlib.decompressobj()
        try:  # never inflate past the size the header promises (a zip bomb stops there)
            data = inflate.decompress(mv[off:], need + 1)
        except zlib.error as e:
            raise DecodeError("%s: corrupt compressed array (%s)" % (what, e)) from None
        if len(data) != need or not inflate.eof or inflate.unused_data:
            raise DecodeError("%s: compressed array of shape %s holds %s bytes, %d expected"
                              % (what, shape, "more" if len(data) > need else
                                 "%d complete" % len(data) if inflate.eof else
                                 "%d (stream cut short)" % len(data), need))
        return np.frombuffer(data, dtype=dt).reshape(shape)
    if len(mv) - off != need:
        raise DecodeError("%s: raw array of shape %s needs %d bytes, %d present"
                          % (what, shape, need, len(mv) - off))
    return np.frombuffer(mv, dtype=dt, offset=off).reshape(shape)


def raw_shape(buf: BytesLike) -> Optional[Tuple[int, ...]]:
    """The shape a raw array's header states (``None``: not a whole header); not checked."""
    mv = memoryview(buf)
    if len(mv) < RAW_HEAD.size:
        return None
    ndim = mv[5]
    if not 1 <= ndim <= 3 or len(mv) < RAW_HEAD.size + 4 * ndim:
        return None
    return struct.unpack_from("<%dI" % ndim, mv, RAW_HEAD.size)
