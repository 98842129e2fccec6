"""Image-only numpy fast paths for Gluon's tensor transforms, fused into one pass each.

:class:`ToTensorNormalize` is Gluon's ``ToTensor`` (+ ``Normalize``) as a per-channel table
lookup, bit-identical for uint8 images; :class:`ImageCropNormalize` adds Gluon's
classification crop and flip (``RandomResizedCrop`` / ``CenterCrop``,
``RandomFlipLeftRight``) with seeded draws (:mod:`gluon_data.sampling.seeding`). The datasets run
them in place of the Gluon blocks they recognise (:mod:`gluon_data.gluon.fastpath`); both are also
importable from :mod:`gluon_data.arrays.transforms`. This module imports no MXNet.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Tuple, Union, cast

import cv2
import numpy as np

from ..sampling.seeding import RandomTransform

__all__ = ["ToTensorNormalize", "ImageCropNormalize", "to_chw_uint8", "OUTPUTS"]


def to_numpy(x: Any) -> np.ndarray:
    return x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)


def as_hwc(img: np.ndarray) -> np.ndarray:
    """OpenCV returns single-channel images as HxW: give them their channel axis back."""
    return img[:, :, None] if img.ndim == 2 else img


def to_chw_uint8(img: Any, out: Optional[np.ndarray] = None) -> np.ndarray:
    """uint8 HxWxC -> uint8 CxHxW (``ToTensor``'s layout, values kept), into ``out`` when
    given: one OpenCV ``split`` straight into the channel planes, a third of the bytes of the
    float32 tensor and no arithmetic (``output="uint8"``; the consumer normalises).

    >>> to_chw_uint8(np.arange(12, dtype=np.uint8).reshape(2, 2, 3))[:, 0, 1].tolist()
    [3, 4, 5]
    """
    x = to_numpy(img)
    if x.ndim != 3 or x.dtype != np.uint8:
        raise ValueError("expected a uint8 HxWxC image, got %s %s" % (x.dtype, x.shape))
    c = x.shape[2]
    if out is None:
        out = np.empty((c,) + x.shape[:2], np.uint8)
    if c == 1:
        out[0] = x[:, :, 0]
        return out
    planes = [out[k] for k in range(c)]
    got = cv2.split(np.ascontiguousarray(x), planes)
    for k in range(c):  # OpenCV writes into planes of the right size and type; else copy
        if not np.shares_memory(got[k], out[k]):
            out[k] = got[k]
    return out


class ToTensorNormalize:
    """uint8 HxWxC -> float32 CxHxW, ``(x / 255 - mean) / std``; the mask passes through.

    Exactly the values of Gluon's ``Compose([ToTensor(), Normalize(mean, std)])`` for uint8
    images: each channel's 256 possible results are computed once, in float32 as Gluon's
    operators compute them, and an image is one OpenCV table lookup per channel straight
    into the CxHxW output (faster than the arithmetic, and bit-identical), instead of two
    NDArray operators. Float images are computed arithmetically (within 1e-6).
    ``mean=0, std=1`` is Gluon's ``ToTensor`` alone. :meth:`image` converts an image only.

    >>> import numpy as np
    >>> t = ToTensorNormalize(mean=0.5, std=0.5)
    >>> t.image(np.full((2, 2, 3), 255, np.uint8))[:, 0, 0].tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self, mean: Union[float, Sequence[float], np.ndarray] = (0.485, 0.456, 0.406),
                 std: Union[float, Sequence[float], np.ndarray] = (0.229, 0.224, 0.225)) -> None:
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        self.channels = max(self.mean.size, self.std.size)
        levels = np.arange(256, dtype=np.float32) / np.float32(255.0)  # Gluon's ToTensor
        self._luts = [(levels - self.mean[c % self.mean.size]) / self.std[c % self.std.size]
                      for c in range(self.channels)]  # Gluon's Normalize, in float32

    def image(self, img: Any, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The CxHxW float32 tensor of ``img``, written into ``out`` when given."""
        x = to_numpy(img)
        if x.ndim != 3:
            raise ValueError("expected an HxWxC image, got shape %s" % (x.shape,))
        c = x.shape[2]
        if self.channels not in (1, c):
            raise ValueError("mean/std have %d values but the image has %d channels"
                             % (self.channels, c))
        if out is None:
            out = np.empty((c,) + x.shape[:2], np.float32)
        if x.dtype == np.uint8:
            planes = cv2.split(x) if c > 1 else [np.ascontiguousarray(x[:, :, 0])]
            for k, plane in enumerate(planes):
                cv2.LUT(plane, self._luts[k % self.channels], dst=out[k])
            return out
        for k in range(c):
            out[k] = (x[:, :, k].astype(np.float32) / np.float32(255.0)
                      - self.mean[k % self.mean.size]) / self.std[k % self.std.size]
        return out

    def planes(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out[..., c, :, :]`` = channel ``c`` of the uint8 ``...xCxHxW`` array ``x``
        converted (the same tables as :meth:`image`: one lookup per plane)."""
        flat_x = x.reshape((-1,) + x.shape[-3:])
        flat_out = out.reshape(flat_x.shape)
        for img, dst in zip(flat_x, flat_out):
            for k in range(img.shape[0]):
                cv2.LUT(img[k], self._luts[k % self.channels], dst=dst[k])
        return out

    def __call__(self, img, mask):
        return self.image(img), to_numpy(mask)

    def __repr__(self):
        return "ToTensorNormalize(mean=%s, std=%s)" % (self.mean.tolist(), self.std.tolist())


def _interp(code: int, sizes: Tuple[int, int, int, int]) -> int:
    """MXNet's interpolation codes (0-4 as OpenCV's, 9 = by direction) -> OpenCV's."""
    if code == 9:
        oh, ow, nh, nw = sizes
        return 2 if nh > oh and nw > ow else 3 if nh < oh and nw < ow else 1
    return code


def _scale_down(src_wh, size_wh):
    """``mx.image.scale_down``: shrink a crop size that does not fit the image."""
    w, h = size_wh
    sw, sh = src_wh
    if sh < h:
        w, h = float(w * sh) / h, sh
    if sw < w:
        w, h = sw, float(h * sw) / w
    return int(w), int(h)


def _check_crop(crop) -> None:
    """Refuse a ``crop`` that is not ``('random', (w, h), scale, ratio, interp)`` or
    ``('center', (w, h), interp)`` (``ValueError`` naming the form), before any image: an
    interpolation left out failed only at the first image that needed a resize."""
    forms = {"random": 5, "center": 3}
    ok = (isinstance(crop, tuple) and len(crop) >= 3 and isinstance(crop[0], str)
          and len(crop) == forms.get(crop[0], -1)
          and isinstance(crop[1], (tuple, list)) and len(crop[1]) == 2
          and all(isinstance(v, (int, np.integer)) and v > 0 for v in crop[1])
          and isinstance(crop[-1], (int, np.integer)) and crop[-1] in (0, 1, 2, 3, 4, 9))
    if not ok:
        raise ValueError("crop must be ('random', (w, h), scale, ratio, interp) or ('center', "
                         "(w, h), interp), sizes positive ints, interp one of MXNet's 0-4 or "
                         "9; got %r" % (crop,))


def _draw_bounds(crop) -> Optional[Tuple[float, float, float, float]]:
    """A random crop's draw bounds, computed once: ``(area low, area span, log ratio low,
    log ratio span)`` as ``Generator.uniform`` computes them from its arguments."""
    if crop is None or crop[0] != "random":
        return None
    area, ratio = crop[2], crop[3]
    area = (area, 1.0) if np.isscalar(area) else area
    lo_a, hi_a = float(area[0]), float(area[1])
    lo_r, hi_r = float(np.log(ratio[0])), float(np.log(ratio[1]))
    return lo_a, hi_a - lo_a, lo_r, hi_r - lo_r


class ImageCropNormalize(RandomTransform):
    """Gluon's classification transforms in numpy/OpenCV: an optional ``RandomResizedCrop`` or
    ``CenterCrop``, an optional ``RandomFlipLeftRight``, then ``ToTensor`` (+ ``Normalize``).

    The geometry follows ``mx.image.random_size_crop`` / ``center_crop`` / ``fixed_crop`` (same
    draws of area and aspect ratio, same crop arithmetic, the same OpenCV interpolation), with
    draws from the transform's own generator (``sample_rng(seed, epoch, index)`` inside a
    dataset's :class:`sample_context`) instead of the global ``random`` module. Returns a
    CxHxW float32 array, written into ``out`` when given.

    Parameters
    ----------
    crop : None, ('random', (w, h), scale, ratio, interp) or ('center', (w, h), interp)
    flip : bool
        Mirror left-right with probability 1/2.
    mean, std
        As for :class:`ToTensorNormalize` (``0, 1``: ``ToTensor`` alone).
    uint8 : bool
        Return the CxHxW uint8 image instead (:func:`to_chw_uint8`: ``ToTensor``'s layout,
        values kept); needs ``mean=0, std=1``: the consumer normalises.
    """

    def __init__(self, crop: Optional[tuple] = None, flip: bool = False,
                 mean: Union[float, Sequence[float], np.ndarray] = 0.0,
                 std: Union[float, Sequence[float], np.ndarray] = 1.0,
                 seed: Optional[int] = None, uint8: bool = False) -> None:
        super().__init__(seed)
        if crop is not None:
            _check_crop(crop)
        self.crop, self.flip = crop, flip
        self._bounds = _draw_bounds(crop)
        self.tensor = ToTensorNormalize(mean, std)
        self.uint8 = bool(uint8)
        if self.uint8 and self.normalizes:
            raise ValueError("a uint8 output is not normalised: drop Normalize(mean, std) "
                             "and normalise in the consumer (gluon_data.InputNormalize)")

    @property
    def normalizes(self) -> bool:
        """Whether the tensor step is more than ``ToTensor`` (a ``Normalize`` follows)."""
        return bool((self.tensor.mean != 0).any() or (self.tensor.std != 1).any())

    def out_shape(self, img_shape: Tuple[int, ...]) -> Tuple[int, int, int]:
        h, w, c = img_shape
        if self.crop is not None:
            w, h = self.crop[1]
        return c, h, w

    def _draw_crop(self, g, h: int, w: int):
        """``mx.image.random_size_crop``'s draws: up to 10 tries of an area and a log-uniform
        aspect ratio, then the corner; ``None`` if none fits (the centre crop follows).
        ``lo + (hi - lo) * g.random()`` is ``g.uniform(lo, hi)``'s own arithmetic on the same
        draw, and ``math.sqrt`` rounds as ``np.sqrt`` does (both IEEE-exact): the same boxes,
        without numpy's per-call overhead on scalars (a fifth of the draw's time)."""
        a_lo, a_span, r_lo, r_span = cast(Tuple[float, float, float, float], self._bounds)
        src_area = h * w
        for _ in range(10):
            target_area = (a_lo + a_span * g.random()) * src_area
            new_ratio = np.exp(r_lo + r_span * g.random())
            new_w = int(round(math.sqrt(target_area * new_ratio)))
            new_h = int(round(math.sqrt(target_area / new_ratio)))
            if new_w <= w and new_h <= h:
                return (int(g.integers(0, w - new_w + 1)), int(g.integers(0, h - new_h + 1)),
                        new_w, new_h)
        return None  # fall back to the centre crop, as MXNet does

    def plan(self, h: int, w: int) -> Tuple[Tuple[int, int, int, int], bool]:
        """Phase one: draw the crop and flip for an ``h`` x ``w`` image (the JPEG header's
        size is enough): ``((y0, x0, y1, x1), flip)``, the box in the image's pixels (all of
        it without a crop). Phase two, :meth:`finish`, needs only the box's pixels."""
        box, flip = None, False
        if self.crop is not None or self.flip:
            def draw(g):
                b = self._draw_crop(g, h, w) if self.crop and self.crop[0] == "random" else None
                return b, bool(self.flip and g.random() < 0.5)
            box, flip = self.rng.draw(draw)
        if self.crop is None:
            return (0, 0, h, w), flip
        if box is None:  # centre crop (or the random crop's fallback)
            nw, nh = _scale_down((w, h), self.crop[1])
            box = (int((w - nw) / 2), int((h - nh) / 2), nw, nh)
        x0, y0, cw, ch = box
        return (y0, x0, y0 + ch, x0 + cw), flip

    def __call__(self, img, out: Optional[np.ndarray] = None) -> np.ndarray:
        x = to_numpy(img)
        (y0, x0, y1, x1), flip = self.plan(*x.shape[:2])
        return self.finish(x[y0:y1, x0:x1], flip, out)

    def finish(self, x: np.ndarray, flip: bool, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Phase two: resize the cropped pixels ``x`` (the box of :meth:`plan`), flip, and
        convert to the CxHxW tensor (into ``out`` when given)."""
        if self.crop is not None:
            size = self.crop[1]
            interp = self.crop[-1]
            ch, cw = x.shape[:2]
            if (cw, ch) != tuple(size):
                x = as_hwc(cv2.resize(x, tuple(size), interpolation=_interp(
                    interp, (ch, cw, size[1], size[0]))))
        if flip:
            x = as_hwc(cv2.flip(x, 1))
        return to_chw_uint8(x, out) if self.uint8 else self.tensor.image(x, out=out)

    def __repr__(self):
        return "ImageCropNormalize(crop=%r, flip=%s, %s)" % (
            self.crop, self.flip, "uint8" if self.uint8 else repr(self.tensor))


#: The image outputs of a mode: ``None`` (what ``transform`` makes), ``"uint8"`` (CxHxW uint8).
OUTPUTS = (None, "uint8")


def uint8_output(output: Optional[str], mode: Optional[str], transform: Optional[Callable],
                 fast: Optional["ImageCropNormalize"]
                 ) -> Tuple[Optional["ImageCropNormalize"], Optional[Callable]]:
    """``(fast path, image transform)`` of a mode's ``output`` (see
    :class:`~gluon_data.arrays.datasets.SegmentationDataset`):
    ``"uint8"`` lays the image out as CxHxW uint8; a Gluon ``ToTensor`` alone then means that
    layout, and a ``Normalize`` is refused (it belongs to the consumer)."""
    if output not in OUTPUTS:
        raise ValueError("unknown output %r; valid outputs: None (what transform makes), "
                         "'uint8'" % (output,))
    if output is None:
        return fast, transform
    if mode is None:
        raise ValueError("output='uint8' applies in a mode (train, val, testval, test); "
                         "without one the samples are the stored HxWxC uint8 images")
    if fast is not None:
        if fast.normalizes:  # (named by its recipe object, not as a bound method of it)
            raise ValueError("output='uint8' delivers images before normalisation, but "
                             "transform=%r normalises: drop it (or keep ToTensor alone) and "
                             "put gluon_data.InputNormalize(mean, std) at the model's input"
                             % (getattr(transform, "__self__", transform),))
        transform = None  # ToTensor alone: the uint8 output's layout already
    return ImageCropNormalize(uint8=True), transform


def uint8_image(x: Any) -> np.ndarray:
    """An image ``transform``'s result under ``output='uint8'``: still HxWxC uint8."""
    arr = to_numpy(x)
    if arr.dtype != np.uint8 or arr.ndim != 3:
        raise ValueError("with output='uint8' the image transform must return an HxWxC "
                         "uint8 image (laid out as CxHxW after it), but it returned %s %s: "
                         "converting and normalising belong in the consumer "
                         "(gluon_data.InputNormalize)" % (arr.dtype, arr.shape))
    return arr


def crop_normalize(transform: Union[ImageCropNormalize, ToTensorNormalize],
                   seed: Optional[int], uint8: bool) -> ImageCropNormalize:
    """A new :class:`ImageCropNormalize` doing what ``transform`` (one, or a
    :class:`ToTensorNormalize`) does, drawing with ``seed`` (the transform's own when
    ``None``), CxHxW uint8 with ``uint8`` (then a ``Normalize`` is a ``ValueError``)."""
    if isinstance(transform, ToTensorNormalize):
        crop, flip, tensor, own = None, False, transform, None
    elif isinstance(transform, ImageCropNormalize):
        crop, flip, tensor, own = transform.crop, transform.flip, transform.tensor, \
            transform.rng.seed
    else:
        raise TypeError("image_transform must be an ImageCropNormalize or a ToTensorNormalize "
                        "(gluon_data.arrays.tensorize), got %r; run other image transforms "
                        "in transform(image, label)" % (transform,))
    return ImageCropNormalize(crop, flip, tensor.mean, tensor.std,
                              seed=own if seed is None else seed, uint8=uint8)
