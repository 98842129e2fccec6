"""The Gluon task datasets: :class:`ClassificationDataset` and :class:`SegmentationDataset`
over a record store, returning NDArrays.

Each is a Gluon ``Dataset`` and a view of the framework-free dataset of the same name in
:mod:`gluon_data.arrays.datasets`, which makes every sample (records, decoding, modes, seeded
joint transforms, the ignore mapping, region decoding). What this layer adds is Gluon's:
NDArray outputs over pooled buffers (:mod:`gluon_data.gluon.buffers`), Gluon's ``transform``
and ``transform_first``, and Gluon image transforms recognised and run as numpy
(:mod:`gluon_data.gluon.fastpath`).

Both read any :class:`~gluon_data.stores.base.RecordStore` (a ``.rec``, an LMDB split, a legacy
LMDB read in place, objects in S3, or whatever :func:`~gluon_data.stores.base.open_store` opens);
the public classes of :mod:`gluon_data.gluon.datasets` are thin views that open a store and pass
every option through. Stores hold no OS handle across ``fork`` or pickling, so every dataset
works unchanged under ``DataLoader(num_workers=N)``, ``DataLoader(thread_pool=True)`` and
the ``spawn`` start method.

Every dataset accepts a :class:`~gluon_data.sampling.sampler.SampleKey` wherever it accepts an
``int``; seeded random transforms then draw from ``sample_rng(seed, epoch, index)`` only (see
:class:`SegmentationDataset` and the README's "Randomness").
"""
from __future__ import annotations

import copy
from typing import Callable, Optional

import mxnet as mx
import numpy as np

from . import buffers
from ..arrays import datasets as A
from ..arrays.base import container_of
from ..arrays.datasets import MODES, default_joint_transform
from ..arrays.tensorize import OUTPUTS, ImageCropNormalize
from ..format import codec
from ..stores.base import RecordStore
from .fastpath import as_ndarray, tensor_only, numpy_classification_transform

__all__ = ["ClassificationDataset", "SegmentationDataset", "MODES", "OUTPUTS",
           "default_joint_transform"]

_DEFAULT_MAX_PIXELS = codec.DEFAULT_MAX_PIXELS

_CLASS_FOR = {("rec", "classification"): "ImageRecordDataset",
              ("rec", "segmentation"): "SegmentationRecordDataset",
              ("lmdb", "classification"): "ImageLMDBDataset",
              ("lmdb", "segmentation"): "SegmentationLMDBDataset"}


def _image_only(transform) -> bool:
    """Whether ``transform`` is one of Gluon's image transforms, or a chain of blocks
    (``Compose`` is one): each takes one input, the image."""
    return (isinstance(transform, (mx.gluon.nn.Sequential, mx.gluon.nn.HybridSequential))
            or type(transform).__module__.startswith("mxnet.gluon.data.vision"))


class _NDArrays:
    """The output hooks of :class:`gluon_data.arrays.base.StoreDataset`, for Gluon: samples
    as CPU NDArrays, the fast paths' outputs over pooled buffers (no copy)."""

    _file: RecordStore  # set by StoreDataset.__init__ (the class this is mixed into)

    def _task_class(self, task: str) -> str:
        return _CLASS_FOR[container_of(self._file), task]

    def _buffer(self, shape, dtype) -> np.ndarray:
        return buffers.samples.take(shape, dtype)

    def _emit(self, buf: np.ndarray) -> mx.nd.NDArray:
        return buffers.samples.wrap(buf)

    def _out(self, x: np.ndarray, dtype) -> mx.nd.NDArray:
        return as_ndarray(x, dtype)


