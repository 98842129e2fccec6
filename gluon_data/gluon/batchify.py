"""Batchify functions for segmentation: stack or pad (image with 0, mask with ignore)."""
from __future__ import annotations

from typing import Sequence

import mxnet as mx
import numpy as np

from .buffers import batch_buffer, host_view, stack_staged

__all__ = ["SegmentationBatchify", "MultiSizeBatchify", "StackBatchify"]


class SegmentationBatchify:
    """Collate ``(image, mask)`` samples of possibly different sizes into one batch.

    Images (HxWxC or CxHxW) are padded at the bottom/right with ``image_pad`` and masks
    (HxW) with ``mask_pad`` up to the largest size in the batch, and copied once, straight
    into one NDArray per field: samples are read in place (no ``asnumpy``) and, in a
    DataLoader worker, the batch is allocated in shared memory, so it reaches the main
    process without another copy. Only padding pixels are filled. Samples may be NDArrays
    or numpy arrays.

    Parameters
    ----------
    mask_pad : int, default -1
        Value for padded mask pixels: the ignore value, so padding never trains a class.
    image_pad : float, default 0
        Value for padded image pixels.
    channels_first : bool, default False
        Whether images are CxHxW (after ``ToTensor``) rather than HxWxC.

    Examples
    --------
    >>> b = SegmentationBatchify()
    >>> imgs, masks = b([(np.zeros((2, 3, 3), np.uint8), np.zeros((2, 3), np.int32)),
    ...                  (np.zeros((4, 2, 3), np.uint8), np.zeros((4, 2), np.int32))])
    >>> imgs.shape, masks.shape, int(masks.asnumpy()[0, 3, 0])
    ((2, 4, 3, 3), (2, 4, 3), -1)
    """

    def __init__(self, mask_pad: int = -1, image_pad: float = 0, channels_first: bool = False):
        self.mask_pad = mask_pad
        self.image_pad = image_pad
        self.channels_first = channels_first

    def __call__(self, samples: Sequence):
        if samples and isinstance(samples[0][1], str):  # mode='test': (image, name)
            raise TypeError("SegmentationBatchify pads (image, mask) pairs; these samples are "
                            "(image, name), as mode='test' gives them: batch them with "
                            "MultiSizeBatchify (gluoncv's ms_batchify_fn), or batch_size=1")
        imgs = [host_view(s[0]) for s in samples]
        masks = [host_view(s[1]) for s in samples]
        hax = 1 if self.channels_first else 0
        h = max(m.shape[0] for m in masks)
        w = max(m.shape[1] for m in masks)
        ishape = list(imgs[0].shape)
        ishape[hax], ishape[hax + 1] = h, w
        chans = imgs[0].shape[2 if hax == 0 else 0]
        for k, (im, m) in enumerate(zip(imgs, masks)):
            if im.shape[hax:hax + 2] != m.shape or im.shape[2 if hax == 0 else 0] != chans:
                raise ValueError("sample %d: image %s and mask %s do not match (or the channel "
                                 "count differs from sample 0's); is channels_first=%s right?"
                                 % (k, im.shape, m.shape, self.channels_first))
        if all(m.shape == (h, w) for m in masks):  # nothing to pad: samples staged in a
            nd_i, nd_m = stack_staged(imgs), stack_staged(masks)  # worker need no copy
        else:
            nd_i = nd_m = None
        if nd_i is None:
            nd_i, out_i = batch_buffer([len(imgs)] + ishape, imgs[0].dtype)
            for k, im in enumerate(imgs):
                dst = out_i[k] if self.channels_first else out_i[k].transpose(2, 0, 1)
                _paste(dst, im if self.channels_first else im.transpose(2, 0, 1),
                       self.image_pad)
        if nd_m is None:
            nd_m, out_m = batch_buffer((len(masks), h, w), masks[0].dtype)
            for k, m in enumerate(masks):
                _paste(out_m[k], m, self.mask_pad)
        return nd_i, nd_m


def _paste(dst: np.ndarray, src: np.ndarray, fill) -> None:
    """``dst[..., :h, :w] = src``; the rest of ``dst`` (the padding) set to ``fill``."""
    h, w = src.shape[-2:]
    dst[..., :h, :w] = src
    if h < dst.shape[-2]:
        dst[..., h:, :] = fill
    if w < dst.shape[-1]:
        dst[..., :h, w:] = fill


class StackBatchify:
    """Stack samples of equal shapes, field by field — Gluon's default batchify, faster.

    ``[(img1, label1), (img2, label2)] -> [imgs, labels]`` (a bare array per sample gives one
    array), with the same shapes and dtypes Gluon's default gives, but each field copied once
    straight into its batch, which a DataLoader worker allocates in reusable shared memory
    (see :class:`SegmentationBatchify`). For classification, e.g. after
    ``ImageRecordDataset(...).transform_first(...)``.

    Examples
    --------
    >>> imgs, labels = StackBatchify()([(np.zeros((3, 2, 2), np.float32), 1.0),
    ...                                 (np.ones((3, 2, 2), np.float32), 0.0)])
    >>> imgs.shape, labels.asnumpy().tolist()
    ((2, 3, 2, 2), [1.0, 0.0])
    """

    def __call__(self, samples: Sequence):
        if isinstance(samples[0], (tuple, list)):
            return [self._stack([s[k] for s in samples], k) for k in range(len(samples[0]))]
        return self._stack(samples, 0)

    @staticmethod
    def _stack(items, field: int):
        arrays = [host_view(x) for x in items]
        shape, dtype = arrays[0].shape, arrays[0].dtype
        for k, a in enumerate(arrays):
            if a.shape != shape:
                raise ValueError("field %d of sample %d has shape %s, sample 0's has %s: "
                                 "StackBatchify needs equal shapes (pad with "
                                 "SegmentationBatchify, or keep lists with MultiSizeBatchify)"
                                 % (field, k, a.shape, shape))
        nd = stack_staged(arrays)
        if nd is not None:
            return nd
        nd, view = batch_buffer((len(arrays),) + shape, dtype)
        for k, a in enumerate(arrays):
            view[k] = a
        return nd


class MultiSizeBatchify:
    """Keep samples of different sizes as lists, like gluoncv's ``ms_batchify_fn``.

    ``[(img1, mask1), (img2, mask2)] -> [[img1, img2], [mask1, mask2]]``; strings (``test``
    mode names) and NDArrays are left as they are. For multi-scale evaluation.

    Examples
    --------
    >>> out = MultiSizeBatchify()([(mx.nd.zeros((2, 3)), "a"), (mx.nd.zeros((4, 5)), "b")])
    >>> [x.shape for x in out[0]], out[1]
    ([(2, 3), (4, 5)], ['a', 'b'])
    """

    def __call__(self, data):
        first = data[0]
        if isinstance(first, (str, mx.nd.NDArray, np.ndarray)):
            return list(data)
        if isinstance(first, (tuple, list)):
            return [self(list(field)) for field in zip(*data)]
        raise TypeError("cannot batchify samples of type %s" % type(first).__name__)
