"""gluon_data: Gluon datasets and converters for images packed in MXNet RecordIO or LMDB."""
__version__ = "0.1.0"

from .errors import (ConversionError, CorruptRecordError, DecodeError, FormatError,  # noqa: E402
                     GluonDataError, SourceError)
from .recordio import RecordFile, RecordWriter  # noqa: E402
from .datasets import (ImageLMDBDataset, ImageRecordDataset, SegmentationLMDBDataset,  # noqa: E402
                       SegmentationRecordDataset)
from .lmdbio import LMDBFile, LMDBWriter  # noqa: E402
from .legacy import CaffeLMDBDataset, RecipeLMDBDataset  # noqa: E402
from .convert import ConversionReport, convert  # noqa: E402
from .batchify import MultiSizeBatchify, SegmentationBatchify  # noqa: E402
from . import transforms  # noqa: E402

__all__ = [
    "__version__",
    "ImageRecordDataset", "SegmentationRecordDataset", "ImageLMDBDataset",
    "SegmentationLMDBDataset", "LMDBFile", "LMDBWriter", "RecipeLMDBDataset", "CaffeLMDBDataset",
    "RecordFile", "RecordWriter",
    "convert", "ConversionReport",
    "SegmentationBatchify", "MultiSizeBatchify", "transforms",
    "GluonDataError", "FormatError", "CorruptRecordError", "DecodeError", "SourceError",
    "ConversionError",
]
