"""Gluon datasets over record stores: the public classes, and every dataset name.

:class:`ClassificationDataset` and :class:`SegmentationDataset` (:mod:`gluon_data.gluon.taskdatasets`)
read any :class:`~gluon_data.stores.base.RecordStore` (a ``.rec``, an LMDB split, a legacy LMDB read
in place, or whatever :func:`~gluon_data.stores.base.open_store` opens); the public classes here
(``ImageRecordDataset``, ``SegmentationLMDBDataset``, ``RecipeLMDBDataset``, ...) are thin
views that open a store and pass every option through. Stores hold no OS handle across
``fork`` or pickling, so every dataset works unchanged under ``DataLoader(num_workers=N)``,
``DataLoader(thread_pool=True)`` and the ``spawn`` start method.

Every dataset accepts a :class:`~gluon_data.sampling.sampler.SampleKey` wherever it accepts an ``int``;
seeded random transforms then draw from ``sample_rng(seed, epoch, index)`` only (see
:class:`SegmentationDataset` and the README's "Randomness").

A view given a URI (``s3://bucket/train.rec``, ``s3://bucket/voc.lmdb``, a ``.shards.json``
manifest there) reads from object storage; its ``remote``
(:class:`~gluon_data.storage.options.RemoteOptions`: fsspec's ``storage_options``, the
download cache's ``cache_dir`` / ``cache_limit``) goes to the remote store
:func:`~gluon_data.stores.base.open_store` opens (see
:class:`~gluon_data.stores.remote.stores.RemoteStore`). Given with a local path, they are a
``ValueError`` naming them: nothing would use them.
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional, cast

from .fastpath import numpy_classification_transform, numpy_image_transform
from ..arrays.base import open_location
from ..format.codec import DEFAULT_MAX_PIXELS as _DEFAULT_MAX_PIXELS
from ..arrays.datasets import remote_options
from ..storage.options import RemoteOptions, refuse_unknown, take_grouped
from ..stores.base import is_uri, open_store
from ..stores.recipe_layout import RecipeLayout
from .taskdatasets import (MODES, ClassificationDataset,  # noqa: F401
                           SegmentationDataset, default_joint_transform)

__all__ = ["ClassificationDataset", "SegmentationDataset",
           "ImageRecordDataset", "SegmentationRecordDataset", "ImageLMDBDataset",
           "SegmentationLMDBDataset", "RecipeLMDBDataset", "CaffeLMDBDataset",
           "open_segmentation", "numpy_image_transform", "numpy_classification_transform"]


def _local_only(cls: str, path) -> None:
    """The legacy layouts are read in place from a local folder only."""
    if is_uri(path):
        raise ValueError("%s reads a legacy LMDB in place from a local folder, and %s is a "
                         "URI: copy the environment folder here first, or convert it with "
                         "`gluon-data convert` (its outputs read from object storage)"
                         % (cls, path))


def _legacy_split(cls: str, value, default):
    """Before the store layer, ``split`` was the second positional argument of the LMDB
    classes: a string there is still taken as the split, with a warning."""
    warnings.warn("%s(path, %r, ...): split is keyword-only now; write split=%r"
                  % (cls, value, value), DeprecationWarning, stacklevel=3)
    return value, default


class ImageRecordDataset(ClassificationDataset):
    """Classification images and labels from a ``.rec`` (ours or stock im2rec output).

    A drop-in for :class:`mxnet.gluon.data.vision.ImageRecordDataset` with the same
    outputs, but safe under ``thread_pool=True``, with a compact index shared by forked
    workers, checksums verified and typed errors naming file, record and offset. A view of
    :class:`ClassificationDataset` over ``open_store(filename)``.

    Parameters
    ----------
    filename : str
        Path or URI of the ``.rec``; its ``.idx`` (and ``.meta.json`` if present) lie beside
        it.
    flag, transform, seed, verify, max_pixels, output
        As for :class:`ClassificationDataset`.
    remote : RemoteOptions or dict, optional
        A dataset in object storage: its fsspec ``storage_options`` (``endpoint_url``,
        ``key`` / ``secret``, ``client_kwargs``...), and the ``cache_dir`` and
        ``cache_limit`` of its download (defaults ``$GLUON_DATA_CACHE_DIR`` /
        ``$GLUON_DATA_CACHE_LIMIT``): :class:`~gluon_data.storage.options.RemoteOptions`, or
        a dict of those keys. The same keywords given separately still work, with a
        ``DeprecationWarning``.

    Examples
    --------
    >>> ds = ImageRecordDataset("train.rec")
    >>> img, label = ds[0]
    >>> img.dtype, img.shape[2], label
    (<class 'numpy.uint8'>, 3, 0.0)
    """

    def __init__(self, filename: str, flag: int = 1, transform: Optional[Callable] = None,
                 *, seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS, output: Optional[str] = None,
                 remote: Optional[RemoteOptions] = None, **deprecated):
        store = open_location("ImageRecordDataset", filename,
                              remote=remote_options("ImageRecordDataset", remote, deprecated))
        super().__init__(store, flag, transform, seed=seed, verify=verify,
                         max_pixels=max_pixels, output=output)


class ImageLMDBDataset(ClassificationDataset):
    """Classification images and labels from one split of an LMDB dataset.

    Same outputs and options as :class:`ImageRecordDataset`; the environment is opened
    lazily, read-only and lock-free in each process.

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory written by ``gluon-data convert``, or its URI.
    flag, transform, seed, verify, max_pixels, output
        As for :class:`ClassificationDataset`.
    split : str, default 'train'
        Split (sub-database) to read.
    remote : RemoteOptions or dict, optional
        A dataset in object storage, as for :class:`ImageRecordDataset`.

    Examples
    --------
    >>> ds = ImageLMDBDataset("photos.lmdb", split="train")
    >>> img, label = ds[0]
    >>> ds.store.split, img.dtype
    ('train', <class 'numpy.uint8'>)
    """

    def __init__(self, path: str, flag: int = 1, transform: Optional[Callable] = None,
                 *, split: str = "train", seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS, output: Optional[str] = None,
                 remote: Optional[RemoteOptions] = None, **deprecated):
        remote = remote_options("ImageLMDBDataset", remote, deprecated)
        if isinstance(flag, str):  # the old ImageLMDBDataset(path, split, flag)
            split, flag = _legacy_split("ImageLMDBDataset", flag, None)
            flag, transform = (1, transform) if callable(transform) or transform is None \
                else (transform, None)
        store = open_location("ImageLMDBDataset", path, split, remote=remote)
        super().__init__(store, flag, transform, seed=seed, verify=verify,
                         max_pixels=max_pixels, output=output)


class CaffeLMDBDataset(ClassificationDataset):
    """A Caffe ``convert_imageset`` LMDB read in place: ``(image uint8 HxWxC, label float)``,
    the same outputs and options as :class:`ImageRecordDataset` (a view of
    :class:`ClassificationDataset` over :class:`~gluon_data.stores.legacy.CaffeLMDBStore`).

    Parameters
    ----------
    path : str
        The LMDB directory.
    flag, transform, seed, verify, max_pixels
        As for :class:`ClassificationDataset`.

    Examples
    --------
    >>> ds = CaffeLMDBDataset("ilsvrc12_train_lmdb")
    >>> img, label = ds[0]
    >>> img.dtype, type(label)
    (<class 'numpy.uint8'>, <class 'float'>)
    """

    def __init__(self, path: str, flag: int = 1, transform: Optional[Callable] = None,
                 *, seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS):
        _local_only("CaffeLMDBDataset", path)
        super().__init__(open_store(path, layout="caffe-lmdb"), flag, transform, seed=seed,
                         verify=verify, max_pixels=max_pixels)


class SegmentationRecordDataset(SegmentationDataset):
    """Image and mask pairs from a ``.rec`` written by ``gluon-data convert``: a view of
    :class:`SegmentationDataset` over ``open_store(filename)``.

    Parameters
    ----------
    filename : str
        Path or URI of the ``.rec``; ``.idx`` and ``.meta.json`` lie beside it.
    transform, ignore_value, mode, base_size, crop_size, joint_transform, seed, verify, max_pixels
        As for :class:`SegmentationDataset`; so is ``mask_dtype``.
    output : {None, 'uint8'}
        As for :class:`SegmentationDataset`: CxHxW uint8 images, for
        :class:`gluon_data.InputNormalize` in the consumer.
    remote : RemoteOptions or dict, optional
        A dataset in object storage, as for :class:`ImageRecordDataset`.

    Examples
    --------
    >>> from mxnet.gluon.data.vision import transforms
    >>> ds = SegmentationRecordDataset("voc_train.rec")
    >>> img, mask = ds[0]
    >>> img.shape[:2] == mask.shape, img.dtype, mask.dtype
    (True, <class 'numpy.uint8'>, <class 'numpy.int32'>)
    >>> input_transform = transforms.Compose([transforms.ToTensor(),
    ...     transforms.Normalize([.485, .456, .406], [.229, .224, .225])])
    >>> train = SegmentationRecordDataset("voc_train.rec", mode="train", base_size=520,
    ...                                   crop_size=480, transform=input_transform)
    >>> train[0][0].shape, train.num_class, train.fast_path is not None
    ((3, 480, 480), 21, True)
    """

    def __init__(self, filename: str, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, mode: Optional[str] = None,
                 base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None, remote: Optional[RemoteOptions] = None,
                 mask_dtype: str = "int32", **deprecated):
        store = open_location("SegmentationRecordDataset", filename,
                              remote=remote_options("SegmentationRecordDataset", remote,
                                                    deprecated))
        super().__init__(store, transform, ignore_value, mode=mode,
                         base_size=base_size, crop_size=crop_size,
                         joint_transform=joint_transform, seed=seed, verify=verify,
                         max_pixels=max_pixels, output=output, mask_dtype=mask_dtype)


class SegmentationLMDBDataset(SegmentationDataset):
    """Image and mask pairs from one split of an LMDB dataset: a view of
    :class:`SegmentationDataset` over ``open_store(path, split)``.

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory written by ``gluon-data convert``, or its URI.
    transform, ignore_value, mode, base_size, crop_size, joint_transform, seed, verify, max_pixels
        As for :class:`SegmentationDataset`; so is ``mask_dtype``.
    output : {None, 'uint8'}
        As for :class:`SegmentationDataset`: CxHxW uint8 images, for
        :class:`gluon_data.InputNormalize` in the consumer.
    split : str, default 'train'
        Split (sub-database) to read.
    remote : RemoteOptions or dict, optional
        A dataset in object storage, as for :class:`ImageRecordDataset`.

    Examples
    --------
    >>> ds = SegmentationLMDBDataset("voc.lmdb", split="train")
    >>> img, mask = ds[0]
    >>> ds.classes[:2], img.dtype
    (['background', 'airplane'], <class 'numpy.uint8'>)
    """

    def __init__(self, path: str, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, split: str = "train",
                 mode: Optional[str] = None, base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None, remote: Optional[RemoteOptions] = None,
                 mask_dtype: str = "int32", **deprecated):
        remote = remote_options("SegmentationLMDBDataset", remote, deprecated)
        if isinstance(transform, str):
            (split, transform) = _legacy_split("SegmentationLMDBDataset", transform, None)
        store = open_location("SegmentationLMDBDataset", path, split, remote=remote)
        super().__init__(store, transform, ignore_value, mode=mode,
                         base_size=base_size, crop_size=crop_size,
                         joint_transform=joint_transform, seed=seed, verify=verify,
                         max_pixels=max_pixels, output=output, mask_dtype=mask_dtype)


class RecipeLMDBDataset(SegmentationDataset):
    """An LMDB in the original recipe's layout, read in place (no conversion): a view of
    :class:`SegmentationDataset` over :class:`~gluon_data.stores.legacy.RecipeLMDBStore`, so it has
    the same outputs, modes, ignore mapping and fast paths as
    :class:`SegmentationLMDBDataset`, and unlike the recipe's own class it works in forked
    DataLoader workers and pickles.

    Parameters
    ----------
    path : str
        The LMDB directory with ``<split>_data`` / ``<split>_label`` sub-databases.
    transform, ignore_value, mode, base_size, crop_size, joint_transform, seed, verify, max_pixels
        As for :class:`SegmentationDataset`; so is ``mask_dtype``.
    output : {None, 'uint8'}
        As for :class:`SegmentationDataset`: CxHxW uint8 images, for
        :class:`gluon_data.InputNormalize` in the consumer.
    split : str, default 'train'
    layout : RecipeLayout or dict
        What the layout does not record: the stored ``image_shape`` (required),
        ``mask_shape``, ``channels_first`` and ``bgr``, the ``ignore_label`` (returned as
        ``ignore_value``) and ``num_classes``
        (:class:`~gluon_data.stores.recipe_layout.RecipeLayout`, or a dict of those keys).
        The same keywords given separately still work, with a ``DeprecationWarning``.

    Examples
    --------
    >>> from gluon_data.stores.recipe_layout import RecipeLayout
    >>> ds = RecipeLMDBDataset("old.lmdb", split="train",
    ...                        layout=RecipeLayout((24, 32, 3), ignore_label=255, num_classes=21))
    >>> img, mask = ds[0]
    >>> img.shape, mask.shape, ds.num_class
    ((24, 32, 3), (24, 32), 21)
    """

    def __init__(self, path: str, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, split: str = "train",
                 layout: Optional[RecipeLayout] = None, mode: Optional[str] = None,
                 base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None, mask_dtype: str = "int32", **deprecated):
        # take_grouped gives a RecipeLayout always (its defaults for None)
        layout = cast(RecipeLayout, take_grouped(RecipeLayout, layout, "RecipeLMDBDataset",
                                                 "layout", deprecated))
        refuse_unknown("RecipeLMDBDataset", deprecated)
        if isinstance(transform, str):
            (split, transform) = _legacy_split("RecipeLMDBDataset", transform, None)
        _local_only("RecipeLMDBDataset", path)
        store = open_store(path, split, layout="raw-lmdb", **layout.store_options())
        super().__init__(store, transform, ignore_value, mode=mode, base_size=base_size,
                         crop_size=crop_size, joint_transform=joint_transform, seed=seed,
                         verify=verify, max_pixels=max_pixels, output=output,
                         mask_dtype=mask_dtype)


def open_segmentation(path: str, split: Optional[str] = None, *,
                      remote: Optional[RemoteOptions] = None, **kwargs) -> SegmentationDataset:
    """A :class:`SegmentationDataset` over ``open_store(path, split)`` (any store, local or
    a URI with ``remote`` as for :class:`SegmentationRecordDataset`); ``kwargs`` are its
    options."""
    remote = take_grouped(RemoteOptions, remote, "open_segmentation", "remote", kwargs)
    store = open_location("open_segmentation", path, split, remote=remote)
    return SegmentationDataset(store, **kwargs)
