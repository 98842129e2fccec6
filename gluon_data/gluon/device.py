"""The batch stage under Gluon's ``DataLoader``: workers draw plans, this process makes the
batches (on the GPU when one is present) and hands them over as NDArrays.

:class:`DeviceLoader` is ``gluon.data.DataLoader`` over a
:class:`~gluon_data.arrays.plan.PlanDataset`: its workers read the records and draw each
sample's geometry and mask; the batch's images are decoded and transformed by a
:class:`~gluon_data.arrays.device.DeviceStage` in the consumer's process, and reach MXNet
through DLPack (``mx.nd.from_dlpack``) without a copy on the GPU.
"""
from __future__ import annotations

from typing import Optional

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..arrays.device import DeviceStage
from ..arrays.plan import PlanDataset, collate_plans

__all__ = ["DeviceLoader", "to_ndarray"]


def to_ndarray(x):
    """A stage's array as an NDArray: numpy copied to the CPU context, a torch tensor (the
    GPU path) shared through DLPack."""
    if isinstance(x, np.ndarray):
        return mx.nd.array(x, dtype=x.dtype)
    import torch.utils.dlpack
    return mx.nd.from_dlpack(torch.utils.dlpack.to_dlpack(x.contiguous()))


class DeviceLoader:
    """``gluon.data.DataLoader`` whose batches a :class:`~gluon_data.arrays.device.DeviceStage`
    makes: ``(data, target)`` NDArrays, the same values as the dataset's samples stacked
    (exactly on the CPU; within the documented tolerance on a GPU, masks exact).

    Parameters
    ----------
    dataset : gluon_data.gluon.datasets.SegmentationDataset or ClassificationDataset
        Any of our task datasets (Gluon's or the framework-free ones).
    batch_size : int, optional
        As ``DataLoader``'s (or give ``batch_sampler``).
    backend : {None, 'nvimgcodec', 'torchvision', 'cpu'}
        The stage's backend (``None``: a GPU one when importable and a device is present).
    device : int, default 0
        The CUDA device of a GPU backend.
    **loader_kwargs
        ``DataLoader``'s other keywords (``shuffle``, ``sampler``, ``batch_sampler``,
        ``num_workers``, ``last_batch``, ...); ``batchify_fn`` is the stage's.

    Examples
    --------
    >>> from gluon_data.gluon.datasets import SegmentationDataset
    >>> ds = SegmentationDataset("voc_val.rec", mode="val", crop_size=32)
    >>> loader = DeviceLoader(ds, batch_size=4, num_workers=2)
    >>> data, target = next(iter(loader))
    >>> data.shape, target.dtype
    ((4, 32, 32, 3), <class 'numpy.int32'>)
    """

    def __init__(self, dataset, batch_size: Optional[int] = None, *,
                 backend: Optional[str] = None, device: int = 0, **loader_kwargs):
        if "batchify_fn" in loader_kwargs:
            raise ValueError("DeviceLoader batches with its stage; drop batchify_fn=%r"
                             % (loader_kwargs["batchify_fn"],))
        self.stage = DeviceStage(dataset, backend=backend, device=device)
        self._loader = gluon.data.DataLoader(PlanDataset(dataset), batch_size,
                                             batchify_fn=collate_plans, **loader_kwargs)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self):
        for plans in self._loader:
            data, target = self.stage(plans)
            yield to_ndarray(data), to_ndarray(target)
