"""Framework-free datasets: numpy samples from any store, seeded joint transforms.

:class:`SegmentationDataset` and :class:`ClassificationDataset` (:mod:`.datasets`) return the
samples of the Gluon datasets as numpy arrays and import no MXNet; :mod:`.transforms` holds the
seeded joint (image, mask) transforms (the fused ``train`` one and the mask resampling in
:mod:`.scalecrop`), :mod:`.tensorize` the numpy ``ToTensor`` / ``Normalize``
/ crop fast paths; :class:`BatchRing` (:mod:`.batchring`) is a ``collate_fn`` that hands a
PyTorch ``DataLoader``'s batches over in shared memory its workers reuse.
"""
from .batchring import BatchRing
from .datasets import MODES, ClassificationDataset, SegmentationDataset

__all__ = ["SegmentationDataset", "ClassificationDataset", "MODES", "BatchRing"]
