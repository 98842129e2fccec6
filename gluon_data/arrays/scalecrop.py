"""gluoncv's segmentation ``train`` augmentation fused into one pass
(:class:`RandomScaleCrop`), and the mask resampling every joint transform uses.

Masks are resized by our own index map (:func:`nearest_index`: integer arithmetic, then numpy
indexing), not by OpenCV: OpenCV 4 and 5 pick different source pixels for some sizes, and a
mask must not depend on the installed stack. The map is OpenCV 4's ``INTER_NEAREST_EXACT``
map, so the masks are the ones OpenCV 4.x gave, on every stack. A run-length mask's box
(:class:`~gluon_data.format.masks.RunBox`) is sampled on the same map straight from its runs,
its labels written through the table in the same pass: the same pixels. Everything here is
importable from :mod:`gluon_data.arrays.transforms`.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union, cast

import cv2
import numpy as np

from ..format.masks import RunBox, sampled_by_runs
from ..sampling.seeding import RandomTransform
from .blur import gaussian_blur
from .tensorize import as_hwc, to_numpy, to_chw_uint8

__all__ = ["RandomScaleCrop", "nearest_index", "resize_mask", "map_values"]


def nearest_index(dst: int, src: int) -> np.ndarray:
    """The source index of each of ``dst`` output positions when ``src`` positions are
    resized to ``dst`` by nearest neighbour with pixel-centre sampling: OpenCV 4's
    ``INTER_NEAREST_EXACT`` map (16-bit fixed point, integer arithmetic only), so the same
    indices on every machine, whatever OpenCV is installed.

    >>> nearest_index(4, 2).tolist(), nearest_index(3, 6).tolist()
    ([0, 0, 1, 1], [1, 3, 5])
    """
    dst, src = int(dst), int(src)
    if dst <= 0 or src <= 0:
        raise ValueError("sizes must be positive, got %d -> %d" % (src, dst))
    step = ((src << 16) + dst // 2) // dst
    start = step // 2 - src % 2
    return np.minimum((start + np.arange(dst, dtype=np.int64) * step) >> 16, src - 1)


#: Whether the installed OpenCV's ``INTER_NEAREST_EXACT`` is :func:`nearest_index`'s map
#: (OpenCV 4 computes exactly this map; OpenCV 5 another): then OpenCV resizes masks, faster
#: than numpy indexing and the same values.
_CV_NEAREST_IS_OURS = (cv2.__version__.split(".")[0] == "4"
                       and hasattr(cv2, "INTER_NEAREST_EXACT"))
_CV_MASK_TYPES = (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.float32)


def resize_mask(mask: np.ndarray, ow: int, oh: int, flip: bool = False) -> np.ndarray:
    """``mask`` (HxW) resized to ``oh`` x ``ow`` by :func:`nearest_index` (mirrored
    left-right with ``flip``), in its own dtype; C-contiguous."""
    h, w = mask.shape
    if (h, w) == (oh, ow) and not flip:
        return np.ascontiguousarray(mask)
    if _CV_NEAREST_IS_OURS and mask.dtype in _CV_MASK_TYPES:
        rows_whole = mask.strides[1] == mask.itemsize and mask.strides[0] > 0
        out = cv2.resize(mask if rows_whole else np.ascontiguousarray(mask), (ow, oh),
                         interpolation=cv2.INTER_NEAREST_EXACT)  # (a box's rows: no copy)
        return cv2.flip(out, 1, dst=out) if flip else out
    rows, cols = nearest_index(oh, h), nearest_index(ow, w)
    if flip:
        cols = cols[::-1]
    if h > oh:  # fewer rows kept: copy those rows first, then pick the columns
        return np.ascontiguousarray(mask[rows][:, cols])
    # columns first, on the transpose: the result comes out C-ordered
    return mask.T[cols][:, rows].T


_BYTES = np.arange(256)
#: A table that differs from the identity in at most this many entries is applied as a cast
#: plus one masked write per entry (each a compare over the mask): cheaper than ``cv2.LUT``
#: into a 16- or 32-bit table, which has no vector path (0.42 ms against 0.11 ms for a
#: 480x480 mask, one entry, on the benchmark machine).
_FEW_CHANGED = 2


def map_values(src: np.ndarray, table: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``dst[...] = table[src]`` for a uint8 ``src`` and a 256-entry ``table`` of ``dst``'s
    dtype; returns ``dst``. A table that is the identity but for a few entries (the ignore
    label mapped: what the segmentation datasets pass) is a cast and a masked write per
    entry, present in ``src`` or not; any other, ``cv2.LUT``. The same values either way.

    >>> table = np.arange(256, dtype=np.int32); table[255] = -1
    >>> map_values(np.array([[0, 255, 7]], np.uint8), table, np.empty((1, 3), np.int32))
    array([[ 0, -1,  7]], dtype=int32)
    """
    changed = np.flatnonzero(table != _BYTES)
    if changed.tolist() == [255] and table[255] == -1 and dst.dtype.kind == "i":
        # the default ignore mapping is a sign extension of the bytes, where no other
        # stored value (128-254) would go negative with it: a byte minimum, one cast
        signed = src.view(np.int8)
        if signed.size == 0 or signed.min() >= -1:
            np.copyto(dst, signed, casting="unsafe")
            return dst
    if changed.size > _FEW_CHANGED:
        got = cv2.LUT(src, table, dst=dst)
        if not np.shares_memory(got, dst):
            dst[...] = got
        return dst
    np.copyto(dst, src, casting="unsafe")
    for v in changed.tolist():
        hit = src == v
        if hit.any():
            np.copyto(dst, table[v], where=hit)
    return dst


