"""Record codec: bytes <-> samples, with no I/O.

Three layers, each documented byte for byte in ``FORMAT.md``:

* **Framing** (:func:`frame`, :func:`unframe`): MXNet / dmlc-core RecordIO framing of one
  payload into the ``.rec`` stream, identical to what ``mx.recordio.MXRecordIO.write`` emits.
* **Payloads** (:func:`pack_classification`, :func:`pack_segmentation`, :func:`unpack`):
  the MXNet ``IRHeader`` (``<IfQQ``) followed by the image bytes, exactly as
  ``mx.recordio.pack`` writes them; segmentation payloads append the mask and a trailer.
  ``id2`` carries a CRC-32 so that corruption is detected instead of decoded.
* **Images** (:func:`decode_image`, :func:`decode_mask`, :func:`encode_mask`): structural
  checks and a pixel cap *before* decoding, one :class:`DecodeError` for every kind of bad
  image bytes. Run-length masks live in :mod:`.masks`, raw arrays in :mod:`.rawarray`; both
  are read here.
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from ..errors import CorruptRecordError, DecodeError, FormatError
from .headers import JPEG_SOI, BytesLike
from .headers import PNG_SIGNATURE, JpegFrame, image_size, jpeg_frame  # noqa: F401  (as before)
from .masks import MASK_ENCODINGS, decode_rle, is_rle, mask_size, take_rows
from .rawarray import (RAW_HEAD as _RAW_HEAD, RAW_MAGIC, RAWZ_MAGIC,  # noqa: F401  (as before)
                       decode_raw as _decode_raw,
                       encode_raw, is_raw)

__all__ = [
    "RECORDIO_MAGIC", "MAX_RECORD_BYTES", "DEFAULT_MAX_PIXELS",
    "frame", "unframe", "Record",
    "pack_classification", "pack_segmentation", "unpack", "record_checksum",
    "JpegFrame", "jpeg_frame", "image_size", "decode_image", "decode_mask", "encode_mask",
    "encode_raw", "is_raw", "mask_size", "MASK_ENCODINGS", "FRAME_HEADER", "LENGTH_MASK",
    "IR_HEADER", "IR_SIZE", "has_fast_jpeg",
]

# --------------------------------------------------------------------------- framing
RECORDIO_MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", RECORDIO_MAGIC)
#: The 8-byte head of every RecordIO frame: ``(magic, lrec)``, where ``lrec`` holds the
#: continuation flag in its top 3 bits and the length (``lrec & LENGTH_MASK``) below them.
FRAME_HEADER = struct.Struct("<II")
#: dmlc-core refuses records of 2**29 bytes or more (the length field has 29 bits).
MAX_RECORD_BYTES = (1 << 29) - 1
#: The length bits of a frame's ``lrec``.
LENGTH_MASK = (1 << 29) - 1


def frame(payload: bytes) -> List[bytes]:
    """Frame one payload as dmlc-core's ``RecordIOWriter::WriteRecord`` does.

    Returns the chunks to write, in order. A payload containing the magic word at a
    4-byte aligned offset is split there into parts flagged 1 (first), 2 (middle) and
    3 (last); the magic word itself is dropped and re-inserted by the reader.

    >>> b"".join(frame(b"abc")).hex()   # magic, length 3, 'abc', one byte of padding
    '0a23d7ce0300000061626300'
    """
    n = len(payload)
    if n > MAX_RECORD_BYTES:
        raise FormatError("record of %d bytes exceeds RecordIO's limit of %d bytes (2**29 - 1)"
                          % (n, MAX_RECORD_BYTES))
    payload = bytes(payload)
    lower = n & ~3
    hits: Sequence[int] = ()
    if lower and _MAGIC_BYTES in payload:
        words = np.frombuffer(payload, dtype="<u4", count=lower // 4)
        hits = (np.flatnonzero(words == RECORDIO_MAGIC) * 4).tolist()
    chunks = []
    start = 0
    for pos in hits:
        flag = 1 if start == 0 else 2
        chunks.append(FRAME_HEADER.pack(RECORDIO_MAGIC, (flag << 29) | (pos - start)))
        if pos != start:
            chunks.append(payload[start:pos])
        start = pos + 4
    flag = 3 if start != 0 else 0
    chunks.append(FRAME_HEADER.pack(RECORDIO_MAGIC, (flag << 29) | (n - start)))
    if n != start:
        chunks.append(payload[start:])
    pad = (-n) % 4
    if pad:
        chunks.append(b"\0" * pad)
    return chunks


def unframe(buf: BytesLike, pos: int = 0, *, path: Optional[str] = None, key: Any = None,
            base_offset: int = 0, copy: bool = True) -> Tuple[bytes, int]:
    """Read one framed record from ``buf`` starting at ``pos``.

    Returns ``(payload, end)`` where ``end`` is the position after the record's padding.
    With ``copy=False`` a single-part payload is a ``memoryview`` into ``buf``.
    Raises :class:`CorruptRecordError` (naming ``path``, ``key`` and the absolute offset
    ``base_offset + pos``) on a bad magic word, an impossible continuation flag or
    truncated data.
    """
    mv = memoryview(buf)
    size = len(mv)
    if pos + 8 <= size:  # fast path: a whole single-part record
        magic, lrec = FRAME_HEADER.unpack_from(mv, pos)
        length = lrec & LENGTH_MASK
        end = pos + 8 + length
        if magic == RECORDIO_MAGIC and lrec >> 29 == 0 and end <= size:
            payload = mv[pos + 8:end]
            return (bytes(payload) if copy else payload), min(end + (-length) % 4, size)
    parts: List[Union[bytes, memoryview]] = []
    first = True
    while True:
        where = base_offset + pos
        if pos + 8 > size:
            raise CorruptRecordError(
                "truncated record header: %d bytes left, 8 needed (file cut short?)"
                % max(size - pos, 0), path, key, where)
        magic, lrec = FRAME_HEADER.unpack_from(mv, pos)
        if magic != RECORDIO_MAGIC:
            raise CorruptRecordError(
                "bad magic 0x%08x (expected 0x%08x): %s" % (
                    magic, RECORDIO_MAGIC,
                    "the index points into the middle of a record or the file is damaged"
                    if key is not None else "this is not RecordIO" if where == 0 else
                    "the file is damaged here"),
                path, key, where)
        cflag, length = lrec >> 29, lrec & LENGTH_MASK
        if cflag > 3 or (first and cflag not in (0, 1)) or (not first and cflag not in (2, 3)):
            raise CorruptRecordError(
                "invalid continuation flag %d %s" % (cflag, "at record start" if first
                                                     else "inside a multi-part record"),
                path, key, where)
        end = pos + 8 + length
        if end > size:
            raise CorruptRecordError(
                "truncated record: %d payload bytes announced, %d present"
                % (length, size - pos - 8), path, key, where)
        parts.append(mv[pos + 8:end])
        pos = end + ((-length) % 4)
        if cflag in (0, 3):
            break
        parts.append(_MAGIC_BYTES)
        first = False
    if len(parts) == 1:
        return (bytes(parts[0]) if copy else parts[0]), min(pos, size)
    return b"".join(parts), min(pos, size)


# --------------------------------------------------------------------------- payloads
#: MXNet's ``IRHeader`` as packed before a payload: ``(flag, label, id, id2)``.
IR_HEADER = struct.Struct("<IfQQ")
IR_SIZE = IR_HEADER.size  # 24
#: High 32 bits of ``id2`` that mark "low 32 bits are a CRC-32 of this payload".
CHECKSUM_TAG = 0x47440001  # "GD", scheme 1
_SEG_TRAILER = struct.Struct("<QQ4s")
SEG_MAGIC = b"GDS1"


class Record(NamedTuple):
    """A decoded payload. ``image``/``mask`` are byte strings (encoded or raw arrays)."""

    flag: int
    label: Union[float, np.ndarray]
    id: int
    id2: int
    image: bytes
    mask: Optional[bytes]
    checksum: Optional[int]   # the stored CRC-32, or None for a stock (unchecksummed) record


def record_checksum(payload: BytesLike) -> int:
    """CRC-32 of a payload, skipping the 8 bytes of ``id2`` (bytes 16..23) that hold it."""
    mv = memoryview(payload)
    return zlib.crc32(mv[IR_SIZE:], zlib.crc32(mv[:16])) & 0xFFFFFFFF


def _seal(payload: bytearray, checksum: bool) -> bytes:
    if checksum:
        crc = record_checksum(payload)
        struct.pack_into("<Q", payload, 16, (CHECKSUM_TAG << 32) | crc)
    return bytes(payload)


def with_id(payload: BytesLike, id_: int) -> bytes:
    """The payload with its IRHeader ``id`` set to ``id_`` (and its checksum, if it carries
    one, recomputed)."""
    out = bytearray(payload)
    struct.pack_into("<Q", out, 8, int(id_))
    (id2,) = struct.unpack_from("<Q", out, 16)
    return _seal(out, (id2 >> 32) == CHECKSUM_TAG)


def _header_bytes(label, id_: int) -> bytes:
    """``IRHeader`` (+ label vector) exactly as ``mx.recordio.pack`` writes it."""
    if isinstance(label, (int, float, np.integer, np.floating)):
        return IR_HEADER.pack(0, float(label), id_, 0)
    vec = np.asarray(label, dtype="<f4").ravel()
    if vec.size == 0:
        raise ValueError("an empty label vector cannot be stored: use a number")
    return IR_HEADER.pack(vec.size, 0.0, id_, 0) + vec.tobytes()


def pack_classification(label: Union[float, Sequence[float]], image: bytes, id: int = 0,
                        checksum: bool = True) -> bytes:
    """Payload of a classification record: what ``mx.recordio.pack`` writes.

    ``label`` is a number or a 1-D vector (``flag`` then holds its length and the
    float32 values follow the header). With ``checksum`` (the default), ``id2`` holds
    :data:`CHECKSUM_TAG` and a CRC-32; stock readers ignore ``id2``.

    >>> from gluon_data import mx_recordio as recordio   # mxnet.recordio, byte for byte
    >>> p = pack_classification(3, b"jpegbytes", id=7, checksum=False)
    >>> p == recordio.pack(recordio.IRHeader(0, 3, 7, 0), b"jpegbytes")
    True
    """
    return _seal(bytearray(_header_bytes(label, id) + bytes(image)), checksum)


def pack_segmentation(image: bytes, mask: bytes, id: int = 0, checksum: bool = True) -> bytes:
    """Payload of a segmentation record: header, image bytes, mask bytes, trailer.

    The image bytes follow the header directly, so ``mx.recordio.unpack_img`` still
    decodes the image. The trailer ``<QQ4s`` stores the exact image and mask lengths and
    the magic ``b"GDS1"``.
    """
    image, mask = bytes(image), bytes(mask)
    body = IR_HEADER.pack(0, 0.0, id, 0) + image + mask + _SEG_TRAILER.pack(len(image), len(mask),
                                                                     SEG_MAGIC)
    return _seal(bytearray(body), checksum)


def unpack(payload: BytesLike, *, segmentation: Optional[bool] = None, verify: bool = True,
           path: Optional[str] = None, key: Any = None,
           offset: Optional[int] = None) -> Record:
    """Split a payload into header fields, image bytes and (for segmentation) mask bytes.

    ``segmentation=None`` detects the kind from the trailer. With ``verify``, a payload
    whose ``id2`` carries a checksum is checked and :class:`CorruptRecordError` raised on
    mismatch; stock payloads (``id2`` without the tag) pass unchecked.
    """
    mv = memoryview(payload)
    n = len(mv)
    if n < IR_SIZE:
        raise CorruptRecordError("payload of %d bytes is shorter than the %d-byte IRHeader"
                                 % (n, IR_SIZE), path, key, offset)
    flag, label, id_, id2 = IR_HEADER.unpack_from(mv, 0)
    crc = None
    if (id2 >> 32) == CHECKSUM_TAG:
        crc = id2 & 0xFFFFFFFF
        if verify and record_checksum(mv) != crc:
            raise CorruptRecordError(
                "checksum mismatch (stored crc32 %08x, computed %08x): the record is damaged "
                "(gluon-data verify lists every damaged record; restore the dataset or convert "
                "it again, or index a .rec's intact records with gluon-data salvage)"
                % (crc, record_checksum(mv)), path, key, offset)
    start = IR_SIZE
    if flag > 0:
        start += 4 * flag
        if start > n:
            raise CorruptRecordError("label vector of %d floats runs past the %d-byte payload"
                                     % (flag, n), path, key, offset)
        label = np.frombuffer(mv[IR_SIZE:start], dtype="<f4").astype(np.float32)
    has_trailer = n - start >= _SEG_TRAILER.size and bytes(mv[n - 4:]) == SEG_MAGIC
    if segmentation is None:
        segmentation = has_trailer
    if not segmentation:
        return Record(flag, label, id_, id2, bytes(mv[start:]), None, crc)
    if not has_trailer:
        raise FormatError("not a segmentation record: trailer magic %r missing (is this a "
                          "classification .rec?)" % SEG_MAGIC, path, key, offset)
    ilen, mlen, _ = _SEG_TRAILER.unpack_from(mv, n - _SEG_TRAILER.size)
    if start + ilen + mlen + _SEG_TRAILER.size != n:
        raise CorruptRecordError(
            "segmentation trailer says image %d + mask %d bytes, payload holds %d"
            % (ilen, mlen, n - start - _SEG_TRAILER.size), path, key, offset)
    return Record(flag, label, id_, id2, bytes(mv[start:start + ilen]),
                  bytes(mv[start + ilen:start + ilen + mlen]), crc)


# --------------------------------------------------------------------------- images
#: Images larger than this many pixels are refused before decoding (a 0.4 MB PNG can
#: otherwise claim 20000x20000 pixels and cost gigabytes). Override per dataset.
DEFAULT_MAX_PIXELS = 1 << 27
def _header_size(buf) -> Optional[Tuple[int, int]]:
    """``(height, width)`` of another format from Pillow's header parser (it reads the
    header only), so the pixel cap applies before OpenCV allocates; ``None`` if unknown."""
    import io
    import warnings
    from PIL import Image
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(bytes(buf))) as im:
                w, h = im.size
        return h, w
    except Exception:  # not an image Pillow knows: OpenCV reports it
        return None


try:  # the JPEG decoder of record (see _decode_jpeg_strict); a declared dependency
    import simplejpeg as sj
except ImportError:  # pragma: no cover - a broken install; OpenCV then decodes every JPEG
    sj = None


def has_fast_jpeg() -> bool:
    """Whether simplejpeg (libjpeg-turbo, the JPEG decoder of record) is installed; without it
    OpenCV decodes every JPEG."""
    return sj is not None


#: libjpeg-turbo's words for a JPEG that is valid but of a variant it does not decode (as
#: opposed to corrupt data): "Unsupported JPEG process", "Unsupported color conversion
#: request", TurboJPEG's "Could not determine subsampling level".
_UNSUPPORTED = ("Unsupported", "subsampling level")


def _decode_jpeg_strict(buf, flag: int, what: str):
    """Strict JPEG decode (RGB or grey), or ``None`` without simplejpeg. Like
    ``mx.image.imdecode`` (whose OpenCV predates EXIF support), EXIF orientation is ignored.

    The **decoder of record**: simplejpeg's libjpeg-turbo (TurboJPEG API, warnings as errors)
    alone decides which JPEGs are valid and what their pixels are, for conversion, ``verify
    --deep`` and every read. It ships inside simplejpeg's wheel, so it is the same library on
    every machine, whereas the optional region decoder links whatever libjpeg-turbo the
    system has; :mod:`gluon_data.format.decode` sends that one only the JPEG variants both read
    identically. What it accepts: baseline, extended, progressive and lossless (SOF3)
    Huffman JPEGs whose chroma layout TurboJPEG names (4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1,
    4:4:1, grey, CMYK); it refuses other sampling factors (3x1, 2x4, 1x3, mixed: "Could not
    determine subsampling level"), which stock libjpeg would read.
    """
    if sj is None:
        return None
    try:
        return sj.decode_jpeg(bytes(buf), colorspace="RGB" if flag == 1 else "GRAY",
                               strict=True)
    except ValueError as e:
        if any(word in str(e) for word in _UNSUPPORTED):  # valid, but a variant it lacks
            raise DecodeError("%s: unsupported JPEG variant, which the decoder of record "
                              "(libjpeg-turbo in simplejpeg) does not read (%s)"
                              % (what, e)) from None
        raise DecodeError("%s: corrupt JPEG data (%s)" % (what, e)) from None


def check_structure(buf: BytesLike, what: str, max_pixels: Optional[int]) -> None:
    """Reject bytes that decoders would silently 'repair' (truncation) or that are too big.

    A JPEG's end marker is only looked for when OpenCV will decode it: the strict
    libjpeg-turbo decoder reports truncation itself, without another pass over the bytes.
    """
    n = len(buf)
    if n == 0:
        raise DecodeError("%s: empty image data" % what)
    head = bytes(buf[:8])
    if head.startswith(JPEG_SOI) and sj is None:
        # Entropy-coded data never contains FF D9 (0xFF is always stuffed), so a JPEG cut
        # short has no end-of-image marker after its last start-of-scan.
        data = bytes(buf)
        sos = data.rfind(b"\xff\xda")
        if sos < 0 or data.rfind(b"\xff\xd9") < sos:
            raise DecodeError("%s: truncated or corrupt JPEG (no end-of-image marker after "
                              "the last scan)" % what)
    elif head.startswith(PNG_SIGNATURE):
        if b"IEND" not in bytes(buf[-16:]):
            raise DecodeError("%s: truncated PNG (no IEND chunk at the end)" % what)
    if max_pixels:
        hw = image_size(buf)
        if hw is None and head.startswith(JPEG_SOI) and sj is not None:
            try:  # the decoder's own header parser: what it reads is what it allocates
                hw = sj.decode_jpeg_header(bytes(buf))[:2]
            except ValueError as e:
                raise DecodeError("%s: corrupt JPEG header (%s)" % (what, e)) from None
        elif hw is None:
            hw = _header_size(buf)  # BMP, WebP, TIFF, ... (stock files may hold any)
        if hw is not None:
            check_pixels(hw, what, max_pixels)


def check_pixels(hw: Tuple[int, int], what: str, max_pixels: Optional[int]) -> None:
    """Refuse an image of ``hw = (height, width)`` over ``max_pixels`` (None or 0: no cap),
    before anything its size is allocated."""
    if max_pixels and hw[0] * hw[1] > max_pixels:
        raise DecodeError("%s: %dx%d pixels exceed the limit of %d (max_pixels); raise it "
                          "if this image is genuine" % (what, hw[1], hw[0], max_pixels))


def decode_image(buf: BytesLike, flag: int = 1, *, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS,
                 what: str = "image") -> np.ndarray:
    """Decode image bytes to an HWC uint8 numpy array, RGB for ``flag=1``, HW1 grey for 0.

    Same output as ``mx.image.imdecode(buf, flag)`` (EXIF orientation is ignored, as there).
    JPEGs are decoded strictly by the decoder of record, libjpeg-turbo in simplejpeg (see
    :func:`_decode_jpeg_strict`): corrupt entropy data is an error instead of a grey or
    smeared picture, and a JPEG it refuses is refused everywhere (conversion, ``verify
    --deep``, region decoding). Raw arrays (:func:`encode_raw`) are returned as stored.
    Raises :class:`DecodeError` for every kind of bad input.
    """
    if flag not in (0, 1):
        raise ValueError("flag must be 0 (grey) or 1 (colour), got %r" % (flag,))
    if is_raw(buf):
        img = _decode_raw(buf, what, max_pixels)
        if img.ndim == 2:
            img = img[:, :, None]
        if flag == 1 and img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        elif flag == 0 and img.shape[2] == 3:
            img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_RGB2GRAY)[:, :, None]
        return img
    check_structure(buf, what, max_pixels)
    if bytes(buf[:2]) == JPEG_SOI:
        jpeg = _decode_jpeg_strict(buf, flag, what)
        if jpeg is not None:
            return jpeg if jpeg.ndim == 3 else jpeg[:, :, None]
    arr = np.frombuffer(buf, dtype=np.uint8)
    pixels = cv2.imdecode(arr, (cv2.IMREAD_COLOR if flag == 1 else cv2.IMREAD_GRAYSCALE)
                          | cv2.IMREAD_IGNORE_ORIENTATION)  # as mx.image.imdecode does
    if pixels is None:
        raise DecodeError("%s: %d bytes are not a decodable image" % (what, len(arr)))
    if flag == 1:
        return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
    return pixels[:, :, None]


def decode_mask(buf: BytesLike, *, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS,
                what: str = "mask",
                rows: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """Decode mask bytes to an HW uint8/uint16 array: a run-length mask (``GDRL``, written
    by default), a single-channel index PNG, or a raw / compressed raw array.

    ``rows=(y0, y1)`` returns rows ``y0:y1`` (full width) only; a run-length mask then
    expands only the row blocks they lie in, the other kinds are decoded whole and cut.
    Rows outside the mask are a :class:`DecodeError` (the record's parts disagree).
    """
    if is_rle(buf):
        return decode_rle(buf, what, max_pixels, rows)
    if is_raw(buf):
        m = _decode_raw(buf, what, max_pixels)
        if m.ndim == 3 and m.shape[2] == 1:
            m = m[:, :, 0]
        if m.ndim != 2:
            raise DecodeError("%s: raw mask must be 2-D, got shape %s" % (what, m.shape))
        return take_rows(m, rows, what)
    if not bytes(buf[:8]).startswith(PNG_SIGNATURE):
        raise DecodeError("%s: masks are stored as run-length masks or PNG, these bytes are "
                          "neither" % what)
    check_structure(buf, what, max_pixels)
    png = cv2.imdecode(np.frombuffer(buf, dtype=np.uint8), cv2.IMREAD_UNCHANGED)
    if png is None:
        raise DecodeError("%s: %d bytes are not a decodable PNG" % (what, len(buf)))
    if png.ndim != 2:
        raise DecodeError("%s: expected a single-channel index PNG, got shape %s"
                          % (what, png.shape))
    return take_rows(png, rows, what)


def encode_mask(mask: np.ndarray, compression: int = 3) -> bytes:
    """Encode class indices losslessly as a single-channel PNG (16-bit when ids > 255)."""
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ValueError("a mask must be 2-D, got shape %s" % (m.shape,))
    if m.size and (m.min() < 0 or m.max() > 65535):
        raise ValueError("mask ids must lie in 0..65535, got %d..%d" % (m.min(), m.max()))
    m = m.astype(np.uint16 if m.size and m.max() > 255 else np.uint8, copy=False)
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(m),
                           [cv2.IMWRITE_PNG_COMPRESSION, compression])
    if not ok:
        raise ValueError("OpenCV failed to encode a mask of shape %s" % (m.shape,))
    return buf.tobytes()
