"""gluon_data: Gluon datasets and converters for images packed in MXNet RecordIO or LMDB.

Names are imported on first use (PEP 562), so command-line tools that only convert or check
files do not pay for importing MXNet.
"""
import importlib
import sys
import types

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
    "StackBatchify": "batchify",
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


class _Package(types.ModuleType):
    """``convert``, ``verify`` and ``salvage`` name both a module and the function it
    exports: the package attribute stays the function whichever imports the module first
    (the import system sets the attribute to the module once it has loaded)."""

    def __setattr__(self, name, value):
        if _EXPORTS.get(name) == name and isinstance(value, types.ModuleType):
            value = getattr(value, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