class ClassificationDataset(_NDArrays, A.ClassificationDataset, mx.gluon.data.Dataset):
    """Classification images and labels from any record store.

    Parameters
    ----------
    store : RecordStore
        From :func:`gluon_data.stores.base.open_store` (or any object satisfying the protocol).
    flag : {0, 1}, default 1
        1: RGB images (HxWx3); 0: greyscale (HxWx1).
    transform : callable, optional
        ``transform(image, label) -> sample``, as in Gluon.
    seed : int, optional
        Seed of a recognised ``transform_first`` fast path's random crop and flip: sample
        ``i`` of epoch ``e`` draws from ``sample_rng(seed, e, i)``. ``None``: fresh entropy.
    verify : bool, default True
        Check each record's CRC-32 when it has one.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.
    output : {None, 'uint8'}, default None
        ``'uint8'``: CxHxW uint8 images, not normalised, for
        :class:`gluon_data.InputNormalize` in the consumer; ``transform_first`` then takes a
        recognised recipe ending in ``ToTensor`` (its crop and flip run, ``ToTensor`` means
        the layout) and refuses a ``Normalize`` or any other transform (``ValueError``).

    Returns
    -------
    (NDArray, label)
        ``uint8`` HWC image (CHW with ``output='uint8'``); label a float, or a float32
        vector for multi-label records.

    Examples
    --------
    >>> from gluon_data.stores.base import open_store
    >>> ds = ClassificationDataset(open_store("train.rec"))
    >>> img, label = ds[0]
    >>> img.dtype, img.ndim, type(label)
    (<class 'numpy.uint8'>, 3, <class 'float'>)
    """

    _first_option = "transform_first"

    def __init__(self, store: RecordStore, flag: int = 1, transform: Optional[Callable] = None,
                 *, seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS, output: Optional[str] = None):
        super().__init__(store, flag, transform, seed=seed, verify=verify,
                         max_pixels=max_pixels, output=output)

    def _first_fallback(self, img: np.ndarray):
        """Mean/std not fitting the image's channels: the Gluon transform runs (and fails
        as Gluon fails)."""
        return self._fast_source(as_ndarray(img, np.uint8))

    def transform_first(self, fn, lazy: bool = True):
        """Gluon's ``transform_first``; a recognised image transform (``RandomResizedCrop`` /
        ``CenterCrop``, ``RandomFlipLeftRight``, ``ToTensor``, ``Normalize``: see
        :func:`numpy_classification_transform`) runs in numpy on the decoded image instead
        of as NDArray operators, with the same results; its random draws come from
        ``sample_rng(seed, epoch, index)`` with the dataset's ``seed``. The fast path is
        visible as :attr:`fast_path` of the returned dataset. Anything else (and any second
        ``transform_first``) goes to Gluon's implementation, composed as Gluon composes it."""
        first = self._fast_first is None or (self.output is not None
                                             and self._fast_source is None)
        fast = (numpy_classification_transform(fn, seed=self.seed)
                if self._transform is None and first else None)
        if self.output is not None:
            if fast is None:
                raise ValueError("output='uint8' runs only a recognised transform_first "
                                 "recipe (crop, flip, ToTensor), once; %r is not one" % (fn,))
            fast = ImageCropNormalize(fast.crop, fast.flip, fast.tensor.mean, fast.tensor.std,
                                      seed=self.seed, uint8=True)
        if fast is None:
            return super().transform_first(fn, lazy)
        clone = copy.copy(self)
        clone._fast_first, clone._fast_source = fast, fn
        return clone


