"""Joint (image, mask) transforms for segmentation, in numpy/OpenCV, seeded explicitly.

Every transform takes ``(image, mask)`` — image HxWxC uint8 (numpy or NDArray), mask HxW
integer — and returns numpy arrays. Geometry is applied to both (images bilinear, masks
nearest neighbour with pixel-centre sampling, as PIL does); photometric changes touch the image
only. Padding fills masks with the ignore value, never with a class.

Masks are resized by our own index map (:func:`nearest_index`, integer arithmetic, then numpy
indexing), not by OpenCV: OpenCV 4 and 5 pick different source pixels for some sizes, and a
mask must not depend on the installed stack. The map is OpenCV 4's ``INTER_NEAREST_EXACT``
map, so the masks are the ones OpenCV 4.x gave, on every stack.

Randomness: each random transform draws its parameters first (two-phase, as tensorpack's
imgaug does) from its own generator, never from the global ``random``/``numpy`` state that
DataLoader workers inherit identically through ``fork``.

* Inside a dataset (``seed=s``): the dataset runs the transform within
  :func:`sample_context` ``(epoch, index)``, and each random transform draws from
  ``sample_rng(s, epoch, index)`` (:func:`gluon_data.sampling.sampler.sample_rng`; children of a
  :class:`Compose` get ``s + position``). A sample's draws are then a pure function of
  ``(seed, epoch, index)``: bit-identical with any number of workers, threads or ranks, in any
  order, and after a resume.
* Called directly, outside a sample context (``seed=s``): the sequence of draws repeats
  exactly in the process that built the transform; another process (a DataLoader worker)
  gets its own stream derived from ``s`` and its pid.
* ``seed=None``: fresh OS entropy in every process, always.

The machinery (:class:`sample_context`, :class:`SeededRandom`) lives in
:mod:`gluon_data.sampling.seeding`, the image-only tensor fast paths (:class:`ToTensorNormalize`,
:class:`ImageCropNormalize`) in :mod:`gluon_data.arrays.tensorize`; both are importable from here.

>>> import numpy as np
>>> t = Compose([RandomHorizontalFlip(), RandomScale(base_size=64), RandomCrop(48)], seed=0)
>>> img, mask = t(np.zeros((40, 60, 3), np.uint8), np.zeros((40, 60), np.int32))
>>> img.shape, mask.shape
((48, 48, 3), (48, 48))
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from ..format.codec import DEFAULT_MAX_PIXELS
from ..errors import DecodeError
from ..sampling.seeding import SeededRandom, RandomTransform, sample_context
from .tensorize import ImageCropNormalize, ToTensorNormalize, _hwc, _np, to_chw_uint8

__all__ = ["nearest_index", "resize_mask", "Compose", "RandomHorizontalFlip", "RandomScale", "RandomCrop", "RandomScaleCrop",
           "RandomRotation",
           "ColorJitter", "RandomGaussianBlur", "ResizeShort", "Resize", "CenterCrop",
           "ToTensorNormalize", "SeededRandom", "ImageCropNormalize", "sample_context"]


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


def resize_mask(mask: np.ndarray, ow: int, oh: int, flip: bool = False) -> np.ndarray:
    """``mask`` (HxW) resized to ``oh`` x ``ow`` by :func:`nearest_index` (mirrored
    left-right with ``flip``, in the same copy), in its own dtype."""
    rows = nearest_index(oh, mask.shape[0])
    cols = nearest_index(ow, mask.shape[1])
    if flip:
        cols = cols[::-1]
    if len(rows) == mask.shape[0] and not flip and len(cols) == mask.shape[1]:
        return np.ascontiguousarray(mask)
    # columns first, on the transpose: the result comes out C-ordered (``mask[rows][:, cols]``
    # is laid out column-major, which the table lookup after it reads slowly)
    return mask.T[cols][:, rows].T


def _check_derived(h: int, w: int, oh: int, ow: int, max_pixels: Optional[int],
                   name: str) -> None:
    """Refuse an output size derived from the input's aspect ratio that exceeds
    ``max_pixels``, before allocating it (a 1x30000 strip resized to a short side of 480
    would be 480x14400000)."""
    if max_pixels and oh * ow > max_pixels:
        raise DecodeError("%s of a %dx%d image gives %dx%d = %d pixels, more than max_pixels=%d"
                          % (name, w, h, ow, oh, oh * ow, max_pixels))


def _resize_pair(img, mask, ow: int, oh: int):
    img = _hwc(cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR))
    return img, resize_mask(mask, ow, oh)


def _mask_for_cv(mask: np.ndarray) -> Tuple[np.ndarray, np.dtype]:
    """OpenCV warps int32/uint8/uint16 masks fine; int64 and others go through int32."""
    if mask.dtype in (np.uint8, np.uint16, np.int16, np.int32, np.float32):
        return mask, mask.dtype
    return mask.astype(np.int32), mask.dtype


class Compose:
    """Apply joint transforms in order. ``seed`` reseeds every random child (seed + i).

    Parameters
    ----------
    transforms : sequence of callables
        Each maps ``(image, mask) -> (image, mask)``.
    seed : int, optional
        Makes the whole pipeline repeatable; children get ``seed + position``.
    """

    def __init__(self, transforms: Sequence, seed: Optional[int] = None):
        self.transforms = list(transforms)
        if seed is not None:
            for i, t in enumerate(self.transforms):
                if hasattr(t, "reseed"):
                    t.reseed(seed + i)

    def reseed(self, seed: Optional[int]) -> None:
        for i, t in enumerate(self.transforms):
            if hasattr(t, "reseed"):
                t.reseed(None if seed is None else seed + i)

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        for t in self.transforms:
            img, mask = t(img, mask)
        return img, mask

    def __repr__(self):
        return "Compose(%s)" % ", ".join(repr(t) for t in self.transforms)


class RandomHorizontalFlip(RandomTransform):
    """Mirror image and mask left-right with probability ``p``."""

    def __init__(self, p: float = 0.5, seed: Optional[int] = None):
        super().__init__(seed)
        self.p = p

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        if self.rng.draw(lambda g: g.random()) < self.p:
            return np.ascontiguousarray(img[:, ::-1]), np.ascontiguousarray(mask[:, ::-1])
        return img, mask

    def __repr__(self):
        return "RandomHorizontalFlip(p=%g)" % self.p


class RandomScale(RandomTransform):
    """gluoncv's random scale: the long side drawn uniformly from
    ``[int(scale[0] * base_size), int(scale[1] * base_size)]``, aspect ratio kept."""

    def __init__(self, base_size: int, scale: Tuple[float, float] = (0.5, 2.0),
                 seed: Optional[int] = None):
        super().__init__(seed)
        if base_size <= 0:
            raise ValueError("base_size must be positive, got %r" % base_size)
        self.base_size, self.scale = base_size, tuple(scale)

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        lo, hi = int(self.base_size * self.scale[0]), int(self.base_size * self.scale[1])
        long_size = int(self.rng.draw(lambda g: g.integers(lo, hi + 1)))
        h, w = mask.shape
        if h > w:
            oh, ow = long_size, int(1.0 * w * long_size / h + 0.5)
        else:
            ow, oh = long_size, int(1.0 * h * long_size / w + 0.5)
        m, dt = _mask_for_cv(mask)
        img, m = _resize_pair(img, m, max(ow, 1), max(oh, 1))
        return img, m.astype(dt, copy=False)

    def __repr__(self):
        return "RandomScale(base_size=%d, scale=%s)" % (self.base_size, self.scale)


def _pad_to(img, mask, th: int, tw: int, image_fill, mask_fill):
    """Pad bottom/right to at least ``th`` x ``tw``; only the new pixels are filled."""
    h, w = mask.shape
    ph, pw = max(th - h, 0), max(tw - w, 0)
    if not ph and not pw:
        return img, mask
    out_i = np.empty((h + ph, w + pw, img.shape[2]), img.dtype)
    out_m = np.empty((h + ph, w + pw), mask.dtype)
    for out, src, fill in ((out_i, img, image_fill), (out_m, mask, mask_fill)):
        out[:h, :w] = src
        out[h:] = fill
        out[:h, w:] = fill
    return out_i, out_m


class RandomCrop(RandomTransform):
    """Pad (bottom/right) to at least ``crop_size``, then crop a random ``crop_size`` square.

    Parameters
    ----------
    crop_size : int or (h, w)
    image_fill : number or per-channel sequence, default 0
        Padding value of the image (e.g. the dataset's mean pixel).
    mask_fill : int, default -1
        Padding value of the mask: the ignore value, so padding never trains a class.
    """

    def __init__(self, crop_size: Union[int, Tuple[int, int]], image_fill=0, mask_fill: int = -1,
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.size = (crop_size, crop_size) if np.isscalar(crop_size) else tuple(crop_size)
        if min(self.size) <= 0:
            raise ValueError("crop_size must be positive, got %r" % (crop_size,))
        self.image_fill, self.mask_fill = image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        ch, cw = self.size
        img, mask = _pad_to(img, mask, ch, cw, self.image_fill, self.mask_fill)
        h, w = mask.shape
        y1, x1 = self.rng.draw(lambda g: (int(g.integers(0, h - ch + 1)),
                                          int(g.integers(0, w - cw + 1))))
        return img[y1:y1 + ch, x1:x1 + cw], mask[y1:y1 + ch, x1:x1 + cw]

    def __repr__(self):
        return "RandomCrop(%s, mask_fill=%d)" % (self.size, self.mask_fill)


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
                 max_sigma: float = 1.0, image_fill=0, mask_fill: int = -1,
                 seed: Optional[int] = None):
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

    def plan(self, h: int, w: int):
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
        img, mask = _np(img), _np(mask)
        (ya, xa, yb, xb), params = self.plan(*mask.shape)
        return self.apply(img[ya:yb, xa:xb], mask[ya:yb, xa:xb], params)

    def apply(self, img, mask, params, image_out: Optional[np.ndarray] = None,
              mask_out: Optional[np.ndarray] = None, mask_map: Optional[np.ndarray] = None):
        """Phase two: the output from the source region :meth:`plan` named (image and mask
        cut to its box) and its ``params``: the box resized once to the part of the crop
        inside the scaled image, mirrored in the same pass, padded, blurred.

        ``image_out``, a CxHxW uint8 buffer of the crop's size, gets the image channels-first
        (no HxWxC result is made); ``mask_out``, an HxW buffer of the crop's size, gets the
        mask in its dtype, each stored value looked up in ``mask_map`` (a 256-entry table,
        for uint8 masks) where given, else cast. Returns ``(image, mask)``: the buffers where
        given. The same values either way."""
        flip, vh, vw, blur, sigma = params
        out_i = self._apply_image(_np(img), flip, vh, vw, blur, sigma, image_out)
        return out_i, self._apply_mask(_np(mask), flip, vh, vw, mask_out, mask_map)

    def _fill(self, channels: int) -> list:
        fill = self.image_fill
        return list(fill) if np.ndim(fill) else [fill] * channels

    def _apply_image(self, img, flip, vh, vw, blur, sigma, image_out):
        ch, cw = self.size
        c = img.shape[2] if img.ndim == 3 else 1
        padded = (vh, vw) != (ch, cw)
        if image_out is not None and not (padded and blur):  # channels-first, no HxWxC pad
            part = _hwc(cv2.resize(img, (vw, vh), interpolation=cv2.INTER_LINEAR))
            if flip:
                cv2.flip(part, 1, dst=part)
            if blur:  # (not padded: the blur sees the same pixels)
                part = _hwc(cv2.GaussianBlur(part, (0, 0), sigmaX=sigma))
            to_chw_uint8(part, image_out[:, :vh, :vw])
            for k, value in enumerate(self._fill(c)):
                image_out[k, vh:] = value
                image_out[k, :vh, vw:] = value
            return image_out
        out = np.empty((ch, cw, c), img.dtype) if padded else None
        part = _hwc(cv2.resize(img, (vw, vh), interpolation=cv2.INTER_LINEAR,
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
            out = _hwc(cv2.GaussianBlur(out, (0, 0), sigmaX=sigma))
        return out if image_out is None else to_chw_uint8(out, image_out)

    def _apply_mask(self, m, flip, vh, vw, mask_out, mask_map):
        ch, cw = self.size
        fill = self.mask_fill
        if mask_out is None:
            dt = m.dtype
            if not _fits(fill, dt):
                dt = np.dtype(np.int32)
            mask_out = np.empty((ch, cw), dt)
        part = resize_mask(m, vw, vh, flip)  # mirrored in the same copy
        dst = mask_out[:vh, :vw]
        if mask_map is not None:
            got = cv2.LUT(part, mask_map, dst=dst)
            if not np.shares_memory(got, mask_out):
                dst[...] = got
            fill = mask_map[fill]
        else:
            np.copyto(dst, part, casting="unsafe")
        mask_out[vh:] = fill
        mask_out[:vh, vw:] = fill
        return mask_out

    def __repr__(self):
        return "RandomScaleCrop(base_size=%d, crop_size=%s, scale=%s, flip=%g, blur=%g)" % (
            self.base_size, self.size, self.scale, self.flip, self.blur)


class RandomRotation(RandomTransform):
    """Rotate by an angle drawn from ``[-degrees, degrees]`` with probability ``p``.

    Corners uncovered by the rotation get ``image_fill`` and ``mask_fill`` (ignore).
    """

    def __init__(self, degrees: float = 10.0, p: float = 1.0, image_fill=0, mask_fill: int = -1,
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.degrees, self.p, self.image_fill, self.mask_fill = degrees, p, image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        apply, angle = self.rng.draw(lambda g: (g.random() < self.p,
                                                g.uniform(-self.degrees, self.degrees)))
        if not apply:
            return img, mask
        h, w = mask.shape
        mat = cv2.getRotationMatrix2D((w / 2.0, h / 2.0), angle, 1.0)
        fill = self.image_fill if np.ndim(self.image_fill) else [self.image_fill] * 3
        out = _hwc(cv2.warpAffine(img, mat, (w, h), flags=cv2.INTER_LINEAR,
                                  borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(fill)))
        m, dt = _mask_for_cv(mask)
        m = cv2.warpAffine(m, mat, (w, h), flags=cv2.INTER_NEAREST,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=self.mask_fill)
        return out, m.astype(dt, copy=False)

    def __repr__(self):
        return "RandomRotation(degrees=%g, p=%g)" % (self.degrees, self.p)


class ColorJitter(RandomTransform):
    """Random brightness, contrast and saturation (image only), factors in ``[1-x, 1+x]``."""

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0,
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.brightness, self.contrast, self.saturation = brightness, contrast, saturation

    def __call__(self, img, mask):
        img = _np(img)

        def factors(g):
            return [g.uniform(max(0.0, 1 - x), 1 + x) if x else 1.0
                    for x in (self.brightness, self.contrast, self.saturation)]
        b, c, s = self.rng.draw(factors)
        out = img.astype(np.float32)
        if b != 1.0:
            out *= b
        if c != 1.0:
            mean = out.mean()
            out = (out - mean) * c + mean
        if s != 1.0 and out.shape[2] == 3:
            grey = out @ np.array([0.299, 0.587, 0.114], np.float32)
            out = (out - grey[:, :, None]) * s + grey[:, :, None]
        return np.clip(out, 0, 255).astype(np.uint8), _np(mask)

    def __repr__(self):
        return "ColorJitter(brightness=%g, contrast=%g, saturation=%g)" % (
            self.brightness, self.contrast, self.saturation)


class RandomGaussianBlur(RandomTransform):
    """Blur the image (only) with probability ``p``, sigma drawn from ``[0, max_sigma)``
    (gluoncv/PSPNet: ``p=0.5``, radius ``random.random()``)."""

    def __init__(self, p: float = 0.5, max_sigma: float = 1.0, seed: Optional[int] = None):
        super().__init__(seed)
        self.p, self.max_sigma = p, max_sigma

    def __call__(self, img, mask):
        img = _np(img)
        apply, sigma = self.rng.draw(lambda g: (g.random() < self.p,
                                                g.random() * self.max_sigma))
        if apply and sigma > 0.05:
            img = _hwc(cv2.GaussianBlur(img, (0, 0), sigmaX=sigma))
        return img, _np(mask)

    def __repr__(self):
        return "RandomGaussianBlur(p=%g, max_sigma=%g)" % (self.p, self.max_sigma)


class ResizeShort:
    """Resize so the short side is ``size`` (gluoncv's validation resize, truncating).

    ``pil=True`` resizes the image with Pillow's bilinear filter, exactly as gluoncv's
    ``val`` mode does (it antialiases when shrinking, OpenCV's does not: a mean difference of
    about 0.8/255 and up to 52/255 at crop 128), and 8-bit masks with Pillow's nearest
    neighbour too; the default is OpenCV's, faster (nearest neighbour with pixel-centre
    sampling for masks).

    An output larger than ``max_pixels`` (an extreme aspect ratio) raises
    :class:`~gluon_data.errors.DecodeError` before anything is allocated.
    """

    def __init__(self, size: int, pil: bool = False,
                 max_pixels: Optional[int] = DEFAULT_MAX_PIXELS):
        if size <= 0:
            raise ValueError("size must be positive, got %r" % (size,))
        self.size, self.pil, self.max_pixels = size, pil, max_pixels

    def __call__(self, img, mask):
        img, mask = _np(img), _np(mask)
        h, w = mask.shape
        if w > h:
            oh, ow = self.size, int(1.0 * w * self.size / h)
        else:
            ow, oh = self.size, int(1.0 * h * self.size / w)
        _check_derived(h, w, oh, ow, self.max_pixels, "ResizeShort(%d)" % self.size)
        m, dt = _mask_for_cv(mask)
        if self.pil and img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] in (1, 3):
            from PIL import Image
            src = Image.fromarray(img[:, :, 0] if img.shape[2] == 1 else img)
            img = _hwc(np.asarray(src.resize((ow, oh), Image.BILINEAR)))
            if m.dtype == np.uint8:  # PIL's nearest, as gluoncv (OpenCV's rounds otherwise
                m = np.asarray(Image.fromarray(m).resize((ow, oh), Image.NEAREST))  # rarely)
            else:
                m = resize_mask(m, ow, oh)
        else:
            img, m = _resize_pair(img, m, ow, oh)
        return img, m.astype(dt, copy=False)

    def __repr__(self):
        return "ResizeShort(%d%s)" % (self.size, ", pil=True" if self.pil else "")


class Resize:
    """Resize to exactly ``(height, width)``."""

    def __init__(self, size: Union[int, Tuple[int, int]]):
        self.size = (size, size) if np.isscalar(size) else tuple(size)

    def __call__(self, img, mask):
        m, dt = _mask_for_cv(_np(mask))
        img, m = _resize_pair(_np(img), m, self.size[1], self.size[0])
        return img, m.astype(dt, copy=False)


class CenterCrop:
    """Crop the centre ``size`` square (offsets rounded as gluoncv does); pads if smaller."""

    def __init__(self, size: int, image_fill=0, mask_fill: int = -1):
        self.size, self.image_fill, self.mask_fill = size, image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = _pad_to(_np(img), _np(mask), self.size, self.size, self.image_fill,
                            self.mask_fill)
        h, w = mask.shape
        x1, y1 = int(round((w - self.size) / 2.)), int(round((h - self.size) / 2.))
        return (img[y1:y1 + self.size, x1:x1 + self.size],
                mask[y1:y1 + self.size, x1:x1 + self.size])

    def __repr__(self):
        return "CenterCrop(%d)" % self.size
