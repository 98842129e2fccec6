"""The Gaussian blur of the ``train`` augmentation: ``cv2.GaussianBlur(img, (0, 0),
sigmaX=sigma)``, pixel for pixel, faster on uint8 images.

OpenCV 4 blurs an 8-bit image in fixed point, and so exactly: its kernel
(:func:`fixed_point_kernel`) has 8 fraction bits and sums to 256, the two passes sum
tap * sample in integers, and each output is rounded half up. The optional C routine
(``gluon_data/arrays/_blur.c``, built at install with a C compiler) runs the same integer
arithmetic in one vector loop per pass: 0.26 / 0.37 / 0.52 ms against OpenCV's 0.33 / 0.45 /
0.75 ms for 3 / 5 / 7 taps on a 480x480 RGB crop (one thread). Whether the installed OpenCV
gives those pixels is checked once, when this module loads; where it does not, where the
routine is not built, and for other dtypes, kernels of more than 11 taps, images of other
than 1 to 4 channels or whose height or width is not above the kernel's radius, OpenCV blurs
(and so raises where OpenCV raises, e.g. for an infinite sigma). The same pixels either way.
"""
from __future__ import annotations

from typing import Tuple

import cv2
import numpy as np

try:  # the optional C extension (setup.py); absent: OpenCV blurs, the same pixels
    from . import _blur  # type: ignore[attr-defined]  # C extension, no stub
except ImportError:  # pragma: no cover - depends on the install
    _blur = None

__all__ = ["gaussian_blur", "kernel_size", "fixed_point_kernel"]

#: The C routine's largest radius (11 taps: sigma up to about 1.75).
MAX_RADIUS = 5
_MAX_SIGMA = 2.0  # above every sigma of MAX_RADIUS taps (a bound before kernel_size's int)


def kernel_size(sigma: float) -> int:
    """The number of taps OpenCV gives a uint8 blur of ``sigma`` > 0 with ``ksize=(0, 0)``:
    ``cvRound(6 sigma + 1) | 1`` (rounding half to even, as Python's ``round``).

    >>> [kernel_size(s) for s in (0.08, 0.3, 0.6, 0.9)]
    [1, 3, 5, 7]
    """
    return int(round(sigma * 6 + 1)) | 1


def fixed_point_kernel(sigma: float) -> Tuple[int, ...]:
    """OpenCV's 8-bit kernel for ``sigma`` > 0, half of it, the centre tap first: the taps
    of its bit-exact kernel (``cv2.getGaussianKernel(n, sigma, cv2.CV_64F)``) times 256,
    rounded with the error carried inward from the outermost tap, the centre taking what
    makes the sum 256 (``getGaussianKernelFixedPoint_ED``).

    >>> fixed_point_kernel(0.6)
    (170, 42, 1)
    """
    n = kernel_size(sigma)
    exact = cv2.getGaussianKernel(n, sigma, cv2.CV_64F).ravel().tolist()
    outer, err = [], 0.0
    for i in range(n // 2):
        adjusted = exact[i] * 256.0 + err
        tap = round(adjusted)  # cvRound: half to even
        err = adjusted - tap
        outer.append(tap)
    return (256 - 2 * sum(outer),) + tuple(reversed(outer))


def _agrees_with_opencv() -> bool:
    """Whether the C routine gives the installed OpenCV's pixels (a small image, every
    radius the routine has)."""
    img = np.random.default_rng(0).integers(0, 256, (13, 12, 3), dtype=np.uint8)
    for sigma in (0.08, 0.3, 0.6, 0.9, 1.2, 1.5, 1.7):
        out = np.empty_like(img)
        _blur.gaussian(img, out, 13, 12, 3, fixed_point_kernel(sigma))
        if not np.array_equal(out, cv2.GaussianBlur(img, (0, 0), sigmaX=sigma)):
            return False
    return True


def _routine_usable() -> bool:
    """The C routine is built and gives this OpenCV's pixels (a build that fails the check,
    or raises in it, is not used: OpenCV blurs)."""
    try:
        return _blur is not None and _agrees_with_opencv()
    except Exception:  # e.g. a stale build of another signature
        return False


#: The C routine is built and gives this OpenCV's pixels.
EXACT_ROUTINE = _routine_usable()


def gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    """``cv2.GaussianBlur(img, (0, 0), sigmaX=sigma)`` for an HxW or HxWxC image: a new
    array, the same pixels and shape (an HxWx1 image comes back HxW, as from OpenCV), by the
    C routine where it applies (module docstring).

    >>> img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    >>> bool((gaussian_blur(img, 0.5) == cv2.GaussianBlur(img, (0, 0), sigmaX=0.5)).all())
    True
    """
    c = 1 if img.ndim == 2 else img.shape[-1]
    if (EXACT_ROUTINE and img.dtype == np.uint8 and img.ndim in (2, 3) and 1 <= c <= 4
            and 0 < sigma < _MAX_SIGMA):
        r, (h, w) = kernel_size(sigma) // 2, img.shape[:2]
        if r <= MAX_RADIUS and r < h and r < w:
            src = np.ascontiguousarray(img)
            out = np.empty(src.shape, np.uint8)
            _blur.gaussian(src, out, h, w, c, fixed_point_kernel(sigma))
            return out.reshape(h, w) if c == 1 else out
    return cv2.GaussianBlur(img, (0, 0), sigmaX=sigma)
