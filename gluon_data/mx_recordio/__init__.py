"""``mxnet.recordio`` without MXNet: the same classes and functions, on numpy and OpenCV only.

Change one import and code written for ``mxnet.recordio`` (InsightFace's ``MXFaceDataset``,
im2rec-style scripts, your own loaders) runs on any Python with numpy 1 or 2, with or without
MXNet installed:

>>> from gluon_data import mx_recordio as recordio   # was: from mxnet import recordio
>>> record = recordio.MXIndexedRecordIO("train.idx", "train.rec", "r")
>>> header, img = recordio.unpack_img(record.read_idx(record.keys[0]))
>>> img.dtype, img.ndim
(dtype('uint8'), 3)
>>> record.close()

What it shares with ``mxnet.recordio`` 1.9.1: names, signatures, defaults and results.
:class:`MXRecordIO` and :class:`MXIndexedRecordIO` write files byte for byte like stock's
(dmlc-core framing, split records around the magic word, 4-byte padding, the ``key<TAB>offset``
index) and read stock's files identically; :func:`pack`, :func:`unpack`, :func:`pack_img` and
:func:`unpack_img` produce and accept the same bytes. The framing is
:func:`gluon_data.format.codec.frame` / :func:`~gluon_data.format.codec.unframe`, the index
parser :mod:`gluon_data.format.recindex`'s. Keys are any Python ints, written as ``str(key)``
and read back exactly, also beyond 64 bits (the int64 readers of the rest of the package,
:class:`~gluon_data.stores.recordio.RecordFile` and the ``.gdx``, refuse such an index with a
:class:`~gluon_data.errors.FormatError` naming the line; none clamps a key). A label is
stored as stock stores it: float32, ``inf`` beyond its range (``pack(IRHeader(0, 1e39, 0,
0), ...)``).

Where it differs, on purpose:

* Readers are safe to share. Every read is an ``os.pread`` at the record's offset on a
  descriptor opened in the calling process, so ``read_idx`` from many threads at once returns
  the right records, and a reader inherited through ``fork`` (or unpickled in a worker) reads
  correctly there, without the shared file position of stock's ``seek`` + ``read``.
  ``read()`` works in a forked child too (stock raises ``RuntimeError``); writing from a
  process other than the one that opened the writer still raises it.
* ``read_idx`` always returns its record. (Stock returns ``None`` for every ``read_idx`` once a
  sequential ``read()`` has reached the end of the file.)
* Bad input raises a typed error naming the file, the key and the offset, never garbage nor
  ``None``: :class:`~gluon_data.errors.CorruptRecordError` (a ``ValueError``) for a damaged or
  truncated ``.rec`` or an index entry that points past the data or inside a record,
  :class:`~gluon_data.errors.FormatError` for a bad ``.idx`` line, :class:`MissingKeyError` (a
  ``KeyError``, as stock raises) for an unknown key, :class:`~gluon_data.errors.DecodeError` where
  ``unpack_img`` would return ``None`` or a truncated image, and a payload whose IRHeader
  carries gluon_data's CRC-32 (in ``id2``) is checked by :func:`unpack`.
* ``tell()`` also works on readers (the position the next ``read()`` reads from), and on
  :class:`MXRecordIO` (stock has it on the indexed class only, for writers).
* Pickling a reader leaves it open and usable (stock closes it); the copy reopens the file, as
  stock's does. An open writer refuses to be pickled: stock's copy would reopen the file for
  writing and truncate it.
* ``uri`` is the path as a ``str`` (stock: a ``ctypes.c_char_p``); there is no ``handle``.
"""
from __future__ import annotations

import numbers
from collections import namedtuple
from typing import Any, List, Sequence, Tuple, cast

import cv2
import numpy as np

from ..errors import DecodeError
from ..format import codec
from ..format.headers import BytesLike, JPEG_SOI
from .indexed import MXIndexedRecordIO
from .sequential import MissingKeyError, MXRecordIO, as_bytes

__all__ = ["MXRecordIO", "MXIndexedRecordIO", "IRHeader", "pack", "unpack", "pack_img",
           "unpack_img", "MissingKeyError"]

_IR_FORMAT = codec.IR_HEADER.format
_IR_SIZE = codec.IR_SIZE


# stock's type name, kept (reprs and docs say HEADER as stock's do)
IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])  # type: ignore[name-match]
"""The header of an image record (stock's ``IRHeader``, a namedtuple named ``HEADER``).

Parameters
----------
flag : int
    0 for a scalar label; the label vector's length otherwise (set by :func:`pack`).
label : float or numpy.ndarray
    The label: a number, or a 1-D float32 array.
id : int
    Usually the record's unique id.
id2 : int
    Higher bits of the id (0 in most cases; gluon_data's own records keep a CRC-32 here).
"""


