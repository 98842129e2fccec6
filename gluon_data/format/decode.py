"""Region decoding: decode only the part of a JPEG that a crop keeps.

:func:`decode_region` returns exactly ``codec.decode_image(buf, flag)[y0:y1, x0:x1]``, pixel
for pixel, or raises the :class:`~gluon_data.errors.DecodeError` that call raises: whatever
the box, with or without the C extension, with region decoding on or off (with ``strict``,
the default; see "Bytes proven already" below for the other).

The full decode is the decoder of record (libjpeg-turbo in simplejpeg, the same library
on every machine: see :func:`gluon_data.format.codec.decode_image`). The optional C extension
``gluon_data.format._jpegregion`` (built at install when a C compiler and libjpeg-turbo's headers
are present) links the *system's* libjpeg-turbo, another version that accepts other files:
before 3.0 it refuses lossless (SOF3) JPEGs, and it reads sampling factors (3x1, 2x4,
mixed) that the decoder of record refuses. So the extension is given only the JPEGs both
read identically, decided from the frame header (:func:`region_exact`): baseline, extended
or progressive Huffman-coded, 8-bit, grey or three components in one of TurboJPEG's named
chroma layouts. For those it runs the inverse DCT, upsampling and colour conversion for
the box's rows and columns only. Every other JPEG, every other format, a box covering most
of the image (where the region decoder saves less than it costs), and
``GLUON_DATA_REGION_DECODE=0`` take the decoder of record on the whole image, cropped: the
same pixels or the same error either way.

Both paths are equally strict: the region decoder reads the whole entropy-coded stream
through the end-of-image marker and treats every libjpeg warning ("Corrupt JPEG data: ...")
as an error, so damage anywhere in the image, inside the box or outside it, and truncation
raise :class:`~gluon_data.errors.DecodeError`, as :func:`~gluon_data.format.codec.decode_image`
does. :func:`region_decoder` says which decoder is in use.

**Bytes proven already** (``strict=False``). Reading the rest of the stream costs as much as
entropy-decoding the rows below the box, most of a JPEG's decode time. A caller that holds
bytes already proven to decode strictly may skip it: the region decoder then stops after
the box's last row. Damage below the box goes unseen, and so may damage above it that
libjpeg would only have noticed further on, hence "proven": the datasets pass it for a
record whose checksum they verified, of a dataset whose metadata says ``"images_checked":
"strict"`` (FORMAT.md): its converter decoded every image it kept strictly, and encoded the
others itself, before sealing each record; the checksum says these are those bytes, barring
deliberate edits. For such bytes the pixels are the same either way.

**Scaled decoding (opt-in, not exact).** A crop that is shrunk 2x or more after decoding
(``train``'s random scale at Cityscapes sizes, a small ``RandomResizedCrop`` output) can be
decoded at 1/2, 1/4 or 1/8 of the size by libjpeg's DCT-domain scaling, which skips most of
the inverse DCT and upsampling work. Pass ``shrink_to=(h, w)``, the size the caller resizes
the box to, and set ``GLUON_DATA_DECODE_SCALED=1`` (read at each call, like
``GLUON_DATA_REGION_DECODE``): the largest factor that keeps the box at least ``(h, w)`` is
used and the result is the box already resampled to ``(h, w)`` (bilinear, pixel centres
mapped as ``cv2.resize`` maps them, so it stays aligned with a mask cut to the same box).
The pixels are not those of the exact path: the DCT reduction averages where a bilinear
resize samples. :func:`scaled_decoding` says whether it is on; the difference from the
exact path is measured by ``python benchmarks/bench_scaled.py`` and documented in
docs/performance.md. Exact stays the default.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import cv2
import numpy as np

from . import codec
from .headers import JPEG_SOI
from ..errors import DecodeError

try:  # the optional C extension (setup.py); absent: whole-image decodes, the same pixels
    from . import _jpegregion  # type: ignore[attr-defined]  # C extension, no stub
except ImportError:  # pragma: no cover - depends on the install
    _jpegregion = None

__all__ = ["decode_region", "region_decoding", "region_decoder", "region_exact",
           "scaled_decoding", "REGION_MAX_FRACTION"]

#: A box covering more than this fraction of the image is decoded whole: the region
#: decoder still Huffman-decodes every row, so above it the saving measured (0-20 %) was
#: within the benchmark machine's noise (``python benchmarks/bench_region.py``).
REGION_MAX_FRACTION = 0.6
_ENV = "GLUON_DATA_REGION_DECODE"
_SCALED_ENV = "GLUON_DATA_DECODE_SCALED"
#: libjpeg's DCT-domain scale factors 1/d tried, largest first.
_DENOMS = (8, 4, 2)
#: Frame types the region decoder is given: baseline, extended and progressive Huffman
#: (SOF0-SOF2). Lossless (SOF3), hierarchical and arithmetic-coded frames are not.
_REGION_SOF = frozenset((0xC0, 0xC1, 0xC2))
#: Luma sampling factors of the chroma layouts TurboJPEG names (4:4:4, 4:2:2, 4:2:0, 4:4:0,
#: 4:1:1, 4:4:1), written the standard way: both chroma components 1x1.
_REGION_LUMA = frozenset(((1, 1), (2, 1), (2, 2), (1, 2), (4, 1), (1, 4)))


def region_decoding() -> bool:
    """Whether JPEG boxes are decoded without the rest of the image: the extension is built,
    the decoder of record (simplejpeg) is installed, and ``GLUON_DATA_REGION_DECODE`` is not
    ``0`` (read at each call, so a DataLoader worker follows the environment it was started
    with)."""
    return (_jpegregion is not None and codec.sj is not None
            and os.environ.get(_ENV, "1").strip() != "0")


def scaled_decoding() -> bool:
    """Whether :func:`decode_region` may decode a box that is shrunk 2x or more at a DCT
    scale (1/2, 1/4, 1/8) when its caller passes ``shrink_to``: region decoding is on
    (:func:`region_decoding`) and ``GLUON_DATA_DECODE_SCALED`` is ``1`` (read at each call;
    off by default: the pixels differ from the exact path's)."""
    return region_decoding() and os.environ.get(_SCALED_ENV, "0").strip() == "1"


def region_exact(frame: Optional[codec.JpegFrame]) -> bool:
    """Whether the region decoder may decode a JPEG with this frame header.

    Only JPEGs that the region decoder (the system's libjpeg-turbo) and the decoder of
    record (simplejpeg's) read identically, pixels and refusals alike, qualify: an 8-bit
    baseline, extended or progressive Huffman frame, grey (one component, any sampling
    factors) or three components in a standard chroma layout (4:4:4, 4:2:2, 4:2:0, 4:4:0,
    4:1:1, 4:4:1 with 1x1 chroma). That is a subset of what each library accepts, checked
    by ``tests/test_decoder_of_record.py``: libjpeg-turbo 2.x refuses lossless (SOF3) frames
    that the decoder of record reads, and reads sampling factors (3x1, 2x4, 1x3, mixed) that
    the decoder of record refuses.

    Parameters
    ----------
    frame : JpegFrame or None
        The frame header, from :func:`gluon_data.format.codec.jpeg_frame`.

    Returns
    -------
    bool
        ``False`` sends the file to the decoder of record, decoded whole and cropped.
    """
    if frame is None or frame.marker not in _REGION_SOF or frame.precision != 8:
        return False
    if len(frame.sampling) == 1:
        return True
    return (len(frame.sampling) == 3 and frame.sampling[0] in _REGION_LUMA
            and frame.sampling[1] == frame.sampling[2] == (1, 1))


def region_decoder() -> str:
    """The decoder :func:`decode_region` uses, in words (for the benchmark and bug reports)."""
    if _jpegregion is None:
        return "full decode + crop (the gluon_data.format._jpegregion extension is not built)"
    v = _jpegregion.LIBJPEG_TURBO_VERSION
    name = "libjpeg-turbo %d.%d.%d" % (v // 1000000, v // 1000 % 1000, v % 1000)
    if codec.sj is None:  # pragma: no cover - a broken install
        return "full decode + crop (simplejpeg is not installed; extension built with %s)" % name
    if not region_decoding():
        return "full decode + crop (%s=0; extension built with %s)" % (_ENV, name)
    return ("region decode (gluon_data.format._jpegregion, %s; JPEGs outside decode.region_exact: "
            "full decode + crop)" % name)


def _check_box(box, hw: Tuple[int, int], what: str) -> Tuple[int, int, int, int]:
    y0, x0, y1, x1 = (int(v) for v in box)
    if not (0 <= y0 < y1 <= hw[0] and 0 <= x0 < x1 <= hw[1]):
        raise ValueError("%s: box (y0, x0, y1, x1) = %s is not a non-empty region of a %dx%d "
                         "image" % (what, tuple(box), hw[1], hw[0]))
    return y0, x0, y1, x1


def _region(buf, box, flag: int, max_pixels: Optional[int], what: str,
            strict: bool = True) -> Optional[np.ndarray]:
    """The box through the extension, or ``None`` where the full decode is the better (or
    the only exact) way: a JPEG outside :func:`region_exact`, an empty image, a large box."""
    frame = codec.jpeg_frame(buf)
    if frame is None or not region_exact(frame) or frame.height * frame.width == 0:
        return None
    hw = frame.height, frame.width
    y0, x0, y1, x1 = _check_box(box, hw, what)
    if (y1 - y0) * (x1 - x0) > REGION_MAX_FRACTION * hw[0] * hw[1]:
        return None
    codec.check_pixels(hw, what, max_pixels)  # (a JPEG with a frame: not empty)
    try:  # (a box outside the size libjpeg reads is a ValueError too: the headers disagree)
        out = _jpegregion.decode(buf, y0, x0, y1, x1, flag, strict)
    except ValueError as e:
        raise DecodeError("%s: corrupt JPEG data (%s)" % (what, e)) from None
    if out is None:  # declined (CMYK, arithmetic coding): region_exact lets none through
        return None
    return np.frombuffer(out[0], np.uint8).reshape(y1 - y0, x1 - x0, out[1])


def _denom(box_hw: Tuple[int, int], shrink_to: Tuple[int, int]) -> int:
    """The largest DCT scale denominator that keeps the box at least ``shrink_to`` (1: none)."""
    (bh, bw), (oh, ow) = box_hw, shrink_to
    return next((d for d in _DENOMS if bh >= d * oh and bw >= d * ow), 1)


def _scaled(buf, box, flag: int, shrink_to, max_pixels: Optional[int],
            what: str, strict: bool = True) -> Optional[np.ndarray]:
    """The box decoded at a DCT scale and resampled to ``shrink_to``, or ``None`` where the
    exact path is taken (a JPEG outside :func:`region_exact`, a shrink under 2x)."""
    frame = codec.jpeg_frame(buf)
    if frame is None or not region_exact(frame) or frame.height * frame.width == 0:
        return None
    y0, x0, y1, x1 = _check_box(box, (frame.height, frame.width), what)
    oh, ow = (int(v) for v in shrink_to)
    if oh <= 0 or ow <= 0:
        raise ValueError("%s: shrink_to must be positive, got %r" % (what, tuple(shrink_to)))
    d = _denom((y1 - y0, x1 - x0), (oh, ow))
    if d == 1:
        return None
    codec.check_pixels((frame.height, frame.width), what, max_pixels)  # (as _region)
    sh, sw = -(-frame.height // d), -(-frame.width // d)
    # the scaled rows/columns the bilinear taps touch: one beyond the box each side
    sy0, sx0 = max(0, y0 // d - 1), max(0, x0 // d - 1)
    sy1, sx1 = min(sh, -(-y1 // d) + 1), min(sw, -(-x1 // d) + 1)
    try:
        out = _jpegregion.decode(buf, sy0, sx0, sy1, sx1, flag, strict, d)
    except ValueError as e:
        raise DecodeError("%s: corrupt JPEG data (%s)" % (what, e)) from None
    if out is None:
        return None
    part = np.frombuffer(out[0], np.uint8).reshape(sy1 - sy0, sx1 - sx0, out[1])
    # output pixel centre j -> source u = y0 + (j + 0.5) * bh / oh - 0.5 (cv2.resize's map),
    # a scaled pixel i covering source pixels [i * d, (i + 1) * d): s = (u + 0.5) / d - 0.5
    fy, fx = (y1 - y0) / (oh * d), (x1 - x0) / (ow * d)
    m = np.array([[fx, 0.0, (x0 + 0.5 * (x1 - x0) / ow) / d - 0.5 - sx0],
                  [0.0, fy, (y0 + 0.5 * (y1 - y0) / oh) / d - 0.5 - sy0]])
    img = cv2.warpAffine(part if flag else part[:, :, 0], m, (ow, oh),
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_REPLICATE)
    return img if flag else img.reshape(oh, ow, 1)


def decode_region(buf, box, flag: int = 1, *,
                  max_pixels: Optional[int] = codec.DEFAULT_MAX_PIXELS,
                  what: str = "image", shrink_to: Optional[Tuple[int, int]] = None,
                  strict: bool = True) -> np.ndarray:
    """``decode_image(buf, flag)[y0:y1, x0:x1]`` for ``box = (y0, x0, y1, x1)`` in the
    image's pixel coordinates (half-open), decoding only that region when it can (see the
    module docstring).

    ``shrink_to=(h, w)``: the size the caller resizes the box to. Only with
    :func:`scaled_decoding` on, and a box at least 2x that size both ways, is the result
    different: the box decoded at a DCT scale and already resampled to ``(h, w)``. The caller
    resizes whatever it gets to ``(h, w)`` (a no-op then).

    ``strict=False``: the region decoder stops after the box's last row, for bytes already
    proven to decode strictly (see the module docstring); damage then may go unseen. For
    such bytes, the same pixels either way.

    Raises :class:`DecodeError` for bad image bytes (anywhere in the image with ``strict``,
    not only in the box), ``ValueError`` for a box outside the image.
    """
    if flag not in (0, 1):
        raise ValueError("flag must be 0 (grey) or 1 (colour), got %r" % (flag,))
    if shrink_to is not None and bytes(buf[:2]) == JPEG_SOI and scaled_decoding():
        img = _scaled(buf, box, flag, shrink_to, max_pixels, what, strict)
        if img is not None:
            return img
    if bytes(buf[:2]) == JPEG_SOI and region_decoding():
        img = _region(buf, box, flag, max_pixels, what, strict)
        if img is not None:
            return img
    img = codec.decode_image(buf, flag, max_pixels=max_pixels, what=what)
    y0, x0, y1, x1 = _check_box(box, img.shape[:2], what)
    return img[y0:y1, x0:x1]
