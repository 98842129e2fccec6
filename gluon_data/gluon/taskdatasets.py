"""The task datasets: :class:`ClassificationDataset` and :class:`SegmentationDataset` over a
record store.

Both read any :class:`~gluon_data.stores.base.RecordStore` (a ``.rec``, an LMDB split, a legacy
LMDB read in place, objects in S3, or whatever :func:`~gluon_data.stores.base.open_store` opens);
the public classes of :mod:`gluon_data.gluon.datasets` are thin views that open a store and pass
every option through. Stores hold no OS handle across ``fork`` or pickling, so every dataset
works unchanged under ``DataLoader(num_workers=N)``, ``DataLoader(thread_pool=True)`` and
the ``spawn`` start method.

Every dataset accepts a :class:`~gluon_data.sampling.sampler.SampleKey` wherever it accepts an ``int``;
seeded random transforms then draw from ``sample_rng(seed, epoch, index)`` only (see
:class:`SegmentationDataset` and the README's "Randomness"). Recognised Gluon image
transforms run as numpy (:mod:`gluon_data.gluon.fastpath`).
"""
from __future__ import annotations

import copy
from typing import Callable, List, Optional

import numpy as np

from . import buffers
from ..format import codec
from ..arrays import transforms as T
from ..format.decode import decode_region
from ..errors import CorruptRecordError, DecodeError
from .fastpath import _as_ndarray, _fast_tensor, _tensor_only, numpy_classification_transform
from ..stores.base import RecordStore
from .storedataset import _StoreDataset
from ..arrays.tensorize import OUTPUTS, ImageCropNormalize, _uint8_image, _uint8_output

__all__ = ["ClassificationDataset", "SegmentationDataset", "MODES", "OUTPUTS",
           "default_joint_transform"]

_DEFAULT_MAX_PIXELS = codec.DEFAULT_MAX_PIXELS


class ClassificationDataset(_StoreDataset):
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

    _task = "classification"

    def __init__(self, store: RecordStore, flag: int = 1, transform: Optional[Callable] = None,
                 *, seed: Optional[int] = None, verify: bool = True,
                 max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS, output: Optional[str] = None):
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
                                 "transform_first instead" % (transform,))
            self._fast_first = _uint8_output(output, "train", None, None)[0]
            self._fast_source = None

    _fast_first = None  # set by transform_first for a recognised Gluon image transform

    @property
    def fast_path(self) -> Optional[T.ImageCropNormalize]:
        """The numpy transform ``transform_first`` recognised (``None`` if it runs as Gluon)."""
        return self._fast_first

    def _crop_first(self, rec, key, offset, i: int, epoch):
        """The fast path's crop in two phases: drawn from the header's image size, then only
        its box decoded (:func:`~gluon_data.format.decode.decode_region`; the same pixels as a full
        decode, so the same tensor). ``None`` where it does not apply."""
        fast = self._fast_first  # (a JPEG or PNG decodes to 3 channels, or 1 with flag 0)
        if fast.crop is None or fast.tensor.channels not in (1, 3 if self._flag else 1):
            return None  # mean/std not fitting the channels: the Gluon transform runs
        hw = codec.image_size(rec.image)
        if hw is None or min(hw) <= 0:
            return None
        with self._sample(i, epoch):
            (y0, x0, y1, x1), flip = fast.plan(*hw)
        img = self._decode(decode_region, rec.image, key, offset, "image",
                           box=(y0, x0, y1, x1), flag=self._flag)
        out = buffers.samples.take(fast.out_shape(img.shape),
                                   np.uint8 if fast.uint8 else np.float32)
        return buffers.samples.wrap(fast.finish(img, flip, out))

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
                tensor = _fast_tensor(self._fast_first, img)
            if tensor is not None:
                return tensor, rec.label
            return self._fast_source(_as_ndarray(img, np.uint8)), rec.label  # channel mismatch
        img = _as_ndarray(img, np.uint8)
        if self._transform is not None:
            return self._transform(img, rec.label)
        return img, rec.label

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


MODES = ("train", "val", "testval", "test")


def default_joint_transform(mode: str, base_size: int, crop_size: int, mask_fill: int,
                            seed: Optional[int] = None,
                            max_pixels: Optional[int] = codec.DEFAULT_MAX_PIXELS):
    """The joint transform gluoncv's ``SegmentationDataset`` applies in ``mode``
    (train: mirror, random scale, pad + random crop, blur, fused into one
    :class:`~gluon_data.arrays.transforms.RandomScaleCrop`; val: short-side resize with Pillow's
    bilinear filter, as gluoncv, + centre crop),
    except that padded mask pixels get ``mask_fill`` (the ignore value) instead of class 0."""
    if mode == "train":
        return T.RandomScaleCrop(base_size, crop_size, image_fill=0, mask_fill=mask_fill,
                                 seed=seed)
    if mode == "val":
        return T.Compose([T.ResizeShort(crop_size, pil=True,  # gluoncv's exact values
                                        max_pixels=max_pixels),
                          T.CenterCrop(crop_size, 0, mask_fill)])
    return None


