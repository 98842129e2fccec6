"""Region decoding: decode only the part of a JPEG that a crop keeps.

:func:`decode_region` returns exactly ``codec.decode_image(buf, flag)[y0:y1, x0:x1]``, pixel
for pixel. With the optional C extension ``gluon_data._jpegregion`` (built at install when a
C compiler and libjpeg-turbo's headers are present) it runs the inverse DCT, upsampling and
colour conversion for the box's rows and columns only; otherwise, for bytes that are not a
baseline/progressive YCbCr or grey JPEG, for a box covering most of the image (where the
region decoder saves less than it costs), or with ``GLUON_DATA_REGION_DECODE=0``, it decodes
the whole image and crops it: the same pixels either way.

Both paths are equally strict: the region decoder reads the whole entropy-coded stream
through the end-of-image marker and treats every libjpeg warning ("Corrupt JPEG data: ...")
as an error, so damage anywhere in the image, inside the box or outside it, and truncation
raise :class:`~gluon_data.errors.DecodeError`, as :func:`~gluon_data.codec.decode_image`
does. :func:`region_decoder` says which decoder is in use.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

from . import codec
from .errors import DecodeError

try:  # the optional C extension (setup.py); absent: whole-image decodes, the same pixels
    from . import _jpegregion
except ImportError:  # pragma: no cover - depends on the install
    _jpegregion = None

__all__ = ["decode_region", "region_decoding", "region_decoder", "REGION_MAX_FRACTION"]

#: A box covering more than this fraction of the image is decoded whole: the region
#: decoder still Huffman-decodes every row, so above it the saving measured (0-20 %) was
#: within the benchmark machine's noise (``python benchmarks/bench_region.py``).
REGION_MAX_FRACTION = 0.6
_ENV = "GLUON_DATA_REGION_DECODE"
_JPEG_SOI = b"\xff\xd8"


def region_decoding() -> bool:
    """Whether JPEG boxes are decoded without the rest of the image: the extension is built
    and ``GLUON_DATA_REGION_DECODE`` is not ``0`` (read at each call, so a DataLoader worker
    follows the environment it was started with)."""
    return _jpegregion is not None and os.environ.get(_ENV, "1").strip() != "0"


def region_decoder() -> str:
    """The decoder :func:`decode_region` uses, in words (for the benchmark and bug reports)."""
    if _jpegregion is None:
        return "full decode + crop (the gluon_data._jpegregion extension is not built)"
    v = _jpegregion.LIBJPEG_TURBO_VERSION
    name = "libjpeg-turbo %d.%d.%d" % (v // 1000000, v // 1000 % 1000, v % 1000)
    if not region_decoding():
        return "full decode + crop (%s=0; extension built with %s)" % (_ENV, name)
    return "region decode (gluon_data._jpegregion, %s)" % name


def _check_box(box, hw: Tuple[int, int], what: str) -> Tuple[int, int, int, int]:
    y0, x0, y1, x1 = (int(v) for v in box)
    if not (0 <= y0 < y1 <= hw[0] and 0 <= x0 < x1 <= hw[1]):
        raise ValueError("%s: box (y0, x0, y1, x1) = %s is not a non-empty region of a %dx%d "
                         "image" % (what, tuple(box), hw[1], hw[0]))
    return y0, x0, y1, x1


def _region(buf, box, flag: int, max_pixels: Optional[int], what: str) -> Optional[np.ndarray]:
    """The box through the extension, or ``None`` where the full decode is the better (or
    the only exact) way."""
    hw = codec.image_size(buf)
    if hw is None or hw[0] * hw[1] == 0:
        return None
    y0, x0, y1, x1 = _check_box(box, hw, what)
    if (y1 - y0) * (x1 - x0) > REGION_MAX_FRACTION * hw[0] * hw[1]:
        return None
    codec._check_structure(buf, what, max_pixels)  # empty, pixel cap: as decode_image
    try:
        out = _jpegregion.decode(buf, y0, x0, y1, x1, flag)
    except ValueError as e:
        raise DecodeError("%s: corrupt JPEG data (%s)" % (what, e)) from None
    except IndexError:  # libjpeg read another size than the first frame header says
        raise DecodeError("%s: corrupt JPEG (its frame headers disagree on the image size)"
                          % what) from None
    if out is None:  # CMYK, arithmetic coding, ...: not reproduced exactly here
        return None
    return np.frombuffer(out[0], np.uint8).reshape(y1 - y0, x1 - x0, out[1])


def decode_region(buf, box, flag: int = 1, *,
                  max_pixels: Optional[int] = codec.DEFAULT_MAX_PIXELS,
                  what: str = "image") -> np.ndarray:
    """``decode_image(buf, flag)[y0:y1, x0:x1]`` for ``box = (y0, x0, y1, x1)`` in the
    image's pixel coordinates (half-open), decoding only that region when it can (see the
    module docstring).

    Raises :class:`DecodeError` for bad image bytes (anywhere in the image, not only in the
    box), ``ValueError`` for a box outside the image.
    """
    if flag not in (0, 1):
        raise ValueError("flag must be 0 (grey) or 1 (colour), got %r" % (flag,))
    if bytes(buf[:2]) == _JPEG_SOI and region_decoding():
        img = _region(buf, box, flag, max_pixels, what)
        if img is not None:
            return img
    img = codec.decode_image(buf, flag, max_pixels=max_pixels, what=what)
    y0, x0, y1, x1 = _check_box(box, img.shape[:2], what)
    return img[y0:y1, x0:x1]