def _fits(value, dtype) -> bool:
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else np.finfo(dtype)
    return info.min <= value <= info.max


class RandomScaleCrop(RandomTransform):
    """gluoncv's whole ``train`` augmentation in one pass, computing only the crop's pixels.

    The same distribution as ``Compose([RandomHorizontalFlip(flip), RandomScale(base_size,
    scale), RandomCrop(crop_size, image_fill, mask_fill), RandomGaussianBlur(blur,
    max_sigma)])`` (the default ``train`` transform of the segmentation datasets), but instead
    of resizing the whole image to the drawn scale and then cutting a crop out of it, it
    resizes just the source region the crop covers, mirrors only the crop and pads only
    what lies outside the scaled image (bottom/right, as gluoncv does). With ``base_size=400``
    and ``crop_size=320`` that is about a third of the pixels a scale-then-crop pipeline
    resizes, and no full-size flip or pad copies.

    All parameters are drawn first, in one call, from the transform's own generator (so a
    ``seed`` repeats exactly; see the module docstring for workers). Image and mask use the
    same source region and output size (bilinear / nearest with pixel-centre sampling), so
    they stay aligned; the drawn scale is kept to within one source pixel across the crop.

    Parameters
    ----------
    base_size : int
        The long side is drawn from ``[int(scale[0] * base_size), int(scale[1] * base_size)]``.
    crop_size : int or (h, w)
    scale : (float, float), default (0.5, 2.0)
    flip : float, default 0.5
        Probability of mirroring left-right.
    blur : float, default 0.5
        Probability of a Gaussian blur of the crop, sigma drawn from ``[0, max_sigma)``.
    image_fill, mask_fill
        Padding values; ``mask_fill`` should be the ignore value so padding trains nothing.
    """

    def __init__(self, base_size: int, crop_size: Union[int, Tuple[int, int]],
                 scale: Tuple[float, float] = (0.5, 2.0), flip: float = 0.5, blur: float = 0.5,
                 max_sigma: float = 1.0, image_fill: Union[float, Sequence[float]] = 0,
                 mask_fill: int = -1,
                 seed: Optional[int] = None) -> None:
        super().__init__(seed)
        if base_size <= 0:
            raise ValueError("base_size must be positive, got %r" % base_size)
        self.size = (crop_size, crop_size) if np.isscalar(crop_size) else tuple(crop_size)
        if min(self.size) <= 0:
            raise ValueError("crop_size must be positive, got %r" % (crop_size,))
        self.base_size, self.scale = base_size, tuple(scale)
        self.flip, self.blur, self.max_sigma = flip, blur, max_sigma
        self.image_fill, self.mask_fill = image_fill, mask_fill

    def _draw(self, g, h: int, w: int):
        lo, hi = int(self.base_size * self.scale[0]), int(self.base_size * self.scale[1])
        flip = g.random() < self.flip
        long_size = int(g.integers(lo, hi + 1))
        if h > w:
            oh, ow = long_size, int(1.0 * w * long_size / h + 0.5)
        else:
            ow, oh = long_size, int(1.0 * h * long_size / w + 0.5)
        oh, ow = max(oh, 1), max(ow, 1)
        ch, cw = self.size
        y1 = int(g.integers(0, max(oh - ch, 0) + 1))
        x1 = int(g.integers(0, max(ow - cw, 0) + 1))
        blur = g.random() < self.blur
        sigma = g.random() * self.max_sigma
        return flip, oh, ow, y1, x1, blur and sigma > 0.05, sigma

    @staticmethod
    def _span(start: int, length: int, scaled: int, src: int) -> Tuple[int, int]:
        """Source pixels ``[a, b)`` covering scaled pixels ``[start, start + length)``."""
        if length >= scaled:
            return 0, src
        f = src / scaled
        a = min(int(round(start * f)), src - 1)
        return a, min(src, max(a + 1, int(round((start + length) * f))))

    def plan(self, h: int, w: int
             ) -> Tuple[Tuple[int, int, int, int], Tuple[bool, int, int, bool, float]]:
        """Phase one: draw the sample's parameters for an ``h`` x ``w`` source (the JPEG
        header's size is enough) and return ``(box, params)``, ``box = (y0, x0, y1, x1)`` the
        source pixels the crop reads. Phase two, :meth:`apply`, needs only those pixels, so a
        dataset decodes just that region (:func:`gluon_data.format.decode.decode_region`)."""
        flip, oh, ow, y1, x1, blur, sigma = self.rng.draw(lambda g: self._draw(g, h, w))
        ch, cw = self.size
        vh, vw = min(ch, oh - y1), min(cw, ow - x1)   # the part of the crop inside the image
        if flip:  # mirror the crop window, then the pixels in it
            x1 = ow - x1 - vw
        ya, yb = self._span(y1, vh, oh, h)
        xa, xb = self._span(x1, vw, ow, w)
        return (ya, xa, yb, xb), (flip, vh, vw, blur, sigma)

    def __call__(self, img, mask):
        img, mask = to_numpy(img), to_numpy(mask)
        (ya, xa, yb, xb), params = self.plan(*mask.shape)
        return self.apply(img[ya:yb, xa:xb], mask[ya:yb, xa:xb], params)

    def apply(self, img: np.ndarray, mask: np.ndarray,
              params: Tuple[bool, int, int, bool, float],
              image_out: Optional[np.ndarray] = None, mask_out: Optional[np.ndarray] = None,
              mask_map: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Phase two: the output from the source region :meth:`plan` named (image and mask
        cut to its box) and its ``params``: the box resized once to the part of the crop
        inside the scaled image, mirrored in the same pass, padded, blurred.

        ``image_out``, a CxHxW uint8 buffer of the crop's size, gets the image channels-first
        (no HxWxC result is made); ``mask_out``, an HxW buffer of the crop's size, gets the
        mask in its dtype, each stored value looked up in ``mask_map`` (a 256-entry table,
        for uint8 masks) where given, else cast. ``mask`` may be a
        :class:`~gluon_data.format.masks.RunBox`, read from its runs. Returns ``(image,
        mask)``: the buffers where given. The same values either way."""
        flip, vh, vw, blur, sigma = params
        out_i = self._apply_image(to_numpy(img), flip, vh, vw, blur, sigma, image_out)
        if not isinstance(mask, RunBox):
            mask = to_numpy(mask)
        return out_i, self._apply_mask(mask, flip, vh, vw, mask_out, mask_map)

    def _fill(self, channels: int) -> list:
        fill = self.image_fill
        return list(cast(Sequence[float], fill)) if np.ndim(fill) else [fill] * channels

    def _apply_image(self, img, flip, vh, vw, blur, sigma, image_out):
        ch, cw = self.size
        c = img.shape[2] if img.ndim == 3 else 1
        padded = (vh, vw) != (ch, cw)
        if image_out is not None and not (padded and blur):  # channels-first, no HxWxC pad
            part = as_hwc(cv2.resize(img, (vw, vh), interpolation=cv2.INTER_LINEAR))
            if flip:
                cv2.flip(part, 1, dst=part)
            if blur:  # (not padded: the blur sees the same pixels)
                part = as_hwc(gaussian_blur(part, sigma))
            to_chw_uint8(part, image_out[:, :vh, :vw])
            for k, value in enumerate(self._fill(c)):
                image_out[k, vh:] = value
                image_out[k, :vh, vw:] = value
            return image_out
        out = np.empty((ch, cw, c), img.dtype) if padded else None
        part = as_hwc(cv2.resize(img, (vw, vh), interpolation=cv2.INTER_LINEAR,
                               dst=None if out is None else out[:vh, :vw]))
        if flip:
            cv2.flip(part, 1, dst=part)
        if padded:
            if not np.shares_memory(part, out):
                out[:vh, :vw] = part
            out[vh:] = self.image_fill
            out[:vh, vw:] = self.image_fill
        else:
            out = np.ascontiguousarray(part)
        if blur:
            out = as_hwc(gaussian_blur(out, sigma))
        return out if image_out is None else to_chw_uint8(out, image_out)

    def _apply_mask(self, m, flip, vh, vw, mask_out, mask_map):
        ch, cw = self.size
        fill = self.mask_fill
        if isinstance(m, RunBox):
            if mask_map is not None and mask_out is not None and sampled_by_runs(mask_map,
                                                                                 mask_out):
                h, w = m.shape  # each run one fill of the labels it maps to
                m.sample(nearest_index(vh, h), nearest_index(vw, w), mask_map, mask_out, flip)
                return self._pad_mask(mask_out, vh, vw, mask_map[fill])
            m = np.asarray(m)
        if mask_out is None:
            dt = m.dtype
            if not _fits(fill, dt):
                dt = np.dtype(np.int32)
            mask_out = np.empty((ch, cw), dt)
        part = resize_mask(m, vw, vh, flip)  # mirrored in the same copy
        dst = mask_out[:vh, :vw]
        if mask_map is not None:
            map_values(part, mask_map, dst)
            fill = mask_map[fill]
        else:
            np.copyto(dst, part, casting="unsafe")
        return self._pad_mask(mask_out, vh, vw, fill)

    @staticmethod
    def _pad_mask(mask_out: np.ndarray, vh: int, vw: int, fill) -> np.ndarray:
        """The crop's part outside the scaled image (below ``vh``, right of ``vw``) = fill."""
        mask_out[vh:] = fill
        mask_out[:vh, vw:] = fill
        return mask_out

    def __repr__(self):
        return "RandomScaleCrop(base_size=%d, crop_size=%s, scale=%s, flip=%g, blur=%g)" % (
            self.base_size, self.size, self.scale, self.flip, self.blur)
