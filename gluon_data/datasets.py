"""Gluon datasets over packed records: classification and segmentation, from RecordIO.

Every dataset opens its files lazily in each process and holds no OS handle across
``fork`` or pickling, so it works unchanged under ``DataLoader(num_workers=N)``,
``DataLoader(thread_pool=True)`` and the ``spawn`` start method.
"""
from __future__ import annotations

import copy
import os
from typing import Callable, List, Optional

import mxnet as mx
import numpy as np

from . import buffers, codec
from . import transforms as T
from .errors import CorruptRecordError, DecodeError, FormatError
from .meta import read_meta
from .lmdbio import LMDBFile, names_lmdb
from .recordio import RecordFile

__all__ = ["ImageRecordDataset", "SegmentationRecordDataset", "ImageLMDBDataset",
           "SegmentationLMDBDataset", "open_segmentation", "numpy_image_transform",
           "numpy_classification_transform"]


class _RecordDataset(mx.gluon.data.Dataset):
    """Shared machinery: metadata, index, checksum policy, error context."""

    _task = "classification"
    _container = "rec"

    def __init__(self, filename: str, *, split: Optional[str] = None, verify: bool = True,
                 max_pixels: Optional[int] = codec.DEFAULT_MAX_PIXELS):
        super().__init__()
        self.filename = os.fspath(filename)
        if self._container == "lmdb":
            self._file = LMDBFile(self.filename, split or "train")
            self.meta = self._file.meta
        else:
            if split is not None:
                raise TypeError("split= applies to LMDB datasets; a .rec holds one split")
            self.meta = read_meta(self.filename)
            if self.meta is None and self._task == "segmentation":
                raise FormatError("no metadata (%s) beside it: not a gluon_data segmentation "
                                  "dataset; create one with `gluon-data convert`"
                                  % (os.path.splitext(self.filename)[0] + ".meta.json"),
                                  self.filename)
        if self.meta is not None and self.meta["task"] != self._task:
            raise FormatError("this is a %s dataset; open it with %s"
                              % (self.meta["task"],
                                 _CLASS_FOR[self._container, self.meta["task"]]),
                              self.filename)
        if self._container != "lmdb":
            expected = self.meta["num_records"] if self.meta else None
            self._file = RecordFile(self.filename, expected_count=expected)
        self._verify = verify
        self._checksummed = bool(self.meta) and self.meta.get("checksum") == "crc32-id2"
        self._max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self._file)

    @property
    def classes(self) -> Optional[List[str]]:
        """Class names from the metadata (``None`` for stock files)."""
        return None if self.meta is None else self.meta.get("classes")

    def _record(self, idx):
        n = len(self._file)
        i = int(idx)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("index %d out of range for %d records" % (idx, n))
        key, offset = self._file.key(i), self._file.offset(i)
        payload = self._file.view(i)  # parsed (and image/mask copied out) before the next read
        rec = codec.unpack(payload, segmentation=self._task == "segmentation",
                           verify=self._verify, path=self.filename, key=key, offset=offset)
        if self._checksummed and self._verify and rec.checksum is None:
            raise CorruptRecordError("checksum missing: metadata promises a CRC-32 in every "
                                     "record's id2 field", self.filename, key, offset)
        return rec, key, offset

    def _decode(self, fn: Callable, buf, key, offset, what: str, **kw):
        try:
            return fn(buf, max_pixels=self._max_pixels, what=what, **kw)
        except DecodeError as e:
            raise DecodeError(e.reason, self.filename, key, offset) from None

    def __repr__(self) -> str:
        classes = self.classes
        shown = "" if classes is None else ", classes=%s" % (
            classes if len(classes) <= 8 else classes[:8] + ["... %d more" % (len(classes) - 8)])
        split = ", split=%r" % self._file.split if self._container == "lmdb" else ""
        return "%s(%r%s, %d records%s)" % (type(self).__name__, self.filename, split, len(self),
                                           shown)


