"""Joint (image, mask) transforms for segmentation, in numpy/OpenCV, seeded explicitly.

Every transform takes ``(image, mask)`` — image HxWxC uint8 (numpy or NDArray), mask HxW
integer — and returns numpy arrays. Geometry is applied to both (images bilinear, masks
nearest neighbour with pixel-centre sampling, as PIL does); photometric changes touch the image
only. Padding fills masks with the ignore value, never with a class.

Masks are resized by our own index map (:func:`nearest_index`, in
:mod:`gluon_data.arrays.scalecrop` with the fused ``train`` transform :class:`RandomScaleCrop`),
not by OpenCV, so they are the same on every stack.

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

from typing import Callable, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from ..format.codec import DEFAULT_MAX_PIXELS
from ..errors import DecodeError
from ..sampling.seeding import SeededRandom, RandomTransform, sample_context
from .blur import gaussian_blur
from .scalecrop import RandomScaleCrop, map_values, nearest_index, resize_mask
from .tensorize import ImageCropNormalize, ToTensorNormalize, as_hwc, to_numpy

__all__ = ["nearest_index", "resize_mask", "map_values", "default_joint_transform", "Compose",
           "RandomHorizontalFlip", "RandomScale", "RandomCrop", "RandomScaleCrop",
           "RandomRotation",
           "ColorJitter", "RandomGaussianBlur", "ResizeShort", "Resize", "CenterCrop",
           "ToTensorNormalize", "SeededRandom", "ImageCropNormalize", "sample_context"]


def _check_derived(h: int, w: int, oh: int, ow: int, max_pixels: Optional[int],
                   name: str) -> None:
    """Refuse an output size derived from the input's aspect ratio that exceeds
    ``max_pixels``, before allocating it (a 1x30000 strip resized to a short side of 480
    would be 480x14400000)."""
    if max_pixels and oh * ow > max_pixels:
        raise DecodeError("%s of a %dx%d image gives %dx%d = %d pixels, more than max_pixels=%d"
                          % (name, w, h, ow, oh, oh * ow, max_pixels))


def _resize_pair(img, mask, ow: int, oh: int):
    img = as_hwc(cv2.resize(img, (ow, oh), interpolation=cv2.INTER_LINEAR))
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
        img, mask = to_numpy(img), to_numpy(mask)
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
        img, mask = to_numpy(img), to_numpy(mask)
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
        img, mask = to_numpy(img), to_numpy(mask)
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

    def __init__(self, crop_size: Union[int, Tuple[int, int]],
                 image_fill: Union[float, Sequence[float]] = 0, mask_fill: int = -1,
                 seed: Optional[int] = None) -> None:
        super().__init__(seed)
        self.size = (crop_size, crop_size) if np.isscalar(crop_size) else tuple(crop_size)
        if min(self.size) <= 0:
            raise ValueError("crop_size must be positive, got %r" % (crop_size,))
        self.image_fill, self.mask_fill = image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = to_numpy(img), to_numpy(mask)
        ch, cw = self.size
        img, mask = _pad_to(img, mask, ch, cw, self.image_fill, self.mask_fill)
        h, w = mask.shape
        y1, x1 = self.rng.draw(lambda g: (int(g.integers(0, h - ch + 1)),
                                          int(g.integers(0, w - cw + 1))))
        return img[y1:y1 + ch, x1:x1 + cw], mask[y1:y1 + ch, x1:x1 + cw]

    def __repr__(self):
        return "RandomCrop(%s, mask_fill=%d)" % (self.size, self.mask_fill)


class RandomRotation(RandomTransform):
    """Rotate by an angle drawn from ``[-degrees, degrees]`` with probability ``p``.

    Corners uncovered by the rotation get ``image_fill`` and ``mask_fill`` (ignore).
    """

    def __init__(self, degrees: float = 10.0, p: float = 1.0,
                 image_fill: Union[float, Sequence[float]] = 0, mask_fill: int = -1,
                 seed: Optional[int] = None) -> None:
        super().__init__(seed)
        self.degrees, self.p, self.image_fill, self.mask_fill = degrees, p, image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = to_numpy(img), to_numpy(mask)
        apply, angle = self.rng.draw(lambda g: (g.random() < self.p,
                                                g.uniform(-self.degrees, self.degrees)))
        if not apply:
            return img, mask
        h, w = mask.shape
        mat = cv2.getRotationMatrix2D((w / 2.0, h / 2.0), angle, 1.0)
        fill = self.image_fill if np.ndim(self.image_fill) else [self.image_fill] * 3
        out = as_hwc(cv2.warpAffine(img, mat, (w, h), flags=cv2.INTER_LINEAR,
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
        img = to_numpy(img)

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
        return np.clip(out, 0, 255).astype(np.uint8), to_numpy(mask)

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
        img = to_numpy(img)
        apply, sigma = self.rng.draw(lambda g: (g.random() < self.p,
                                                g.random() * self.max_sigma))
        if apply and sigma > 0.05:
            img = as_hwc(gaussian_blur(img, sigma))
        return img, to_numpy(mask)

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
        img, mask = to_numpy(img), to_numpy(mask)
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
            img = as_hwc(np.asarray(src.resize((ow, oh), Image.BILINEAR)))
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
        m, dt = _mask_for_cv(to_numpy(mask))
        img, m = _resize_pair(to_numpy(img), m, self.size[1], self.size[0])
        return img, m.astype(dt, copy=False)


class CenterCrop:
    """Crop the centre ``size`` square (offsets rounded as gluoncv does); pads if smaller."""

    def __init__(self, size: int, image_fill: Union[float, Sequence[float]] = 0,
                 mask_fill: int = -1) -> None:
        self.size, self.image_fill, self.mask_fill = size, image_fill, mask_fill

    def __call__(self, img, mask):
        img, mask = _pad_to(to_numpy(img), to_numpy(mask), self.size, self.size, self.image_fill,
                            self.mask_fill)
        h, w = mask.shape
        x1, y1 = int(round((w - self.size) / 2.)), int(round((h - self.size) / 2.))
        return (img[y1:y1 + self.size, x1:x1 + self.size],
                mask[y1:y1 + self.size, x1:x1 + self.size])

    def __repr__(self):
        return "CenterCrop(%d)" % self.size


def default_joint_transform(mode: str, base_size: int, crop_size: int, mask_fill: int,
                            seed: Optional[int] = None,
                            max_pixels: Optional[int] = DEFAULT_MAX_PIXELS
                            ) -> Optional[Callable]:
    """The joint transform gluoncv's ``SegmentationDataset`` applies in ``mode``
    (train: mirror, random scale, pad + random crop, blur, fused into one
    :class:`~gluon_data.arrays.transforms.RandomScaleCrop`; val: short-side resize with Pillow's
    bilinear filter, as gluoncv, + centre crop),
    except that padded mask pixels get ``mask_fill`` (the ignore value) instead of class 0."""
    if mode == "train":
        return RandomScaleCrop(base_size, crop_size, image_fill=0, mask_fill=mask_fill,
                                 seed=seed)
    if mode == "val":
        return Compose([ResizeShort(crop_size, pil=True,  # gluoncv's exact values
                                        max_pixels=max_pixels),
                          CenterCrop(crop_size, 0, mask_fill)])
    return None
