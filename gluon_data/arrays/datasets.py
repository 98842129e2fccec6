"""The task datasets without a framework: numpy samples from any record store.

:class:`SegmentationDataset` and :class:`ClassificationDataset` read a store (from
:func:`~gluon_data.stores.base.open_store`) or open one from a path or URI (with ``split``
and, for a URI, ``remote``), and return numpy arrays: the same samples as the Gluon datasets of
:mod:`gluon_data.gluon.datasets` (which subclass these and return NDArrays), with gluoncv's
modes, the seeded joint transforms of :mod:`gluon_data.arrays.transforms`, the ignore label
returned as -1 and a crop's box decoded alone (:func:`~gluon_data.format.decode.decode_region`).

They are map-style (``len``, ``ds[i]``), accept a :class:`~gluon_data.sampling.sampler.SampleKey`
wherever they accept an ``int`` (seeded random transforms then draw from
``sample_rng(seed, epoch, index)`` only), pickle as their store's location, and hold no OS
handle across ``fork`` or pickling, so any loader's worker processes (PyTorch's
``DataLoader``, a ``multiprocessing`` pool) read them unchanged. Nothing here imports MXNet.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Union, cast

import numpy as np

from ..errors import CorruptRecordError, DecodeError
from ..format import codec
from ..format.decode import decode_region
from ..format.masks import run_box
from ..stores.base import RecordStore
from . import transforms as T
from ..storage.options import RemoteOptions
from .base import MASK_DTYPES, StoreDataset, check_mask_dtype, as_store, remote_options
from .tensorize import (ImageCropNormalize, ToTensorNormalize, crop_normalize, uint8_image,
                        uint8_output)
from .transforms import default_joint_transform

__all__ = ["ClassificationDataset", "SegmentationDataset", "MODES", "MASK_DTYPES",
           "default_joint_transform", "remote_options"]

_DEFAULT_MAX_PIXELS = codec.DEFAULT_MAX_PIXELS

#: The modes of :class:`SegmentationDataset`, gluoncv's.
MODES = ("train", "val", "testval", "test")



class ClassificationDataset(StoreDataset):
    """Classification images and labels as numpy arrays, from any record store.

    Parameters
    ----------
    source : RecordStore, str or path
        A store (:func:`gluon_data.stores.base.open_store`), or the path or URI of a ``.rec``,
        an LMDB dataset, a ``.shards.json`` manifest...
    flag : {0, 1}, default 1
        1: RGB images (HxWx3); 0: greyscale (HxWx1).
    transform : callable, optional
        ``transform(image, label) -> sample`` on the numpy image and label, applied last.
    split : str, optional
        The split of an LMDB dataset given by path (default: ``train`` if it has one).
    image_transform : ImageCropNormalize or ToTensorNormalize, optional
        Gluon's ``RandomResizedCrop`` / ``CenterCrop``, ``RandomFlipLeftRight``, ``ToTensor``
        (+ ``Normalize``) in numpy (:class:`~gluon_data.arrays.tensorize.ImageCropNormalize`):
        the image becomes that CxHxW float32 tensor, its random crop and flip drawn from
        ``sample_rng(seed, epoch, index)`` with the dataset's ``seed`` (the transform's own
        without one), and only the crop's box is decoded. What a Gluon dataset's
        ``transform_first`` makes of the same recipe.
    seed : int, optional
        Seed of ``image_transform``'s draws: sample ``i`` of epoch ``e`` draws from
        ``sample_rng(seed, e, i)``. ``None``: the transform's own seed, or fresh entropy.
    verify : bool, default True
        Check each record's CRC-32 when it has one.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.
    output : {None, 'uint8'}, default None
        ``'uint8'``: CxHxW uint8 images, not normalised (the consumer normalises);
        ``image_transform`` then may crop and flip but not normalise (``ValueError``), and
        ``transform`` must be ``None``.
    remote : RemoteOptions or dict, optional
        A dataset in object storage: its fsspec ``storage_options``, and the ``cache_dir``
        and ``cache_limit`` of its download (:class:`~gluon_data.storage.options.RemoteOptions`,
        or a dict of those keys); with a URI only. The same keywords given separately still
        work, with a ``DeprecationWarning``.

    Returns
    -------
    (numpy.ndarray, label)
        ``uint8`` HxWxC image (CxHxW float32 with ``image_transform``, CxHxW uint8 with
        ``output='uint8'``); label a float, or a float32 vector for multi-label records.

    Examples
    --------
    >>> from gluon_data.arrays import ClassificationDataset
    >>> from gluon_data.arrays.tensorize import ImageCropNormalize
    >>> ds = ClassificationDataset("train.rec")
    >>> img, label = ds[0]
    >>> type(img).__name__, img.dtype, img.ndim, type(label)
    ('ndarray', dtype('uint8'), 3, <class 'float'>)
    >>> crop = ImageCropNormalize(("random", (16, 16), (0.08, 1.0), (3 / 4, 4 / 3), 1),
    ...                           flip=True, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    >>> train = ClassificationDataset("photos.lmdb", split="train", image_transform=crop, seed=0)
    >>> train[0][0].shape, train[0][0].dtype
    ((3, 16, 16), dtype('float32'))
    """

    _task = "classification"
    _first_option = "image_transform"  # what takes the crop/flip recipe (errors name it)
    _fast_first: Optional[ImageCropNormalize] = None  # the numpy crop/flip/tensor, first
    _fast_source: Any = None  # what the caller gave for it

    def __init__(self, source: Union[RecordStore, str, os.PathLike[str]], flag: int = 1,
                 transform: Optional[Callable] = None, *, split: Optional[str] = None,
                 image_transform: Union[ImageCropNormalize, ToTensorNormalize, None] = None,
                 seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS, output: Optional[str] = None,
                 remote: Optional[RemoteOptions] = None, **deprecated: Any) -> None:
        store = as_store(type(self).__name__, source, split,
                         remote=remote_options(type(self).__name__, remote, deprecated))
        super().__init__(store, seed=seed, verify=verify, max_pixels=max_pixels)
        if flag not in (0, 1):
            raise ValueError("flag must be 0 or 1, got %r" % (flag,))
        self._flag = flag
        self._transform = transform
        self.output = output
        if output is not None:
            if transform is not None:
                raise ValueError("output='uint8' with transform=%r: the transform would see "
                                 "uint8 CxHxW images; give the crop/flip recipe to "
                                 "%s instead" % (transform, self._first_option))
            self._fast_first = uint8_output(output, "train", None, None)[0]
        if image_transform is not None:
            self._fast_first = crop_normalize(image_transform, seed, output is not None)
            self._fast_source = image_transform

    @property
    def fast_path(self) -> Optional[ImageCropNormalize]:
        """The numpy crop/flip/tensor transform the image goes through first (or ``None``)."""
        return self._fast_first

    def _first_fallback(self, img: np.ndarray):
        """The image when the fast path's mean/std do not fit its channels: the transform
        as given (here its numpy form, which raises saying so)."""
        return cast(ImageCropNormalize, self._fast_first)(img)

    def _crop_first(self, rec, key, offset, i: int, epoch):
        """The fast path's crop in two phases: drawn from the header's image size, then only
        its box decoded (:func:`~gluon_data.format.decode.decode_region`; the same pixels as a full
        decode, so the same tensor). ``None`` where it does not apply."""
        fast = cast(ImageCropNormalize, self._fast_first)  # (JPEG/PNG: 3 channels, 1 with flag 0)
        if fast.crop is None or fast.tensor.channels not in (1, 3 if self._flag else 1):
            return None  # mean/std not fitting the channels: the fallback runs
        hw = codec.image_size(rec.image)
        if hw is None or min(hw) <= 0:
            return None
        with self._sample(i, epoch):
            (y0, x0, y1, x1), flip = fast.plan(*hw)
        img = self._decode(decode_region, rec.image, key, offset, "image",
                           box=(y0, x0, y1, x1), flag=self._flag, strict=not self._proven,
                           shrink_to=tuple(fast.crop[1][::-1]))  # (w, h) -> (h, w)
        out = self._buffer(fast.out_shape(img.shape), np.uint8 if fast.uint8 else np.float32)
        return self._emit(fast.finish(img, flip, out))

    def __getitem__(self, idx):
        i, epoch = self._position(idx)
        rec, key, offset = self._record(i)
        if self._fast_first is not None:
            tensor = self._crop_first(rec, key, offset, i, epoch)
            if tensor is not None:
                return tensor, rec.label
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=self._flag)
        if self._fast_first is not None:
            with self._sample(i, epoch):
                tensor = self._tensor(self._fast_first, img)
            if tensor is not None:
                return tensor, rec.label
            return self._first_fallback(img), rec.label  # channel mismatch
        img = self._out(img, np.uint8)
        if self._transform is not None:
            return self._transform(img, rec.label)
        return img, rec.label


class SegmentationDataset(StoreDataset):
    """Image and mask pairs as numpy arrays, from any segmentation record store.

    Without ``mode``, returns the stored samples. With ``mode``, behaves like gluoncv's
    ``SegmentationDataset`` (e.g. ``VOCSegmentation``): ``train`` applies the seeded random
    joint augmentation, ``val`` resizes and centre-crops, ``testval`` returns full-size
    samples, ``test`` returns ``(image, name)``; ``transform`` is then the image-only
    transform. The same samples, draw for draw, as the Gluon datasets
    (:class:`gluon_data.SegmentationRecordDataset`, ...) with the same options.

    Parameters
    ----------
    source : RecordStore, str or path
        A store (:func:`gluon_data.stores.base.open_store`), or the path or URI of a ``.rec``,
        an LMDB dataset, a ``.shards.json`` manifest...
    transform : callable, optional
        Without ``mode``: joint ``transform(image, mask) -> sample`` on numpy arrays. With
        ``mode``: image-only ``transform(image)``, applied last, as in gluoncv; a
        :class:`~gluon_data.arrays.tensorize.ToTensorNormalize` there makes the CxHxW float32
        tensor of Gluon's ``ToTensor`` + ``Normalize``.
    ignore_value : int or None, default -1
        Value returned for the dataset's ignore label (VOC: 255), following gluoncv's
        convention of -1. ``None`` returns the stored value; a class id is a ValueError.
    split : str, optional
        The split of an LMDB dataset given by path (default: ``train`` if it has one).
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
        In a mode, ``'uint8'`` returns the image as CxHxW ``uint8``, not normalised (the
        consumer normalises). An image ``transform`` then runs on the HxWxC uint8 image and
        must return one (a ``ToTensorNormalize(0, 1)`` alone means the CxHxW layout; a
        normalising one is a ``ValueError``).
    mask_dtype : {'int32', 'uint8', 'int16'}, default 'int32'
        The dtype of the returned masks (:data:`MASK_DTYPES`). ``'uint8'`` moves one byte per
        label instead of four (convert on the GPU); it cannot hold the default
        ``ignore_value=-1``, so give ``ignore_value=255`` or ``None`` with it (a
        ``ValueError`` says so), and a dataset recording more than 256 classes is refused.
    remote : RemoteOptions or dict, optional
        A dataset in object storage: its fsspec ``storage_options``, and the ``cache_dir``
        and ``cache_limit`` of its download (:class:`~gluon_data.storage.options.RemoteOptions`,
        or a dict of those keys); with a URI only. The same keywords given separately still
        work, with a ``DeprecationWarning``.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        ``uint8`` HxWx3 RGB image (or what ``transform`` makes of it; CxHxW uint8 with
        ``output='uint8'``) and HxW mask (``int32``, or ``mask_dtype``); ``(image, name)`` in
        ``test`` mode.

    Examples
    --------
    >>> from gluon_data.arrays import SegmentationDataset
    >>> from gluon_data.sampling.sampler import SampleKey
    >>> ds = SegmentationDataset("voc.lmdb", split="val", mode="val", crop_size=32)
    >>> img, mask = ds[0]
    >>> type(img).__name__, img.shape, mask.dtype
    ('ndarray', (32, 32, 3), dtype('int32'))
    >>> train = SegmentationDataset("voc_train.rec", mode="train", base_size=40, crop_size=32,
    ...                             seed=0)
    >>> train
    SegmentationDataset('voc_train.rec', ... records, classes=[...])
    >>> a, b = train[SampleKey(1, epoch=3)], train[SampleKey(1, epoch=3)]
    >>> bool((a[0] == b[0]).all()), a[1].shape     # (seed, epoch, index) fixes the draws
    (True, (32, 32))
    """

    _task = "segmentation"
    meta: Dict[str, Any]  # a segmentation store has metadata (checked on opening)
    _tensorize: Optional[ImageCropNormalize]
    _transform: Optional[Callable]
    _transform_input: Any = np.uint8  # the dtype a mode's image transform is given

    def __init__(self, source: Union[RecordStore, str, os.PathLike[str]],
                 transform: Optional[Callable] = None, ignore_value: Optional[int] = -1, *,
                 split: Optional[str] = None,
                 mode: Optional[str] = None, base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None, remote: Optional[RemoteOptions] = None,
                 mask_dtype: str = "int32", **deprecated: Any) -> None:
        remote = remote_options(type(self).__name__, remote, deprecated)
        if mode is not None and mode not in MODES:
            raise ValueError("unknown mode %r; valid modes: %s" % (mode, ", ".join(MODES)))
        if mode in ("train", "val"):
            if not all(isinstance(v, (int, np.integer)) and v > 0 for v in (crop_size, base_size)):
                raise ValueError("crop_size and base_size must be positive integers (a square "
                                 "crop), got %r and %r" % (crop_size, base_size))
            if mode == "train" and crop_size > 2 * base_size:
                raise ValueError("crop_size %d is larger than the largest scaled image "
                                 "(2 x base_size = %d): every crop would be mostly padding; "
                                 "raise base_size or lower crop_size" % (crop_size,
                                                                       2 * base_size))
        store = as_store(type(self).__name__, source, split, remote=remote)
        super().__init__(store, seed=seed, verify=verify, max_pixels=max_pixels)
        if self.meta.get("masks") is False and mode != "test":
            raise ValueError("%s holds images without masks (e.g. VOC's test split): read it "
                             "with mode='test'" % self.filename)
        names = self.meta.get("item_names")
        self._names = names if isinstance(names, list) and len(names) == len(store) else None
        self._ignore_value = ignore_value
        stored = self.meta.get("ignore_label", 255)
        self.ignore_label = None if stored is None else int(stored)
        self._tables: Dict[np.dtype, np.ndarray] = {}  # mask_dtype -> uint8 masks' table
        self.mask_dtype = check_mask_dtype(mask_dtype, ignore_value, self.ignore_label,
                                      self.meta.get("num_classes"), self.filename)
        self.mode, self.base_size, self.crop_size = mode, base_size, crop_size
        self._builtin_joint = joint_transform is None and mode in ("train", "val")
        fill = self.ignore_label if self.ignore_label is not None else (
            -1 if ignore_value is None else ignore_value)
        if joint_transform is not None and seed is not None and hasattr(joint_transform,
                                                                        "reseed"):
            joint_transform.reseed(seed)
        self._joint = (joint_transform if joint_transform is not None else
                       default_joint_transform(mode, base_size, crop_size, fill, seed,
                                               self._max_pixels) if mode else None)
        # In a mode, an image transform known to be a tensor conversion runs as numpy into
        # an output buffer (the same values).
        self._tensorize, self._transform = (self._image_fast_path(transform) if mode
                                            else (None, transform))
        self.output = output
        self._tensorize, self._transform = uint8_output(output, mode, self._transform,
                                                         self._tensorize)

    def _image_fast_path(self, transform):
        """``(fast path, image transform)`` of a mode's image ``transform``: a
        :class:`~gluon_data.arrays.tensorize.ToTensorNormalize` (or a crop- and flip-less
        :class:`~gluon_data.arrays.tensorize.ImageCropNormalize`) runs as its fast path, its
        ``image`` method where the channels do not fit; anything else runs as given."""
        if isinstance(transform, ToTensorNormalize):
            return ImageCropNormalize(None, False, transform.mean, transform.std), \
                transform.image
        if (isinstance(transform, ImageCropNormalize) and transform.crop is None
                and not transform.flip):
            return transform, transform
        return None, transform

    @property
    def num_class(self) -> int:
        """Number of classes (gluoncv's name)."""
        n = self.meta.get("num_classes")
        if n is None:
            raise AttributeError("the store records no class count (pass num_classes=)")
        return int(n)

    NUM_CLASS = num_class

    @property
    def pred_offset(self) -> int:
        """Add this to predicted class ids to get the dataset's original ids (ADE20K: 1)."""
        return int(self.meta.get("pred_offset", 0))

    @property
    def palette(self) -> List[List[int]]:
        return self.meta.get("palette") or []

    def name(self, idx: int) -> str:
        """The source name of sample ``idx``, what ``mode='test'`` returns with the image:
        the image's file name as gluoncv returns it (``2007_000033.jpg``), recorded at
        conversion; ``"record N"`` for datasets converted before names were recorded."""
        i, _ = self._position(idx)
        return self._names[i] if self._names is not None else "record %d" % self._file.key(i)

    @property
    def fast_path(self) -> Optional[T.ToTensorNormalize]:
        """The numpy form of the image ``transform`` in a mode (``None``: it runs as given)."""
        return None if self._tensorize is None else self._tensorize.tensor

    def _arrays(self, i: int, with_mask: bool = True):
        """Decoded image (HxWx3 uint8) and mask as stored (HxW uint8/uint16)."""
        rec, key, offset = self._record(i)
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
        if not with_mask:
            return img, None
        mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask")
        if mask.shape != img.shape[:2]:
            raise CorruptRecordError("mask is %dx%d but image is %dx%d"
                                     % (mask.shape[1], mask.shape[0], img.shape[1],
                                        img.shape[0]), self.filename, key, offset)
        return img, mask

    def _train_region(self, i: int, epoch: Optional[int]):
        """The built-in ``train`` transform in two phases: its crop drawn from the header's
        size, then only the box the crop reads decoded (a run-length mask's box read from
        its runs). The same samples as a full decode. Returns ``(image, labels, final)``:
        labels in ``mask_dtype``, the image channels-first already (``final``) under
        ``output='uint8'`` without an image transform."""
        joint = cast(T.RandomScaleCrop, self._joint)  # the built-in train transform
        rec, key, offset = self._record(i)
        mhw, mask = codec.mask_size(rec.mask), None
        if mhw is None:  # not a header we read: decode it all (decode_mask says what is wrong)
            mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask")
            mhw = mask.shape
        hw, img = codec.image_size(rec.image), None
        if hw is None:  # not a JPEG/PNG header we read: decode it all
            img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
            hw = img.shape[:2]
        if tuple(mhw) != tuple(hw):
            raise CorruptRecordError("mask is %dx%d but image is %dx%d" % (
                mhw[1], mhw[0], hw[1], hw[0]), self.filename, key, offset)
        with self._sample(i, epoch):
            box, params = joint.plan(*hw)
        y0, x0, y1, x1 = box
        if mask is None:  # run-length: the box read from its runs, or its row blocks expanded
            mask = self._decode(run_box, rec.mask, key, offset, "mask", box=box)
            if mask is None:
                mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask",
                                    rows=(y0, y1))[:, x0:x1]
        else:
            mask = mask[y0:y1, x0:x1]
        part = (img[y0:y1, x0:x1] if img is not None else  # params[1:3]: the size it becomes
                self._decode(decode_region, rec.image, key, offset, "image", box=box, flag=1,
                             shrink_to=params[1:3], strict=not self._proven))
        table = self._mask_table(mask.dtype)
        if table is None:  # labels made from the stored mask afterwards
            img, mask = joint.apply(part, mask, params)
            return img, self._emit(self._labels(mask, self._buffer(mask.shape,
                                                                   self.mask_dtype), i)), False
        chw = self._tensorize is not None and self._tensorize.uint8 and self._transform is None
        img, mask = joint.apply(
            part, mask, params, mask_map=table,
            image_out=self._buffer((part.shape[2],) + joint.size, np.uint8) if chw else None,
            mask_out=self._buffer(joint.size, self.mask_dtype))
        return (self._emit(img) if chw else img), self._emit(mask), chw

    def _mask_table(self, stored: np.dtype) -> Optional[np.ndarray]:
        """The stored-value -> label table the built-in ``train`` transform writes uint8
        masks through (the ignore value mapped, in ``mask_dtype``); ``None`` for other
        masks, or where the padding value is not a stored value."""
        fill = cast(T.RandomScaleCrop, self._joint).mask_fill  # the built-in train
        if stored != np.uint8 or not 0 <= fill <= 255:
            return None
        table = self._tables.get(self.mask_dtype)
        if table is None:
            table = self._labels(np.arange(256, dtype=np.uint8).reshape(1, 256),
                                 np.empty((1, 256), self.mask_dtype), checked=False)[0]
            self._tables[self.mask_dtype] = table
        return table

    def _labels(self, mask: np.ndarray, out: Optional[np.ndarray] = None, i: int = 0,
                checked: bool = True):
        """Stored mask -> labels of ``mask_dtype`` with the ignore value mapped (into
        ``out``); a label the dtype cannot hold is a :class:`~gluon_data.errors.DecodeError`
        naming record ``i`` (with ``checked``)."""
        if out is None:
            out = np.empty(mask.shape, self.mask_dtype)
        if (checked and mask.dtype.itemsize >= out.dtype.itemsize and mask.size
                and not np.can_cast(mask.dtype, out.dtype)):
            top, most = int(mask.max()), np.iinfo(out.dtype).max
            if top > most and self.ignore_label is not None:  # the ignore label is mapped
                rest = mask[mask != self.ignore_label]
                top = int(rest.max()) if rest.size else 0
            if top > most:
                raise DecodeError("label %d does not fit mask_dtype=%r" % (top, out.dtype.name),
                                  self.filename, self._file.key(i), self._file.offset(i))
        np.copyto(out, mask, casting="unsafe")
        if (self._ignore_value is not None and self.ignore_label is not None
                and self._ignore_value != self.ignore_label):
            out[mask == self.ignore_label] = self._ignore_value
        return out

    def _image_out(self, img: np.ndarray):
        if self.output is not None and self._transform is not None:
            img = uint8_image(self._transform(self._out(img, np.uint8)))
        tensor = self._tensor(self._tensorize, img)
        if tensor is not None:
            return tensor
        img = self._out(img, np.uint8 if self._transform is None else self._transform_input)
        return img if self._transform is None else self._transform(img)

    def __getitem__(self, idx):
        i, epoch = self._position(idx)
        if self.mode == "test":
            img = self._image_out(self._arrays(i, with_mask=False)[0])
            return img, self.name(i)
        two_phase = self._builtin_joint and isinstance(self._joint, T.RandomScaleCrop)
        img, mask = (None, None) if two_phase else self._arrays(i)
        if self._builtin_joint:  # works on the stored mask, padding with the stored ignore
            try:
                if two_phase:
                    img, mask, final = self._train_region(i, epoch)
                    if final:
                        return img, mask
                else:
                    with self._sample(i, epoch):
                        img, mask = self._joint(img, mask)
            except DecodeError as e:  # a derived size over max_pixels: name the record
                raise DecodeError(e.reason, self.filename, self._file.key(i),
                                  self._file.offset(i)) from None
            if not two_phase:
                mask = self._emit(self._labels(mask, self._buffer(mask.shape,
                                                                  self.mask_dtype), i))
        else:
            mask = self._labels(mask, None, i)
            if self._joint is not None:
                with self._sample(i, epoch):
                    img, mask = self._joint(img, mask)
            mask = self._out(mask, self.mask_dtype)
        if self.mode is not None:
            return self._image_out(img), mask
        img = self._out(img, np.uint8)
        if self._transform is None:
            return img, mask
        return self._transform(img, mask)
