"""gluon_data: Gluon datasets and converters for images packed in MXNet RecordIO or LMDB.

Names are imported on first use (PEP 562), so command-line tools that only convert or check
files do not pay for importing MXNet.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "ImageRecordDataset": "datasets", "SegmentationRecordDataset": "datasets",
    "ImageLMDBDataset": "datasets", "SegmentationLMDBDataset": "datasets",
    "RecipeLMDBDataset": "datasets", "CaffeLMDBDataset": "datasets",
    "ClassificationDataset": "datasets", "SegmentationDataset": "datasets",
    "RecordStore": "store", "open_store": "store", "SampleKey": "sampler",
    "RecordFile": "recordio", "RecordWriter": "recordio",
    "LMDBFile": "lmdbio", "LMDBWriter": "lmdbio",
    "convert": "convert", "ConversionReport": "convert",
    "verify": "verify", "salvage": "salvage",
    "SegmentationBatchify": "batchify", "MultiSizeBatchify": "batchify",
    "StackBatchify": "batchify", "InputNormalize": "normalize",
    "DataLoader": "loader", "WorkerDiedError": "loader",
    "DistributedSampler": "sampler",
    "GluonDataError": "errors", "FormatError": "errors", "CorruptRecordError": "errors",
    "DecodeError": "errors", "SourceError": "errors", "ConversionError": "errors",
    "OutputError": "errors",
}
_MODULES = ("codec", "transforms", "sample", "stats", "preview", "sources", "meta", "store",
            "sampler")

__all__ = ["__version__"] + sorted(_EXPORTS) + list(_MODULES)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module("." + _EXPORTS[name], __name__), name)
    elif name in _MODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError("module 'gluon_data' has no attribute %r" % name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
