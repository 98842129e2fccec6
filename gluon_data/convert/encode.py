"""Per-item work of a conversion: read, validate and encode one source item (or one record
of a legacy LMDB) into a record payload, in a worker process.

JPEGs are decoded strictly by the readers' own decoder (libjpeg-turbo in simplejpeg), whether
they are kept or re-encoded; other images, and JPEGs it does not read, by Pillow (a
truncated file is an error, not a grey half). Masks are turned into class indices (palette
PNGs through their indices, never their colours), sizes and class ids are checked, and what
is stored as it came is decoded once more by the reader's own decoder, so what converts
also reads. :func:`encode_job` and
:func:`~gluon_data.convert.engines.worker_init` are what the driver's worker pool runs
(found by this module's path).
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union, cast

import cv2
import numpy as np
from PIL import Image

from ..format import codec, masks
from ..format.headers import JPEG_SOI
from ..errors import DecodeError, GluonDataError, SourceError
from .sources import DEFAULT_MAX_FILE_BYTES, Item, read_regular

try:  # built by setup.py where a C compiler is present; OpenCV's histograms give the same sums
    from . import _moments  # type: ignore[attr-defined]  # C extension, no stub
except ImportError:  # pragma: no cover - depends on the install
    _moments = None

__all__ = ["EncodeOptions", "encode_item", "encode_legacy", "image_part", "mask_part", "encode_job",
           "encode_legacy_job"]

_PASSTHROUGH_FORMATS = ("JPEG", "PNG")


@dataclass(frozen=True)
class EncodeOptions:
    """How one item is validated and encoded (picklable, sent to worker processes)."""

    task: str
    encoding: str = "passthrough"
    quality: int = 95
    resize: int = 0
    num_classes: Optional[int] = None
    ignore_label: int = 255
    max_pixels: int = codec.DEFAULT_MAX_PIXELS
    checksum: bool = True
    mask_lut: Optional[Tuple[int, ...]] = None  # stored value -> class id (256 entries)
    #: "rle" (run-length row blocks: decodes 15-45x faster than PNG, a crop's rows alone),
    #: "zraw" (one zlib stream) or "png" (the old layout); masks are raw with encoding=raw
    mask_encoding: str = "rle"
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES



def _read_bytes(path: str, what: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> bytes:
    """A source file's bytes: regular files only, at most ``max_bytes`` (see
    :func:`~gluon_data.convert.sources.read_regular`)."""
    return read_regular(path, what, max_bytes)


def _check_pixels(data: bytes, path: str, what: str, max_pixels: int) -> None:
    hw = codec.image_size(data)
    if hw is not None and max_pixels and hw[0] * hw[1] > max_pixels:
        raise SourceError("%s of %dx%d pixels exceeds max_pixels=%d" % (what, hw[1], hw[0],
                                                                       max_pixels), path)


def _open_strict(data: bytes, path: str, what: str, max_pixels: int) -> Image.Image:
    _check_pixels(data, path, what, max_pixels)
    try:
        with warnings.catch_warnings():  # our own cap applies (above); PIL's warning is noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
        if max_pixels and im.size[0] * im.size[1] > max_pixels:
            raise SourceError("%s of %dx%d pixels exceeds max_pixels=%d"
                              % (what, im.size[0], im.size[1], max_pixels), path)
        im.load()  # strict: truncated data raises instead of decoding grey
    except SourceError:
        raise
    except Image.UnidentifiedImageError:  # (its message names the BytesIO, not the file)
        raise SourceError("%s is corrupt or not an image (its first bytes, %r, start no "
                          "format Pillow reads)" % (what, data[:8]), path) from None
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError...)
        raise SourceError("%s is corrupt or not an image (%s: %s)"
                          % (what, type(e).__name__, e), path) from None
    return im


def _decode_like_reader(data: bytes, path: str, max_pixels: int,
                        refuse: bool = True) -> Optional[np.ndarray]:
    """RGB pixels of a JPEG, decoded strictly by the decoder the datasets use (so what
    converts also reads), or ``None`` for other formats and for JPEGs that decoder does not
    support (CMYK, ...), which Pillow then decodes and the converter re-encodes. A JPEG it
    refuses as corrupt is a :class:`SourceError` (``refuse``) or ``None``: for an image to be
    re-encoded, Pillow then decides, as it did before this decoder was tried (the same
    pixels where both decode: libjpeg-turbo either way, the same settings)."""
    if data[:2] != JPEG_SOI or not codec.has_fast_jpeg():
        return None
    _check_pixels(data, path, "image", max_pixels)
    try:
        return codec.decode_image(data, 1, max_pixels=max_pixels)
    except DecodeError as e:
        if "nsupported" in e.reason or not refuse:
            return None
        raise SourceError("image is corrupt or not an image (%s)" % e.reason, path) from None


_WIDE_COLOUR = ("RGB", "RGBA", "RGBX", "RGBa", "LA", "La", "PA")


def _mask_reduced(data: bytes, im: Image.Image) -> bool:
    """Whether Pillow reduced a mask's samples to 8 bits on opening (16-bit colour or
    grey+alpha PNG and TIFF): its class ids would silently change."""
    if im.mode not in _WIDE_COLOUR:
        return False
    if data[:8] == codec.PNG_SIGNATURE and len(data) >= 26 and data[12:16] == b"IHDR":
        return data[24] > 8
    bits = getattr(im, "tag_v2", {}).get(258) if hasattr(im, "tag_v2") else None
    if isinstance(bits, (tuple, list)):
        return any(int(b) > 8 for b in bits)
    return isinstance(bits, int) and bits > 8


def _mask_indices(im: Image.Image, path: str,
                  data: bytes = b"") -> Tuple[np.ndarray, Optional[List[int]]]:
    """Class indices of a mask image and its palette (flat RGB list) if it has one.

    Every mode Pillow opens either keeps its stored values exactly (a 1-bit mask gives 0/1,
    16-bit masks stay 16-bit) or is refused with :class:`SourceError`: colour masks whose
    channels differ, float masks, and samples Pillow would narrow to 8 bits.
    """
    mode = im.mode
    if _mask_reduced(data, im):
        raise SourceError("mask is a 16-bit %s image, which would be read narrowed to 8 bits "
                          "(its class ids changed); save masks as single-channel (grey or "
                          "palette) PNG" % mode, path)
    if mode == "P":
        return np.asarray(im, dtype=np.uint8), im.getpalette()
    if mode == "PA":  # palette indices plus an alpha channel: the indices are the classes
        return np.ascontiguousarray(np.asarray(im)[..., 0], dtype=np.uint8), im.getpalette()
    if mode == "1":  # bilevel: 0/1 (Pillow's "L" view would turn 1 into 255, the ignore id)
        return np.asarray(im).astype(np.uint8), None
    if mode == "L":
        return np.asarray(im, dtype=np.uint8), None
    if mode == "I" or mode.startswith("I;16"):
        a = np.asarray(im)
        if a.dtype.kind not in "iu":
            raise SourceError("unsupported mask mode %s" % mode, path)
        if a.size and (int(a.min()) < 0 or int(a.max()) > 65535):
            raise SourceError("mask ids %d..%d are outside 0..65535" % (a.min(), a.max()), path)
        return a.astype(np.uint16), None
    if mode in _WIDE_COLOUR:
        a = np.asarray(im)
        chans = a[..., :1] if mode in ("LA", "La") else a[..., :3]
        if all(np.array_equal(chans[..., 0], chans[..., c]) for c in range(1, chans.shape[-1])):
            return np.ascontiguousarray(chans[..., 0]), None
        raise SourceError("mask is a colour (%s) image; masks must hold class indices "
                          "(single-channel or palette PNG)" % mode, path)
    raise SourceError("unsupported mask mode %s (float or colour-space data are not class "
                      "indices); use a single-channel or palette PNG" % mode, path)


def _reads_back(data: bytes, path: str, what: str, max_pixels: int,
                expect: Optional[np.ndarray], refuse: bool = True) -> Optional[np.ndarray]:
    """Decode stored bytes with the reader's own decoder (:mod:`gluon_data.format.codec`), so what
    converts also reads. A mask must give back exactly ``expect``. On refusal: raise
    :class:`SourceError` (``refuse``) or return ``None``."""
    try:
        if what == "mask":
            out = codec.decode_mask(data, max_pixels=max_pixels, what=what)
        else:
            out = codec.decode_image(data, 1, max_pixels=max_pixels, what=what)
    except DecodeError as e:
        if not refuse:
            return None
        raise SourceError("the dataset reader would refuse this %s: %s" % (what, e.reason),
                          path) from None
    if expect is not None and not (out.shape == expect.shape and np.array_equal(out, expect)):
        raise SourceError("the %s does not read back as written (shape %s, expected %s)"
                          % (what, out.shape, expect.shape), path)
    return out


def _resize_short(a: np.ndarray, size: int, interp: int, max_pixels: int = 0,
                  path: Optional[str] = None) -> np.ndarray:
    h, w = a.shape[:2]
    if h <= w:
        nh, nw = size, max(1, int(round(w * size / h)))
    else:
        nh, nw = max(1, int(round(h * size / w))), size
    if max_pixels and nh * nw > max_pixels:  # a 1x30000 strip resized to 500 is 7.5e9 pixels
        raise SourceError("resizing this %dx%d image to a short side of %d makes it %dx%d, "
                          "more than max_pixels=%d" % (w, h, size, nw, nh, max_pixels), path)
    return cv2.resize(a, (nw, nh), interpolation=interp)


def _encode_pixels(rgb: np.ndarray, fmt: str, quality: int) -> bytes:
    if fmt == "jpg":
        params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    else:
        params = [cv2.IMWRITE_PNG_COMPRESSION, 3]
    bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR) if rgb.ndim == 3 else rgb
    ok, buf = cv2.imencode("." + fmt, bgr, params)
    if not ok:
        raise ValueError("OpenCV could not encode an image as %s" % fmt)
    return buf.tobytes()


def encode_item(item: Item, record_id: int, opts: EncodeOptions):
    """Read, validate and encode one item into a record payload.

    Returns ``(payload, info)``; raises :class:`SourceError` naming the bad file.
    ``info`` holds the stored image size, the mask's palette and class pixel counts.
    """
    data = _read_bytes(item.image, "image", opts.max_file_bytes)
    info: dict = {}
    kept = opts.encoding == "passthrough" and not opts.resize
    rgb = _decode_like_reader(data, item.image, opts.max_pixels, refuse=kept)
    fmt: Optional[str]
    reencode: Union[bool, int]
    if rgb is not None:  # a JPEG kept as is, validated by the decoder that will read it,
        (h, w), fmt, reencode = rgb.shape[:2], "JPEG", not kept  # or its pixels re-encoded
    else:
        im = _open_strict(data, item.image, "image", opts.max_pixels)
        w, h = im.size
        fmt = im.format
        # (a pass-through JPEG gets here only when the reader's decoder cannot read it)
        reencode = (opts.encoding != "passthrough" or fmt not in _PASSTHROUGH_FORMATS
                    or opts.resize or fmt == "JPEG")
    if not reencode and fmt != "JPEG" and \
            _reads_back(data, item.image, "image", opts.max_pixels, None, refuse=False) is None:
        reencode = True  # e.g. bytes after a PNG's IEND: Pillow reads it, our reader refuses
    if reencode:
        if rgb is None:
            rgb = np.asarray(im.convert("RGB"))
        if opts.resize:
            rgb = _resize_short(rgb, opts.resize, cv2.INTER_AREA
                                if min(h, w) > opts.resize else cv2.INTER_LINEAR,
                                opts.max_pixels, item.image)
        data = image_part(rgb, opts, "jpg" if fmt == "JPEG" else "png")
    oh, ow = (cast(np.ndarray, rgb).shape[:2] if reencode else (h, w))  # set when reencoding
    info["hw"] = (oh, ow)
    _pixel_stats(rgb if rgb is not None else np.asarray(im.convert("RGB")), info)

    if opts.task == "classification":
        label = cast(Union[float, Sequence[float]], item.label)
        return codec.pack_classification(label, data, id=record_id,
                                         checksum=opts.checksum), info
    if item.mask is None:  # a split without masks (VOC test): the image alone
        return codec.pack_segmentation(data, b"", id=record_id, checksum=opts.checksum), info

    mdata = _read_bytes(item.mask, "mask", opts.max_file_bytes)
    if mdata[:2] == JPEG_SOI:
        raise SourceError("mask is a JPEG: lossy compression invents class ids at edges; "
                          "provide PNG masks", item.mask)
    mim = _open_strict(mdata, item.mask, "mask", opts.max_pixels)
    mask, palette = _mask_indices(mim, item.mask, mdata)
    if opts.mask_lut is not None:
        if mask.dtype != np.uint8:
            raise SourceError("this layout expects 8-bit masks, got %s" % mask.dtype, item.mask)
        mask = np.asarray(opts.mask_lut, dtype=np.uint8)[mask]
        palette = None  # the source's colours described the old ids
    if mask.shape != (h, w):
        raise SourceError("mask is %dx%d but its image %s is %dx%d"
                          % (mask.shape[1], mask.shape[0], item.image, w, h), item.mask)
    if (oh, ow) != (h, w):
        mask = cv2.resize(mask, (ow, oh), interpolation=cv2.INTER_NEAREST)
    mbytes = mask_part(mask, opts, item.mask, info)
    _reads_back(mbytes, item.mask, "mask", opts.max_pixels, mask)
    info["palette"] = palette
    return codec.pack_segmentation(data, mbytes, id=record_id, checksum=opts.checksum), info


_LEVELS = np.arange(256, dtype=np.float64)


def _pixel_stats(rgb: np.ndarray, info: dict) -> None:
    """Per-channel sum and sum of squares (for the dataset's mean and std), exact: for uint8
    images in one pass by the optional C routine (``gluon_data/convert/_moments.c``: 0.07 ms
    for a VOC photo) or from a histogram of each channel (OpenCV's float32 bins count
    exactly up to 2**24 pixels; 0.26 ms), else in float64."""
    c = rgb.shape[-1] if rgb.ndim == 3 else 1
    n = rgb.size // c
    if rgb.dtype == np.uint8 and _moments is not None and c <= 4:
        sums, squares = _moments.moments(np.ascontiguousarray(rgb), c)
        info["pix"] = (n, [float(v) for v in sums], [float(v) for v in squares])
        return
    if rgb.dtype == np.uint8 and n < (1 << 24):
        img = np.ascontiguousarray(rgb)
        hists = [cv2.calcHist([img], [k], None, [256], [0, 256]).ravel().astype(np.float64)
                 for k in range(c)]
        info["pix"] = (n, [float(h @ _LEVELS) for h in hists],
                       [float(h @ (_LEVELS * _LEVELS)) for h in hists])
        return
    flat = rgb.reshape(-1, c).astype(np.float64)
    info["pix"] = (flat.shape[0], flat.sum(0).tolist(), np.einsum("ij,ij->j", flat, flat).tolist())


def mask_part(mask: np.ndarray, opts: EncodeOptions, where: str, info: dict) -> bytes:
    """Check a mask's class ids against the declared classes, count its pixels per class
    into ``info["class_pixels"]``, and encode it as ``opts.mask_encoding`` asks (raw for
    ``encoding='raw'``). A run-length mask is counted from its runs: one pass over the
    pixels finds the runs, which are both the count and the stored bytes."""
    kind = "raw" if opts.encoding == "raw" else opts.mask_encoding
    if kind not in codec.MASK_ENCODINGS + ("raw",):
        raise ValueError("unknown mask_encoding %r; valid: %s"
                         % (kind, ", ".join(codec.MASK_ENCODINGS)))
    runs = None
    counts: Optional[np.ndarray]
    ids: np.ndarray
    if kind == "rle":
        runs = masks.mask_runs(mask)
        counts = np.bincount(runs[1], weights=runs[0]).astype(np.int64)
    elif mask.dtype == np.uint8 and mask.size < (1 << 24):  # float32 bins count exactly
        counts = cv2.calcHist([np.ascontiguousarray(mask)], [0], None, [256],
                              [0, 256]).ravel().astype(np.int64)
    else:
        counts = np.bincount(mask.ravel(), minlength=256) if mask.dtype == np.uint8 else None
    if counts is not None:
        ids = np.flatnonzero(counts)
        pix = counts[ids]
    else:
        ids, pix = np.unique(mask, return_counts=True)
    if opts.num_classes is not None:
        bad = [int(i) for i in ids if i >= opts.num_classes and i != opts.ignore_label]
        if bad:
            raise SourceError("mask holds class ids %s outside the %d declared classes "
                              "(0..%d, ignore %d)" % (bad, opts.num_classes, opts.num_classes - 1,
                                                      opts.ignore_label), where)
    info["class_pixels"] = {int(i): int(c) for i, c in zip(ids, pix)}
    if runs is not None:
        return masks.rle_bytes(mask.shape, runs[1].dtype, masks.DEFAULT_BLOCK_ROWS, *runs)
    if kind == "raw":
        return codec.encode_raw(mask)
    if kind == "png":
        return codec.encode_mask(mask)
    return codec.encode_raw(mask, compress=1)


def image_part(rgb: np.ndarray, opts: EncodeOptions, fmt_if_passthrough: str) -> bytes:
    """Encode decoded RGB pixels for storage as ``opts.encoding`` asks."""
    target = opts.encoding if opts.encoding != "passthrough" else fmt_if_passthrough
    if target == "raw":
        return codec.encode_raw(rgb)
    return _encode_pixels(rgb, target, opts.quality)


def encode_legacy(where: str, image, extra, record_id: int, opts: EncodeOptions,
                  raw_as: str):
    """Validate and encode one record of a legacy LMDB (:mod:`gluon_data.stores.legacy`): ``image``
    is encoded bytes (a Caffe image, validated strictly) or decoded pixels, ``extra`` the
    label (classification) or the mask; raw pixels are stored as ``raw_as`` under
    ``encoding='passthrough'``. Returns ``(payload, info)`` like :func:`encode_item`."""
    info: dict = {}
    if isinstance(image, SourceError):  # the reader could not parse this record
        raise image
    if isinstance(image, bytes):  # an encoded Caffe image: validate strictly
        im = _open_strict(image, where, "image", opts.max_pixels)
        info["hw"] = (im.size[1], im.size[0])
        _pixel_stats(np.asarray(im.convert("RGB")), info)
        keep = (opts.encoding == "passthrough" and im.format in _PASSTHROUGH_FORMATS
                and _reads_back(image, where, "image", opts.max_pixels, None,
                                refuse=False) is not None)
        data = image if keep else image_part(np.asarray(im.convert("RGB")), opts, "png")
    else:
        info["hw"] = image.shape[:2]
        _pixel_stats(image, info)
        data = image_part(image, opts, raw_as)
    if opts.task == "classification":
        return codec.pack_classification(extra, data, id=record_id), info
    return codec.pack_segmentation(data, mask_part(extra, opts, where, info),
                                   id=record_id), info


def encode_job(job, opts: EncodeOptions):
    pos, item = job
    record_id = item.key if item.key is not None else pos
    try:
        payload, info = encode_item(item, record_id, opts)
    except GluonDataError as e:
        return pos, None, None, (e.path or item.name, e.reason)
    if info.get("palette"):  # to the parent as one object, not 768 ints to pickle
        try:
            info["palette"] = bytes(info["palette"])
        except (TypeError, ValueError):  # not bytes-sized: as it is
            pass
    return pos, payload, info, None


def encode_legacy_job(job, opts: EncodeOptions, raw_as: str):
    """:func:`encode_job` for a legacy LMDB record ``(where, image, extra)``."""
    pos, (where, image, extra) = job
    try:
        payload, info = encode_legacy(where, image, extra, pos, opts, raw_as)
        return pos, payload, info, None
    except GluonDataError as e:
        return pos, None, None, (e.path or where, e.reason)
