"""Gluon datasets over packed records: classification and segmentation, from RecordIO.

Every dataset opens its files lazily in each process and holds no OS handle across
``fork`` or pickling, so it works unchanged under ``DataLoader(num_workers=N)``,
``DataLoader(thread_pool=True)`` and the ``spawn`` start method.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional

import mxnet as mx
import numpy as np

from . import codec
from .errors import CorruptRecordError, DecodeError, FormatError
from .meta import read_meta
from .lmdbio import LMDBFile
from .recordio import RecordFile

__all__ = ["ImageRecordDataset", "SegmentationRecordDataset", "ImageLMDBDataset",
           "SegmentationLMDBDataset"]


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
        payload = self._file.read(i)
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

    def __getitem__(self, idx):
        rec, key, offset = self._record(idx)
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=self._flag)
        img = mx.nd.array(img, dtype=np.uint8)
        if self._transform is not None:
            return self._transform(img, rec.label)
        return img, rec.label


class SegmentationRecordDataset(_RecordDataset):
    """Image and mask pairs from a ``.rec`` written by ``gluon-data convert``.

    Parameters
    ----------
    filename : str
        Path to the ``.rec``; ``.idx`` and ``.meta.json`` lie beside it.
    transform : callable, optional
        Joint ``transform(image, mask) -> sample``.
    ignore_value : int or None, default -1
        Value returned for the dataset's ignore label (VOC: 255), following gluoncv's
        convention of -1. ``None`` returns the stored value.
    verify : bool, default True
        Check each record's CRC-32.
    max_pixels : int, optional
        Refuse images claiming more pixels than this before decoding them.

    Returns
    -------
    (NDArray, NDArray)
        ``uint8`` HxWx3 RGB image and ``int32`` HxW mask of class indices.

    Examples
    --------
    >>> ds = SegmentationRecordDataset("voc_train.rec")  # doctest: +SKIP
    >>> img, mask = ds[0]
    >>> img.shape, mask.shape, mask.dtype
    ((281, 500, 3), (281, 500), <class 'numpy.int32'>)
    """

    _task = "segmentation"

    def __init__(self, filename: str, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, **kwargs):
        super().__init__(filename, **kwargs)
        self._transform = transform
        self._ignore_value = ignore_value
        self.ignore_label = int(self.meta.get("ignore_label", 255))

    @property
    def num_class(self) -> int:
        """Number of classes (gluoncv's name)."""
        return int(self.meta["num_classes"])

    @property
    def palette(self) -> List[List[int]]:
        return self.meta.get("palette") or []

    def _arrays(self, idx):
        rec, key, offset = self._record(idx)
        img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
        mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask")
        if mask.shape != img.shape[:2]:
            raise CorruptRecordError("mask is %dx%d but image is %dx%d"
                                     % (mask.shape[1], mask.shape[0], img.shape[1],
                                        img.shape[0]), self.filename, key, offset)
        mask = mask.astype(np.int32)
        if self._ignore_value is not None and self._ignore_value != self.ignore_label:
            mask[mask == self.ignore_label] = self._ignore_value
        return img, mask

    def __getitem__(self, idx):
        img, mask = self._arrays(idx)
        img, mask = mx.nd.array(img, dtype=np.uint8), mx.nd.array(mask, dtype=np.int32)
        if self._transform is not None:
            return self._transform(img, mask)
        return img, mask


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
    transform, ignore_value, verify, max_pixels
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