class ImageRecordDataset(_RecordDataset):
    """Classification images and labels from a ``.rec`` (ours or stock im2rec output).

    A drop-in for :class:`mxnet.gluon.data.vision.ImageRecordDataset` with the same
    outputs, but safe under ``thread_pool=True``, with a compact index shared by forked
    workers, checksums verified and typed errors naming file, record and offset.

    Parameters
    ----------
    filename : str
        Path to the ``.rec``; its ``.idx`` (and ``.meta.json`` if present) lie beside it.
    flag : {0, 1}, default 1
        1: RGB images (HxWx3); 0: greyscale (HxWx1).
    transform : callable, optional
        ``transform(image, label) -> sample``, as in Gluon.
    verify : bool, default True
        Check each record's CRC-32 when it has one.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.

    Returns
    -------
    (NDArray, label)
        ``uint8`` HWC image; label a float, or a float32 vector for multi-label records.

    Examples
    --------
    >>> ds = ImageRecordDataset("train.rec")          # doctest: +SKIP
    >>> img, label = ds[0]
    >>> img.shape, img.dtype, label
    ((375, 500, 3), <class 'numpy.uint8'>, 3.0)
    """

    _task = "classification"

    def __init__(self, filename: str, flag: int = 1, transform: Optional[Callable] = None,
                 **kwargs):
        super().__init__(filename, **kwargs)
        if flag not in (0, 1):
            raise ValueError("flag must be 0 or 1, got %r" % (flag,))
        self._flag = flag
        self._transform = transform

    _fast_first = None  # set by transform_first for a recognised Gluon image transform

    def __getitem__(self, idx):
        rec, key, offset = self._record(idx)
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=self._flag)
        tensor = _fast_tensor(self._fast_first, img)
        if tensor is not None:
            return tensor, rec.label
        img = _as_ndarray(img, np.uint8)
        if self._fast_first is not None:  # a channel count its mean/std do not fit
            return self._fast_source(img), rec.label
        if self._transform is not None:
            return self._transform(img, rec.label)
        return img, rec.label

    def transform_first(self, fn, lazy: bool = True):
        """Gluon's ``transform_first``; a recognised image transform (``RandomResizedCrop`` /
        ``CenterCrop``, ``RandomFlipLeftRight``, ``ToTensor``, ``Normalize``: see
        :func:`numpy_classification_transform`) runs in numpy on the decoded image instead
        of as NDArray operators, with the same results (the random draws come from a seeded
        per-worker generator). Anything else goes to Gluon's implementation."""
        fast = numpy_classification_transform(fn) if self._transform is None else None
        if fast is None:
            return super().transform_first(fn, lazy)
        clone = copy.copy(self)
        clone._fast_first, clone._fast_source = fast, fn
        return clone


MODES = ("train", "val", "testval", "test")


def default_joint_transform(mode: str, base_size: int, crop_size: int, mask_fill: int,
                            seed: Optional[int] = None):
    """The joint transform gluoncv's ``SegmentationDataset`` applies in ``mode``
    (train: mirror, random scale, pad + random crop, blur, fused into one
    :class:`~gluon_data.transforms.RandomScaleCrop`; val: short-side resize + centre crop),
    except that padded mask pixels get ``mask_fill`` (the ignore value) instead of class 0."""
    if mode == "train":
        return T.RandomScaleCrop(base_size, crop_size, image_fill=0, mask_fill=mask_fill,
                                 seed=seed)
    if mode == "val":
        return T.Compose([T.ResizeShort(crop_size), T.CenterCrop(crop_size, 0, mask_fill)])
    return None


def _as_ndarray(x: np.ndarray, dtype) -> mx.nd.NDArray:
    """A CPU NDArray over ``x`` without copying it (``x`` is ours and never touched again)."""
    x = np.ascontiguousarray(x, dtype=dtype)
    if not x.flags.writeable or x.dtype.str[1:] not in ("u1", "i4", "f4"):
        return mx.nd.array(x, dtype=x.dtype)
    return mx.nd.from_numpy(x, zero_copy=True)


def numpy_image_transform(transform) -> Optional[T.ToTensorNormalize]:
    """The numpy equivalent of a Gluon ``ToTensor()`` or ``Compose([ToTensor(),
    Normalize(mean, std)])`` image transform, else ``None``.

    The segmentation datasets run such a transform as :class:`~gluon_data.transforms.
    ToTensorNormalize` (the same values to float32 rounding) instead of two NDArray operators
    per sample, which cost more than decoding the JPEG in a DataLoader worker.
    """
    fast = _tensor_only(transform)
    return None if fast is None else fast.tensor


def _tensor_only(transform) -> Optional[T.ImageCropNormalize]:
    fast = numpy_classification_transform(transform)
    return None if fast is None or fast.crop is not None or fast.flip else fast


def _fast_tensor(fast: Optional[T.ImageCropNormalize], img: np.ndarray):
    """``fast(img)`` as an NDArray over a pooled buffer, or ``None`` without ``fast`` or when
    its mean/std do not fit the image's channels (the Gluon transform then runs, and fails
    as Gluon fails)."""
    if fast is None or fast.tensor.channels not in (1, img.shape[2]):
        return None
    buf = buffers.samples.take(fast.out_shape(img.shape), np.float32)
    return buffers.samples.wrap(fast(img, out=buf))


def _gluon_leaves(transform) -> Optional[list]:
    from mxnet.gluon import nn
    from mxnet.gluon.data.vision import transforms as VT

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