def pack(header: Sequence[Any], s: BytesLike) -> bytes:
    """Packs a header and a byte string into an image record, as ``mx.recordio.pack``.

    Parameters
    ----------
    header : IRHeader
        ``header.label`` is a number (``flag`` becomes 0) or an array (``flag`` becomes its
        size and the float32 values follow the header). Labels are stored as float32,
        rounded as stock rounds them: a magnitude beyond float32's range becomes ``inf``
        (``-inf``), NaN stays NaN; an integer beyond a float64's range raises
        ``OverflowError``, as stock's does.
    s : bytes
        The payload, usually encoded image bytes.

    Returns
    -------
    bytes
        The record.

    Examples
    --------
    >>> len(pack(IRHeader(0, 3, 7, 0), b"jpg"))          # 24-byte header, payload
    27
    >>> len(pack(IRHeader(0, [1, 2], 7, 0), b"jpg"))     # header, 2 float32 labels, payload
    35
    >>> unpack(pack(IRHeader(0, 1e39, 7, 0), b"jpg"))[0].label  # beyond float32: inf, as stock
    inf
    """
    header = IRHeader(*header)
    s = as_bytes(s, "pack()")
    if isinstance(header.label, numbers.Number):
        with np.errstate(over="ignore"):  # as stock's native struct 'f': 1e39 -> inf
            number = float(cast(float, header.label))
            header = header._replace(flag=0, label=float(np.float32(number)))
    else:
        with np.errstate(over="ignore"):
            label = np.asarray(header.label, dtype="<f4")
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + s
    return codec.IR_HEADER.pack(*header) + s


def unpack(s: BytesLike) -> Tuple[IRHeader, bytes]:
    """Splits an image record into its header and payload, as ``mx.recordio.unpack``.

    Parameters
    ----------
    s : bytes
        A record from :meth:`MXRecordIO.read` or :meth:`MXIndexedRecordIO.read_idx`.

    Returns
    -------
    header : IRHeader
        ``label`` is a float32 array of ``flag`` values when ``flag > 0``, else a float.
    s : bytes
        The payload after the header (and label vector).

    Raises
    ------
    gluon_data.errors.CorruptRecordError
        ``s`` is shorter than its header and label vector, or carries gluon_data's CRC-32 and
        does not match it.

    Examples
    --------
    >>> unpack(pack(IRHeader(0, 3, 7, 0), b"jpg"))
    (HEADER(flag=0, label=3.0, id=7, id2=0), b'jpg')
    >>> unpack(pack(IRHeader(0, [1, 2], 7, 0), b"jpg"))[0].label
    array([1., 2.], dtype=float32)
    """
    rec = codec.unpack(s, segmentation=False, verify=True)
    return IRHeader(rec.flag, rec.label, rec.id, rec.id2), rec.image


def _check_image_bytes(buf: bytes) -> None:
    """Bytes OpenCV would decode into garbage (or ``None``) without a word."""
    if not buf:
        raise DecodeError("empty image data")
    if buf[:2] == JPEG_SOI:
        eoi = buf.rfind(b"\xff\xd9")
        if eoi < 0 or buf.find(b"\xff\xda", eoi) >= 0:
            raise DecodeError("truncated JPEG (%d bytes, no end-of-image marker after the last "
                              "scan)" % len(buf))
    elif buf[:8] == codec.PNG_SIGNATURE and b"IEND" not in buf[-16:]:
        raise DecodeError("truncated PNG (%d bytes, no IEND chunk at the end)" % len(buf))


def unpack_img(s: BytesLike, iscolor: int = -1) -> Tuple[IRHeader, np.ndarray]:
    """Unpacks an image record into its header and the decoded image, as
    ``mx.recordio.unpack_img``.

    Parameters
    ----------
    s : bytes
        A record.
    iscolor : int
        ``cv2.imdecode``'s flag: -1 as stored, 0 grey, 1 colour (BGR).

    Returns
    -------
    header : IRHeader
    img : numpy.ndarray
        The image, as ``cv2.imdecode`` returns it (BGR channel order).

    Raises
    ------
    gluon_data.errors.DecodeError
        The payload is empty, a truncated JPEG or PNG, or not an image (stock returns
        ``None`` or a partly grey image).
    """
    header, s = unpack(s)
    _check_image_bytes(s)
    img = cv2.imdecode(np.frombuffer(s, dtype=np.uint8), iscolor)
    if img is None:
        raise DecodeError("%d bytes (starting %r) are not an image OpenCV can decode"
                          % (len(s), s[:8]))
    return header, img


def pack_img(header: Sequence[Any], img: np.ndarray, quality: int = 95,
             img_fmt: str = ".jpg") -> bytes:
    """Encodes an image with OpenCV and packs it into a record, as ``mx.recordio.pack_img``.

    Parameters
    ----------
    header : IRHeader
    img : numpy.ndarray
        The image (BGR, as OpenCV reads it).
    quality : int
        JPEG quality (1-100) or PNG compression (0-9).
    img_fmt : str
        ``'.jpg'``/``'.jpeg'``, ``'.png'`` or another extension OpenCV encodes.

    Returns
    -------
    bytes
        The record.

    Examples
    --------
    >>> img = np.zeros((4, 4, 3), np.uint8)
    >>> header, out = unpack_img(pack_img(IRHeader(0, 1, 0, 0), img, img_fmt=".png"))
    >>> out.shape, header.label
    ((4, 4, 3), 1.0)
    """
    encode_params: List[int] = []  # (OpenCV's default: none)
    if img_fmt.upper() in (".JPG", ".JPEG"):
        encode_params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif img_fmt.upper() == ".PNG":
        encode_params = [cv2.IMWRITE_PNG_COMPRESSION, quality]
    ret, buf = cv2.imencode(img_fmt, img, encode_params)
    if not ret:
        raise ValueError("failed to encode image as %s" % img_fmt)
    return pack(header, buf.tobytes())
