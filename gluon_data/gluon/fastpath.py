"""Which Gluon image transforms run as numpy: the datasets' fast-path detection.

A Gluon ``ToTensor`` (+ ``Normalize``) image transform, or the classification recipe
(``RandomResizedCrop`` / ``CenterCrop``, ``RandomFlipLeftRight``, ``ToTensor``,
``Normalize``), costs several NDArray operators per sample, more than decoding the JPEG in
a DataLoader worker. :func:`numpy_image_transform` and :func:`numpy_classification_transform`
recognise such a transform (plain ``Compose`` / ``Sequential`` of those blocks, no hooks)
and return its numpy equivalent from :mod:`gluon_data.arrays.tensorize`, with the same values; the
datasets then run that instead (:mod:`gluon_data.arrays.datasets`), into pooled sample buffers
(:mod:`gluon_data.gluon.buffers`).
"""
from __future__ import annotations

from typing import Optional

import mxnet as mx
import numpy as np
from mxnet.gluon import nn
from mxnet.gluon.data.vision import transforms as VT

from ..arrays.tensorize import ImageCropNormalize, ToTensorNormalize

__all__ = ["numpy_image_transform", "numpy_classification_transform"]


def as_ndarray(x: np.ndarray, dtype) -> mx.nd.NDArray:
    """A CPU NDArray over ``x`` without copying it (``x`` is ours and never touched again)."""
    x = np.ascontiguousarray(x, dtype=dtype)
    if not x.flags.writeable or x.dtype.str[1:] not in ("u1", "i4", "f4"):
        return mx.nd.array(x, dtype=x.dtype)
    return mx.nd.from_numpy(x, zero_copy=True)


def numpy_image_transform(transform) -> Optional[ToTensorNormalize]:
    """The numpy equivalent of a Gluon ``ToTensor()`` or ``Compose([ToTensor(),
    Normalize(mean, std)])`` image transform, else ``None``.

    The segmentation datasets run such a transform as :class:`~gluon_data.arrays.transforms.
    ToTensorNormalize` (the same values to float32 rounding) instead of two NDArray operators
    per sample, which cost more than decoding the JPEG in a DataLoader worker.
    """
    fast = tensor_only(transform)
    return None if fast is None else fast.tensor


def tensor_only(transform) -> Optional[ImageCropNormalize]:
    fast = numpy_classification_transform(transform)
    return None if fast is None or fast.crop is not None or fast.flip else fast


def _gluon_leaves(transform) -> Optional[list]:
    leaves = []

    def walk(block) -> bool:
        if block._forward_hooks or block._forward_pre_hooks:
            return False
        if type(block) in (VT.Compose, nn.Sequential, nn.HybridSequential):
            return all(walk(child) for child in block._children.values())
        leaves.append(block)
        return True

    if not isinstance(transform, mx.gluon.Block) or not walk(transform):
        return None
    return leaves


def numpy_classification_transform(transform, seed: Optional[int] = None
                                   ) -> Optional[ImageCropNormalize]:
    """The numpy equivalent of a Gluon image transform made of an optional
    ``RandomResizedCrop`` or ``CenterCrop``, an optional ``RandomFlipLeftRight``, then
    ``ToTensor`` and optionally ``Normalize`` — the usual training recipe — else ``None``.

    :meth:`ImageRecordDataset.transform_first` runs such a transform as
    :class:`~gluon_data.arrays.transforms.ImageCropNormalize` (the same crop arithmetic, draws and
    OpenCV interpolation) instead of four NDArray operators per sample.
    """
    leaves = _gluon_leaves(transform)
    if not leaves:
        return None
    crop: Optional[tuple] = None  # as ImageCropNormalize takes it: 'random' or 'center'
    if type(leaves[0]) is VT.RandomResizedCrop:
        size, scale, ratio, interp = leaves[0]._args
        crop = ("random", tuple(int(v) for v in size), scale, tuple(ratio), interp)
    elif type(leaves[0]) is VT.CenterCrop:
        size, interp = leaves[0]._args
        crop = ("center", tuple(int(v) for v in size), interp)
    if crop is not None:
        if crop[-1] not in (0, 1, 3, 4):
            # 10 = a random method per call; 2 = bicubic (and 9 when enlarging), whose
            # rounding differs between MXNet's OpenCV and ours (1/255): left to MXNet
            return None
        leaves = leaves[1:]
    flip = bool(leaves) and type(leaves[0]) is VT.RandomFlipLeftRight
    if flip:
        leaves = leaves[1:]
    kinds = [type(b) for b in leaves]
    if kinds == [VT.ToTensor]:
        return ImageCropNormalize(crop, flip, seed=seed)
    if kinds == [VT.ToTensor, VT.Normalize]:
        return ImageCropNormalize(crop, flip, leaves[1]._mean, leaves[1]._std, seed=seed)
    return None
