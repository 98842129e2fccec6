"""gluon_data: pack image datasets into RecordIO or LMDB once, and read them back fast.

The package is in layers, each importing only those below it (``docs/architecture.md``):
``storage`` (files, locks, the cache, fsspec), ``format`` (codec, decoder of record,
documents), ``stores`` (RecordIO, LMDB, sharded, remote), ``sampling``, ``arrays`` (numpy
datasets for any framework), ``tools`` (verify, salvage, stats), ``convert``; then ``gluon``,
the MXNet layer, and ``cli``. Everything below ``gluon`` runs without MXNet.

Names are imported on first use (PEP 562), so tools that only convert or check files do not
pay for what they do not use; the Gluon names need MXNet and say how to install it when it is
missing. Modules of the old flat layout (``gluon_data.codec``, ``gluon_data.remote`` ...) stay
importable through one alias table (:mod:`gluon_data._moved`), with a ``DeprecationWarning``.
"""
import importlib
import importlib.machinery
import sys
import types
import warnings

from ._moved import MOVED_MODULES, MOVED_NAMES
from ._version import __version__

# name -> the module that defines it. The Gluon names need MXNet (``gluon_data.gluon``).
_CORE = {
    "RecordStore": "stores.base", "open_store": "stores.base",
    "SampleKey": "sampling.sampler", "DistributedSampler": "sampling.sampler",
    "RecordFile": "stores.recordio", "RecordWriter": "stores.recordio",
    "LMDBFile": "stores.lmdbio", "LMDBWriter": "stores.lmdbio",
    "convert": "convert", "ConversionReport": "convert", "ConvertOptions": "convert.options",
    "RemoteOptions": "storage.options", "RecipeLayout": "stores.recipe_layout",
    "verify": "tools.verify", "salvage": "tools.salvage",
    "GluonDataError": "errors", "FormatError": "errors", "CorruptRecordError": "errors",
    "DecodeError": "errors", "SourceError": "errors", "ConversionError": "errors",
    "OutputError": "errors",
}
_GLUON = {
    "ImageRecordDataset": "gluon.datasets", "SegmentationRecordDataset": "gluon.datasets",
    "ImageLMDBDataset": "gluon.datasets", "SegmentationLMDBDataset": "gluon.datasets",
    "RecipeLMDBDataset": "gluon.datasets", "CaffeLMDBDataset": "gluon.datasets",
    "ClassificationDataset": "gluon.datasets", "SegmentationDataset": "gluon.datasets",
    "SegmentationBatchify": "gluon.batchify", "MultiSizeBatchify": "gluon.batchify",
    "StackBatchify": "gluon.batchify", "InputNormalize": "gluon.normalize",
    "DataLoader": "gluon.loader", "WorkerDiedError": "gluon.loader",
}
_EXPORTS = {**_CORE, **_GLUON}
# the layers, as attributes (``gluon_data.arrays``, ``gluon_data.mx_recordio`` ...)
_SUBPACKAGES = ("arrays", "cli", "convert", "format", "gluon", "mx_recordio", "sampling",
                "storage", "stores", "tools")

# (``convert`` is both: the function, whose module keeps it callable)
__all__ = ["__version__"] + sorted(_EXPORTS) + [p for p in _SUBPACKAGES if p not in _EXPORTS]


class _MovedModule(types.ModuleType):
    """An old module name: every attribute is looked up in its new home (see ``_moved.py``)."""

    def __getattr__(self, name):
        if name == "__all__":  # ``from OLD import *``: the new home's names, and those moved on
            value = _moved_all(self.__name__)
        elif name.startswith("__"):
            raise AttributeError(name)
        else:
            value = self._resolve(name)
        setattr(self, name, value)
        return value

    def _resolve(self, name):
        home = MOVED_NAMES.get(self.__name__, {}).get(name)
        target = home or MOVED_MODULES.get(self.__name__)
        try:
            value = getattr(importlib.import_module(target), name)
        except AttributeError:
            if home is None and self.__name__ + "." + name in MOVED_MODULES:
                return importlib.import_module(self.__name__ + "." + name)
            raise AttributeError("module %r has no attribute %r" % (self.__name__, name))
        if home is not None:  # not where the module's own warning sent the user
            warnings.warn("%s.%s moved to %s; import it from there (the old name will be "
                          "removed)" % (self.__name__, name, home), DeprecationWarning,
                          stacklevel=3)
        return value

    def __dir__(self):
        target = importlib.import_module(MOVED_MODULES[self.__name__])
        return sorted(set(dir(target)) | set(MOVED_NAMES.get(self.__name__, ())))

    def __call__(self, *args, **kwargs):  # ``gluon_data.verify`` was callable as a module
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


class _MovedFinder:
    """Finds the old module names of :data:`MOVED_MODULES` and loads each as a
    :class:`_MovedModule`, warning once where it moved. A meta path finder and its loader
    by protocol (``find_spec``; ``create_module`` and ``exec_module``), not by subclassing
    ``importlib.abc``: importing that module costs every ``import gluon_data`` 12-20 ms."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        is_package = any(m.startswith(fullname + ".") for m in MOVED_MODULES)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec):
        module = _MovedModule(spec.name)
        if spec.submodule_search_locations is not None:
            module.__path__ = []
        return module

    def exec_module(self, module):
        elsewhere = len(MOVED_NAMES.get(module.__name__, ()))
        warnings.warn("%s moved to %s; import it from there (the old name will be removed)%s"
                      % (module.__name__, MOVED_MODULES[module.__name__],
                         "; %d of its names moved elsewhere: each warns where when used"
                         % elsewhere if elsewhere else ""),
                      DeprecationWarning, stacklevel=2)


def _moved_all(old: str) -> list:
    """``__all__`` of an old module: its new home's (else that module's public names that
    are not modules), then its names that moved elsewhere (:data:`MOVED_NAMES`)."""
    target = importlib.import_module(MOVED_MODULES[old])
    names = getattr(target, "__all__", None)
    if names is None:
        names = [n for n, v in vars(target).items()
                 if not n.startswith("_") and not isinstance(v, types.ModuleType)]
    moved = [n for n in MOVED_NAMES.get(old, ()) if not n.startswith("_")]
    return list(dict.fromkeys(list(names) + moved))


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module("." + _EXPORTS[name], __name__), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module("." + name, __name__)
    elif __name__ + "." + name in MOVED_MODULES:  # ``gluon_data.codec`` as an attribute
        value = importlib.import_module(__name__ + "." + name)
    else:
        raise AttributeError("module 'gluon_data' has no attribute %r" % name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
