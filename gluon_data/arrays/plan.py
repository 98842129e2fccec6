"""A sample drawn on the CPU before its image is decoded: :class:`SamplePlan`.

:func:`plan_sample` reads a dataset's record and draws, from ``(seed, epoch, index)`` only and
with the dataset's own transforms, what the sample will be: the encoded image, the finished
mask (exact: the dataset's own mask code ran), the label, and the image's geometry (crop box,
scale, flip, padding, blur). A batch stage (:mod:`gluon_data.arrays.device`) decodes the
images and applies the geometry, on a GPU or on the CPU. :class:`PlanDataset` is the view a
loader's workers index (their ``collate`` is :func:`collate_plans`), so only bytes and a few
numbers travel to the process that decodes. :func:`replay` makes the sample exactly as
``dataset[i]`` does, from the plan's record, through the dataset's own ``__getitem__``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple, Union, cast

import numpy as np

from ..errors import CorruptRecordError, DecodeError
from ..format import codec
from ..sampling.sampler import SampleKey
from . import transforms as T
from .datasets import ClassificationDataset, SegmentationDataset

__all__ = ["SamplePlan", "plan_sample", "PlanDataset", "collate_plans", "replay",
           "image_output"]

#: What a plan's geometry holds, by kind: ``train``: ``(box, params, (ch, cw), image_fill)``
#: (:meth:`~gluon_data.arrays.transforms.RandomScaleCrop.plan`); ``val``: ``(oh, ow, size,
#: image_fill)`` (short-side resize with Pillow's filter, then centre crop); ``crop``:
#: ``(box, flip, (w, h) or None, interp)`` (classification); ``replay``: nothing, the sample
#: is made on the CPU by :func:`replay`.
KINDS = ("train", "val", "crop", "replay")


@dataclass(frozen=True)
class SamplePlan:
    """What sample ``index`` of ``epoch`` will be, drawn on the CPU; pickles small.

    Parameters
    ----------
    index, epoch : int
        The store position and the epoch the draws came from.
    key, offset
        The record's key and offset (named in errors).
    record : gluon_data.format.codec.Record
        The record as read: the encoded image (and mask) bytes, the label.
    kind : str
        One of :data:`KINDS`.
    geometry : tuple
        The drawn parameters of ``kind``.
    mask : numpy.ndarray, optional
        The sample's finished mask, of the dataset's ``mask_dtype`` (segmentation, kinds
        ``train`` and ``val``): give ``mask_dtype="uint8"`` so a plan carries 1 byte a label.

    Examples
    --------
    >>> from gluon_data.arrays import SegmentationDataset
    >>> ds = SegmentationDataset("voc_train.rec", mode="train", base_size=40, crop_size=32,
    ...                          seed=0)
    >>> p = plan_sample(ds, SampleKey(3, epoch=1))
    >>> p.kind, p.mask.shape, p.image[:2]
    ('train', (32, 32), b'\\xff\\xd8')
    """

    index: int
    epoch: int
    key: object
    offset: object
    record: codec.Record
    kind: str
    geometry: tuple = ()
    mask: Optional[np.ndarray] = None

    @property
    def image(self) -> bytes:
        """The encoded image."""
        return self.record.image

    @property
    def label(self) -> Union[float, np.ndarray]:
        """The record's label (a classification sample's target)."""
        return self.record.label


def image_output(dataset: Union[SegmentationDataset, ClassificationDataset]
                 ) -> Optional[Tuple]:
    """How ``dataset`` lays out a finished image, where a batch stage can make it itself:
    ``("hwc",)`` uint8 HxWxC, ``("chw",)`` uint8 CxHxW, ``("tensor", mean, std)`` float32
    CxHxW as ``ToTensor`` + ``Normalize``; ``None`` where an arbitrary image transform runs
    (the stage then replays those samples on the CPU)."""
    if isinstance(dataset, SegmentationDataset):
        fast = dataset._tensorize  # runs before the image transform, which is its fallback
        if dataset._transform is not None and (fast is None or dataset.output is not None):
            return None
    elif isinstance(dataset, ClassificationDataset):
        if dataset._transform is not None or dataset._flag != 1:
            return None
        fast = dataset.fast_path
    else:
        return None
    if fast is None:
        return ("hwc",)
    if fast.tensor.channels not in (1, 3):
        return None
    return ("chw",) if fast.uint8 else ("tensor", fast.tensor.mean, fast.tensor.std)


def _epoch(dataset, i: int, epoch: Optional[int]) -> int:
    """The epoch sample ``i`` draws in: a plain int's request counts as ``__getitem__``'s."""
    return int(dataset._sample(i, None).epoch) if epoch is None else int(epoch)


def _seg_train(ds: SegmentationDataset, rec, key, offset, i: int, epoch: int):
    """The built-in ``train`` draw from the header sizes, and the finished mask (the
    dataset's own :meth:`~gluon_data.arrays.transforms.RandomScaleCrop.apply` on the mask's
    box, with an all-zero image of one channel)."""
    hw, mhw = codec.image_size(rec.image), codec.mask_size(rec.mask)
    if hw is None or mhw is None:
        return None
    if tuple(mhw) != tuple(hw):
        raise CorruptRecordError("mask is %dx%d but image is %dx%d" % (mhw[1], mhw[0], hw[1],
                                                                       hw[0]),
                                 ds.filename, key, offset)
    joint = cast(T.RandomScaleCrop, ds._joint)  # the built-in train transform
    with ds._sample(i, epoch):
        box, params = joint.plan(*hw)
    y0, x0, y1, x1 = box
    mask = ds._decode(codec.decode_mask, rec.mask, key, offset, "mask", rows=(y0, y1))
    _, mask = joint.apply(np.zeros((y1 - y0, x1 - x0, 1), np.uint8), mask[:, x0:x1],
                              params)
    return (box, params, joint.size, joint.image_fill), ds._labels(mask)


def _seg_val(ds: SegmentationDataset, rec, key, offset, i: int, epoch: int):
    """The built-in ``val`` geometry and the finished mask (the dataset's own joint
    transform on the mask, with an all-zero image of one channel)."""
    hw = codec.image_size(rec.image)
    if hw is None or not isinstance(ds._joint, T.Compose) or len(ds._joint.transforms) != 2:
        return None
    short, centre = ds._joint.transforms
    mask = ds._decode(codec.decode_mask, rec.mask, key, offset, "mask")
    if mask.shape != tuple(hw):
        raise CorruptRecordError("mask is %dx%d but image is %dx%d"
                                 % (mask.shape[1], mask.shape[0], hw[1], hw[0]),
                                 ds.filename, key, offset)
    with ds._sample(i, epoch):
        _, mask = ds._joint(np.zeros(tuple(hw) + (1,), np.uint8), mask)
    h, w = hw
    if w > h:
        oh, ow = short.size, int(1.0 * w * short.size / h)
    else:
        ow, oh = short.size, int(1.0 * h * short.size / w)
    return (oh, ow, centre.size, centre.image_fill), ds._labels(mask)


def _segmentation(ds: SegmentationDataset, rec, key, offset, i: int, epoch: int):
    if not ds._builtin_joint or image_output(ds) is None:
        return "replay", (), None
    try:
        if isinstance(ds._joint, T.RandomScaleCrop):
            got, kind = _seg_train(ds, rec, key, offset, i, epoch), "train"
        else:
            got, kind = _seg_val(ds, rec, key, offset, i, epoch), "val"
    except DecodeError as e:  # name the record, as __getitem__ does
        raise DecodeError(e.reason, ds.filename, key, offset) from None
    return ("replay", (), None) if got is None else (kind,) + got


def _classification(ds: ClassificationDataset, rec, i: int, epoch: int):
    fast = ds.fast_path
    if image_output(ds) is None:
        return "replay", (), None
    hw = codec.image_size(rec.image)
    if hw is None or min(hw) <= 0:
        return "replay", (), None
    if fast is None:
        return "crop", ((0, 0) + tuple(hw), False, None, 1), None
    with ds._sample(i, epoch):
        box, flip = fast.plan(*hw)
    size, interp = (None, 1) if fast.crop is None else (tuple(fast.crop[1]), fast.crop[-1])
    return "crop", (box, flip, size, interp), None


def plan_sample(dataset: Union[SegmentationDataset, ClassificationDataset],
                idx: Union[int, SampleKey]) -> SamplePlan:
    """The :class:`SamplePlan` of ``dataset[idx]`` (an int or a
    :class:`~gluon_data.sampling.sampler.SampleKey`): the record read and checked, the
    geometry drawn from ``(seed, epoch, index)`` as ``dataset[idx]`` draws it, the mask
    finished; no image decoded. Bad records raise what ``dataset[idx]`` raises."""
    if not isinstance(dataset, (SegmentationDataset, ClassificationDataset)):
        raise TypeError("plan_sample needs a gluon_data SegmentationDataset or "
                        "ClassificationDataset, got %r" % (dataset,))
    i, epoch = dataset._position(idx)
    epoch = _epoch(dataset, i, epoch)
    rec, key, offset = dataset._record(i)
    if isinstance(dataset, SegmentationDataset):
        kind, geometry, mask = _segmentation(dataset, rec, key, offset, i, epoch)
    else:
        kind, geometry, mask = _classification(dataset, rec, i, epoch)
    return SamplePlan(i, epoch, key, offset, rec, kind, geometry, mask)


def replay(dataset: Union[SegmentationDataset, ClassificationDataset], plan: SamplePlan
           ) -> Any:
    """``dataset[SampleKey(plan.index, plan.epoch)]`` made from the plan's record (no
    second read): the dataset's own ``__getitem__`` on a shallow copy whose record read
    returns the plan's, so the sample is the dataset's, value for value."""
    view = copy.copy(dataset)
    view._positions = None  # the plan holds store positions
    view._record = lambda i: (plan.record, plan.key, plan.offset)  # type: ignore[method-assign]
    return view[SampleKey(plan.index, epoch=plan.epoch)]


class PlanDataset:
    """The plans of a dataset as a map-style dataset: ``PlanDataset(ds)[i]`` is
    ``plan_sample(ds, i)``. Give it to a loader (PyTorch's or Gluon's ``DataLoader``, with
    ``collate_plans`` as the collate / batchify function): its workers read and draw, and
    the process that owns the device decodes (:class:`gluon_data.arrays.device.DeviceStage`).

    Parameters
    ----------
    dataset : SegmentationDataset or ClassificationDataset

    Examples
    --------
    >>> from gluon_data.arrays import SegmentationDataset
    >>> ds = SegmentationDataset("voc_val.rec", mode="val", crop_size=32)
    >>> plans = PlanDataset(ds)
    >>> len(plans) == len(ds), plans[0].kind
    (True, 'val')
    """

    def __init__(self, dataset: Union[SegmentationDataset, ClassificationDataset]) -> None:
        if not isinstance(dataset, (SegmentationDataset, ClassificationDataset)):
            raise TypeError("PlanDataset needs a gluon_data SegmentationDataset or "
                            "ClassificationDataset, got %r" % (dataset,))
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx) -> SamplePlan:
        return plan_sample(self.dataset, idx)

    def __repr__(self) -> str:
        return "PlanDataset(%r)" % (self.dataset,)


def collate_plans(plans: Iterable[SamplePlan]) -> List[SamplePlan]:
    """A loader's collate function for :class:`PlanDataset`: the batch's plans as a list
    (the stage decodes them in the consumer's process)."""
    return list(plans)