class SegmentationDataset(_StoreDataset):
    """Image and mask pairs from any segmentation record store.

    Without ``mode``, returns the stored samples. With ``mode``, behaves like gluoncv's
    ``SegmentationDataset`` (e.g. ``VOCSegmentation``) so it drops into gluoncv's
    ``train.py``: ``train`` applies the seeded random joint augmentation, ``val`` resizes and
    centre-crops, ``testval`` returns full-size samples, ``test`` returns ``(image, name)``;
    ``transform`` is then the image-only transform (e.g. ``ToTensor`` + ``Normalize``).

    Parameters
    ----------
    store : RecordStore
        From :func:`gluon_data.stores.base.open_store` (or any object satisfying the protocol).
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

    Returns
    -------
    (NDArray, NDArray)
        ``uint8`` HxWx3 RGB image (or what ``transform`` makes of it; CxHxW uint8 with
        ``output='uint8'``) and ``int32`` HxW mask.

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

    _task = "segmentation"

    def __init__(self, store: RecordStore, transform: Optional[Callable] = None,
                 ignore_value: Optional[int] = -1, *, mode: Optional[str] = None,
                 base_size: int = 520, crop_size: int = 480,
                 joint_transform: Optional[Callable] = None, seed: Optional[int] = None,
                 verify: bool = True, max_pixels: Optional[int] = _DEFAULT_MAX_PIXELS,
                 output: Optional[str] = None):
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
        super().__init__(store, seed=seed, verify=verify, max_pixels=max_pixels)
        if self.meta.get("masks") is False and mode != "test":
            raise ValueError("%s holds images without masks (e.g. VOC's test split): read it "
                             "with mode='test'" % self.filename)
        names = self.meta.get("item_names")
        self._names = names if isinstance(names, list) and len(names) == len(store) else None
        self._transform = transform
        self._ignore_value = ignore_value
        stored = self.meta.get("ignore_label", 255)
        self.ignore_label = None if stored is None else int(stored)
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
        # In a mode, a Gluon ToTensor(+Normalize) image transform runs as numpy (same values).
        self._tensorize = _tensor_only(transform) if mode else None
        self.output = output
        self._tensorize, self._transform = _uint8_output(output, mode, transform,
                                                         self._tensorize)

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

    def name(self, idx) -> str:
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
        """The built-in ``train`` transform in two phases: its crop drawn from the image's
        header size, then only the image region the crop reads decoded (the mask as stored,
        cut to the same box). The same samples as a full decode, for less decoding."""
        rec, key, offset = self._record(i)
        mask = self._decode(codec.decode_mask, rec.mask, key, offset, "mask")
        hw, img = codec.image_size(rec.image), None
        if hw is None:  # not a JPEG/PNG header we read: decode it all
            img = self._decode(codec.decode_image, rec.image, key, offset, "image", flag=1)
            hw = img.shape[:2]
        if mask.shape != tuple(hw):
            raise CorruptRecordError("mask is %dx%d but image is %dx%d"
                                     % (mask.shape[1], mask.shape[0], hw[1], hw[0]),
                                     self.filename, key, offset)
        with self._sample(i, epoch):
            box, params = self._joint.plan(*hw)
        y0, x0, y1, x1 = box
        part = (img[y0:y1, x0:x1] if img is not None else
                self._decode(decode_region, rec.image, key, offset, "image", box=box, flag=1))
        return self._joint.apply(part, mask[y0:y1, x0:x1], params)

    def _labels(self, mask: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Stored mask -> int32 labels with the ignore value mapped (into ``out``)."""
        if out is None:
            out = np.empty(mask.shape, np.int32)
        np.copyto(out, mask, casting="unsafe")
        if (self._ignore_value is not None and self.ignore_label is not None
                and self._ignore_value != self.ignore_label):
            out[mask == self.ignore_label] = self._ignore_value
        return out

    def _image_out(self, img: np.ndarray):
        if self.output is not None and self._transform is not None:
            img = _uint8_image(self._transform(_as_ndarray(img, np.uint8)))
        tensor = _fast_tensor(self._tensorize, img)
        if tensor is not None:
            return tensor
        img = _as_ndarray(img, np.uint8)
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
                    img, mask = self._train_region(i, epoch)
                else:
                    with self._sample(i, epoch):
                        img, mask = self._joint(img, mask)
            except DecodeError as e:  # a derived size over max_pixels: name the record
                raise DecodeError(e.reason, self.filename, self._file.key(i),
                                  self._file.offset(i)) from None
            mask = buffers.samples.wrap(
                self._labels(mask, buffers.samples.take(mask.shape, np.int32)))
        else:
            mask = self._labels(mask)
            if self._joint is not None:
                with self._sample(i, epoch):
                    img, mask = self._joint(img, mask)
            mask = _as_ndarray(mask, np.int32)
        if self.mode is not None:
            return self._image_out(img), mask
        img = _as_ndarray(img, np.uint8)
        if self._transform is None:
            return img, mask
        return self._transform(img, mask)