def numpy_classification_transform(transform) -> Optional[T.ImageCropNormalize]:
    """The numpy equivalent of a Gluon image transform made of an optional
    ``RandomResizedCrop`` or ``CenterCrop``, an optional ``RandomFlipLeftRight``, then
    ``ToTensor`` and optionally ``Normalize`` — the usual training recipe — else ``None``.

    :meth:`ImageRecordDataset.transform_first` runs such a transform as
    :class:`~gluon_data.transforms.ImageCropNormalize` (the same crop arithmetic, draws and
    OpenCV interpolation) instead of four NDArray operators per sample.
    """
    from mxnet.gluon.data.vision import transforms as VT

    leaves = _gluon_leaves(transform)
    if not leaves:
        return None
    crop = None
    if type(leaves[0]) is VT.RandomResizedCrop:
        size, scale, ratio, interp = leaves[0]._args
        crop = ("random", tuple(int(v) for v in size), scale, tuple(ratio), interp)
    elif type(leaves[0]) is VT.CenterCrop:
        size, interp = leaves[0]._args
        crop = ("center", tuple(int(v) for v in size), interp)
    if crop is not None:
        if crop[-1] not in (0, 1, 2, 3, 4, 9):
            return None  # 10 = a random method per call: leave it to MXNet
        leaves = leaves[1:]
    flip = bool(leaves) and type(leaves[0]) is VT.RandomFlipLeftRight
    if flip:
        leaves = leaves[1:]
    kinds = [type(b) for b in leaves]
    if kinds == [VT.ToTensor]:
        return T.ImageCropNormalize(crop, flip)
    if kinds == [VT.ToTensor, VT.Normalize]:
        return T.ImageCropNormalize(crop, flip, leaves[1]._mean, leaves[1]._std)
    return None


