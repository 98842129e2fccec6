"""Image headers read without decoding: the PNG signature, the one JPEG frame-header parser
(:func:`jpeg_frame`) and :func:`image_size`. No image library is imported here."""
from __future__ import annotations

import struct
from typing import NamedTuple, Optional, Tuple, Union

__all__ = ["PNG_SIGNATURE", "JPEG_SOI", "BytesLike", "JpegFrame", "jpeg_frame", "image_size"]

#: What the codec reads bytes from: a record's payload or a view into a read buffer.
BytesLike = Union[bytes, bytearray, memoryview]

#: The first bytes of every PNG file.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The first bytes of every JPEG file: the start-of-image marker (SOI).
JPEG_SOI = b"\xff\xd8"
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class JpegFrame(NamedTuple):
    """What a JPEG's frame header (its first SOF marker segment) declares.

    ``marker`` is the SOF marker's second byte: ``0xC0`` baseline, ``0xC1`` extended,
    ``0xC2`` progressive, ``0xC3`` lossless (all Huffman-coded), ``0xC5``..``0xC7``
    hierarchical, ``0xC9``..``0xCF`` arithmetic-coded. ``sampling`` holds each component's
    ``(horizontal, vertical)`` sampling factors, in frame order (``()`` where the header is cut
    short after the size).
    """

    marker: int
    precision: int
    height: int
    width: int
    sampling: Tuple[Tuple[int, int], ...]


def jpeg_frame(buf: BytesLike) -> Optional[JpegFrame]:
    """The frame header of a JPEG, read without decoding.

    The segments are walked up to the frame header however far it lies (a large comment or
    EXIF segment must not hide it), stopping at the first scan. This is the one JPEG header
    parser: :func:`image_size` and the region decoder's choice of files
    (:func:`gluon_data.format.decode.region_exact`) both read it.

    Parameters
    ----------
    buf : bytes-like
        The file's bytes (only the header is read).

    Returns
    -------
    JpegFrame or None
        ``None`` for bytes that are not a JPEG, or a JPEG without a frame header before its
        first scan.

    Examples
    --------
    >>> import cv2, numpy as np
    >>> jpeg_frame(cv2.imencode(".jpg", np.zeros((5, 7, 3), np.uint8))[1].tobytes())
    JpegFrame(marker=192, precision=8, height=5, width=7, sampling=((2, 2), (1, 1), (1, 1)))
    """
    b = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    if bytes(b[:2]) != JPEG_SOI:
        return None
    i, n = 2, len(b)
    while i + 4 <= n:
        if b[i] != 0xFF:
            return None
        marker = b[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or a scan before any frame header
            return None
        seglen = (b[i + 2] << 8) | b[i + 3]
        if marker in _SOF_MARKERS:
            if i + 9 > n:
                return None
            precision, h, w = struct.unpack(">BHH", bytes(b[i + 4:i + 9]))
            ncomp = b[i + 9] if i + 10 <= n else 0
            factors = bytes(b[i + 10:i + 10 + 3 * ncomp])
            sampling = (tuple((f >> 4, f & 15) for f in factors[1::3])
                        if len(factors) == 3 * ncomp else ())
            return JpegFrame(marker, precision, h, w, sampling)
        i += 2 + seglen
    return None


def image_size(buf: BytesLike) -> Optional[Tuple[int, int]]:
    """``(height, width)`` read from a PNG or JPEG header without decoding, else ``None``
    (a JPEG's from :func:`jpeg_frame`)."""
    b = memoryview(buf).cast("B") if not isinstance(buf, (bytes, bytearray)) else buf
    if bytes(b[:8]) == PNG_SIGNATURE:
        if len(b) >= 24 and bytes(b[12:16]) == b"IHDR":
            w, h = struct.unpack(">II", bytes(b[16:24]))
            return h, w
        return None
    frame = jpeg_frame(b)
    return None if frame is None else (frame.height, frame.width)