class SegmentationDataset(_NDArrays, A.SegmentationDataset, mx.gluon.data.Dataset):
    """Image and mask pairs from any segmentation record store.

    Without ``mode``, returns the stored samples. With ``mode``, behaves like gluoncv's
    ``SegmentationDataset`` (e.g. ``VOCSegmentation``) so it drops into gluoncv's
    ``train.py``: ``train`` applies the seeded random joint augmentation, ``val`` resizes and
    centre-crops, ``testval`` returns full-size samples, ``test`` returns ``(image, name)``;
    ``transform`` is then the image-only transform (e.g. ``ToTensor`` + ``Normalize``).
    The samples are those of :class:`gluon_data.arrays.SegmentationDataset`, as NDArrays.

    Parameters
    ----------
    store : RecordStore
        From :func:`gluon_data.stores.base.open_store` (or any object satisfying the protocol).
    transform : callable, optional
        Without ``mode``: joint ``transform(image, mask)``. With ``mode``: image-only
        ``transform(image)``, applied last, as in gluoncv: a ``ToTensor`` (+ ``Normalize``)
        runs as numpy on the uint8 pixels (the same values), any other transform is given
        the image as a float32 NDArray, as gluoncv gives it.
    ignore_value : int or None, default -1
        Value returned for the dataset's ignore label (VOC: 255), following gluoncv's
        convention of -1. ``None`` returns the stored value.
    mode : {None, 'train', 'val', 'testval', 'test'}
    base_size : int, default 520
        ``train``: the long side is drawn from ``[0.5, 2.0] x base_size``.
    crop_size : int, default 480
        Output size in ``train`` and ``val``.
    joint_transform : callable, optional
        Replaces the mode's built-in joint transform: ``(image, mask) -> (image, mask)`` on
        numpy arrays (see :mod:`gluon_data.arrays.transforms`).
    seed : int, optional
        Seed of the random joint transforms: sample ``i`` of epoch ``e`` (a
        :class:`~gluon_data.sampling.sampler.SampleKey`; a plain int counts its requests in this
        process as the epoch) draws from ``sample_rng(seed, e, i)`` only, whatever runs it.
        Also reseeds a given ``joint_transform``. ``None``: fresh entropy (a seeded
        ``joint_transform`` keeps its own seed).
    verify : bool, default True
        Check each record's CRC-32.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.
    output : {None, 'uint8'}, default None
        In a mode, ``'uint8'`` returns the image as CxHxW ``uint8``, not normalised (a quarter
        of the float32 tensor's bytes, no arithmetic in the worker), for
        :class:`gluon_data.InputNormalize` to normalise on the batch in the consumer. An
        image ``transform`` then runs on the HxWxC uint8 image and must return one (a Gluon
        ``ToTensor`` alone means the CxHxW layout; a ``Normalize`` is a ``ValueError``).
        ``None``: what ``transform`` makes.
    mask_dtype : {'int32', 'uint8', 'int16'}, default 'int32'
        The masks' dtype, as for :class:`gluon_data.arrays.SegmentationDataset`.

    Returns
    -------
    (NDArray, NDArray)
        ``uint8`` HxWx3 RGB image (or what ``transform`` makes of it; CxHxW uint8 with
        ``output='uint8'``) and HxW mask (``int32``, or ``mask_dtype``).

    Examples
    --------
    >>> from gluon_data.stores.base import open_store
    >>> from gluon_data.sampling.sampler import SampleKey
    >>> ds = SegmentationDataset(open_store("voc.lmdb", "val"), mode="val", crop_size=32)
    >>> img, mask = ds[0]
    >>> img.shape, mask.dtype
    ((32, 32, 3), <class 'numpy.int32'>)
    >>> train = SegmentationDataset(open_store("voc.lmdb", "train"), mode="train",
    ...                             base_size=40, crop_size=32, seed=0)
    >>> a, b = train[SampleKey(1, epoch=3)], train[SampleKey(1, epoch=3)]
    >>> bool((a[0] == b[0]).asnumpy().all())      # (seed, epoch, index) fixes the draws
    True
    """

    def __init__(self, store: RecordStore, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, mode: Optional[str] = None,
                 base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None, mask_dtype: str = "int32"):
        if mode is None and _image_only(transform):
            raise TypeError("transform=%r is an image transform, but without mode the "
                            "transform is joint, transform(image, mask): give mode='train', "
                            "'val', 'testval' or 'test' (gluoncv's mode defaults to its split; "
                            "here it is given)" % (transform,))
        super().__init__(store, transform, ignore_value, mode=mode, base_size=base_size,
                         crop_size=crop_size, joint_transform=joint_transform, seed=seed,
                         verify=verify, max_pixels=max_pixels, output=output,
                         mask_dtype=mask_dtype)

    #: Any other image transform of a mode is given a float32 image, as gluoncv gives it
    #: (``mx.nd.array`` of the decoded pixels): arithmetic on it must not wrap as uint8's.
    _transform_input = np.float32

    def _image_fast_path(self, transform):
        """In a mode, a Gluon ``ToTensor`` (+ ``Normalize``) image transform runs as numpy
        (the same values, :func:`~gluon_data.gluon.fastpath.numpy_image_transform`)."""
        return tensor_only(transform), transform