class SegmentationRecordDataset(_RecordDataset):
    """Image and mask pairs from a ``.rec`` written by ``gluon-data convert``.

    Without ``mode``, returns the stored samples. With ``mode``, behaves like gluoncv's
    ``SegmentationDataset`` (e.g. ``VOCSegmentation``) so it drops into gluoncv's
    ``train.py``: ``train`` applies the seeded random joint augmentation, ``val`` resizes and
    centre-crops, ``testval`` returns full-size samples, ``test`` returns ``(image, name)``;
    ``transform`` is then the image-only transform (e.g. ``ToTensor`` + ``Normalize``).

    Parameters
    ----------
    filename : str
        Path to the ``.rec``; ``.idx`` and ``.meta.json`` lie beside it.
    transform : callable, optional
        Without ``mode``: joint ``transform(image, mask)``. With ``mode``: image-only
        ``transform(image)``, applied last, as in gluoncv.
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
        numpy arrays (see :mod:`gluon_data.transforms`).
    seed : int, optional
        Seed of the built-in ``train`` augmentation (repeatable draws; see
        :mod:`gluon_data.transforms` for how workers differ).
    verify : bool, default True
        Check each record's CRC-32.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.

    Returns
    -------
    (NDArray, NDArray)
        ``uint8`` HxWx3 RGB image (or what ``transform`` makes of it) and ``int32`` HxW mask.

    Examples
    --------
    >>> ds = SegmentationRecordDataset("voc_train.rec")  # doctest: +SKIP
    >>> img, mask = ds[0]
    >>> img.shape, mask.shape, mask.dtype
    ((281, 500, 3), (281, 500), <class 'numpy.int32'>)
    >>> train = SegmentationRecordDataset("voc_train.rec", mode="train", base_size=520,
    ...                                   crop_size=480, transform=input_transform)  # doctest: +SKIP
    """

    _task = "segmentation"

    def __init__(self, filename: str, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, mode: Optional[str] = None,
                 base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 **kwargs):
        if mode is not None and mode not in MODES:
            raise ValueError("unknown mode %r; valid modes: %s" % (mode, ", ".join(MODES)))
        if mode in ("train", "val"):
            if int(crop_size) <= 0 or int(base_size) <= 0:
                raise ValueError("crop_size and base_size must be positive, got %r and %r"
                                 % (crop_size, base_size))
            if mode == "train" and crop_size > 2 * base_size:
                raise ValueError("crop_size %d is larger than the largest scaled image "
                                 "(2 x base_size = %d): every crop would be mostly padding; "
                                 "raise base_size or lower crop_size" % (crop_size,
                                                                       2 * base_size))
        super().__init__(filename, **kwargs)
        self._transform = transform
        self._ignore_value = ignore_value
        self.ignore_label = int(self.meta.get("ignore_label", 255))
        self.mode, self.base_size, self.crop_size = mode, base_size, crop_size
        self._builtin_joint = joint_transform is None and mode in ("train", "val")
        self._joint = (joint_transform if joint_transform is not None else
                       default_joint_transform(mode, base_size, crop_size, self.ignore_label,
                                               seed) if mode else None)
        # In a mode, a Gluon ToTensor(+Normalize) image transform runs as numpy (same values).
        self._tensorize = _tensor_only(transform) if mode else None

    @property
    def num_class(self) -> int:
        """Number of classes (gluoncv's name)."""
        return int(self.meta["num_classes"])

    NUM_CLASS = num_class

    @property
    def pred_offset(self) -> int:
        """Add this to predicted class ids to get the dataset's original ids (ADE20K: 1)."""
        return int(self.meta.get("pred_offset", 0))

    @property
    def palette(self) -> List[List[int]]:
        return self.meta.get("palette") or []

    def _arrays(self, idx, with_mask: bool = True):
        """Decoded image (HxWx3 uint8) and mask as stored (HxW uint8/uint16)."""
        rec, key, offset = self._record(idx)
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
        if not with_mask:
            return img, None
        mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask")
        if mask.shape != img.shape[:2]:
            raise CorruptRecordError("mask is %dx%d but image is %dx%d"
                                     % (mask.shape[1], mask.shape[0], img.shape[1],
                                        img.shape[0]), self.filename, key, offset)
        return img, mask

    def _labels(self, mask: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Stored mask -> int32 labels with the ignore value mapped (into ``out``)."""
        if out is None:
            out = np.empty(mask.shape, np.int32)
        np.copyto(out, mask, casting="unsafe")
        if self._ignore_value is not None and self._ignore_value != self.ignore_label:
            out[mask == self.ignore_label] = self._ignore_value
        return out

    def _image_out(self, img: np.ndarray):
        tensor = _fast_tensor(self._tensorize, img)
        if tensor is not None:
            return tensor
        img = _as_ndarray(img, np.uint8)
        return img if self._transform is None else self._transform(img)

    def __getitem__(self, idx):
        if self.mode == "test":
            img = self._image_out(self._arrays(idx, with_mask=False)[0])
            return img, "record %d" % self._file.key(int(idx) % len(self))
        img, mask = self._arrays(idx)
        if self._builtin_joint:  # works on the stored mask, padding with the stored ignore
            img, mask = self._joint(img, mask)
            mask = buffers.samples.wrap(
                self._labels(mask, buffers.samples.take(mask.shape, np.int32)))
        else:
            mask = self._labels(mask)
            if self._joint is not None:
                img, mask = self._joint(img, mask)
            mask = _as_ndarray(mask, np.int32)
        if self.mode is not None:
            return self._image_out(img), mask
        img = _as_ndarray(img, np.uint8)
        if self._transform is None:
            return img, mask
        return self._transform(img, mask)


class ImageLMDBDataset(ImageRecordDataset):
    """Classification images and labels from one split of an LMDB dataset.

    Same outputs and options as :class:`ImageRecordDataset`; the environment is opened
    lazily, read-only and lock-free in each process.

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory written by ``gluon-data convert``.
    split : str, default 'train'
        Split (sub-database) to read.
    flag, transform, verify, max_pixels
        As for :class:`ImageRecordDataset`.

    Examples
    --------
    >>> ds = ImageLMDBDataset("photos.lmdb", split="val")   # doctest: +SKIP
    >>> img, label = ds[0]
    """

    _container = "lmdb"

    def __init__(self, path: str, split: str = "train", flag: int = 1,
                 transform: Optional[Callable] = None, **kwargs):
        super().__init__(path, flag, transform, split=split, **kwargs)


class SegmentationLMDBDataset(SegmentationRecordDataset):
    """Image and mask pairs from one split of an LMDB dataset.

    Same outputs and options as :class:`SegmentationRecordDataset`.

    Parameters
    ----------
    path : str
        The ``NAME.lmdb`` directory written by ``gluon-data convert``.
    split : str, default 'train'
        Split (sub-database) to read.
    transform, ignore_value, mode, base_size, crop_size, joint_transform, seed, verify,
    max_pixels
        As for :class:`SegmentationRecordDataset`.

    Examples
    --------
    >>> ds = SegmentationLMDBDataset("voc.lmdb", split="train")  # doctest: +SKIP
    >>> img, mask = ds[0]
    """

    _container = "lmdb"

    def __init__(self, path: str, split: str = "train", transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, **kwargs):
        super().__init__(path, transform, ignore_value, split=split, **kwargs)


_CLASS_FOR = {("rec", "classification"): "ImageRecordDataset",
              ("rec", "segmentation"): "SegmentationRecordDataset",
              ("lmdb", "classification"): "ImageLMDBDataset",
              ("lmdb", "segmentation"): "SegmentationLMDBDataset"}


def open_segmentation(path: str, split: Optional[str] = None, **kwargs):
    """``SegmentationLMDBDataset(path, split)`` for an LMDB, else
    ``SegmentationRecordDataset(path)``; ``kwargs`` go to the class."""
    if names_lmdb(path):
        return SegmentationLMDBDataset(path, split or "train", **kwargs)
    return SegmentationRecordDataset(path, **kwargs)
