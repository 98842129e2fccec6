"""Converters: pack a source layout into RecordIO or LMDB, validating every image and mask;
copy a dataset between containers; import the legacy LMDB layouts.

The package reads as the data flow, each module one concern, imports pointing one way
(each module imports only those below it):

========================  ==================================================================
``demo``                  ``gluon-data demo``: a generated sample packed and read back
``driver``                :func:`convert`: the one merge of the options and the one dispatch
``to_uri``                into object storage: staged, then uploaded (``upload``)
``upload``                uploads and shard uploads by the one commit protocol
``sharded``               sharded conversions, stage by stage: the four modules below
``publish``               a sharded conversion's manifests, one per split, written last
``superseded``            the datasets a sharded conversion replaces; old shards removed last
``shard_plan``            a sharded conversion planned (a plan per split), its outputs checked
``shard_task``            one shard task (written, or kept by the one rule of "done"), all run
``local``                 the local, unsharded conversion of a source layout
``copy``                  copies of a dataset (rec <-> lmdb) and legacy LMDB imports
``loop``                  :func:`drive`, the loop every planned conversion runs
``engines``               where shard tasks and encoders run (process pool, Dask)
``workers``               the process pool of encoders and shard tasks (:class:`EncoderPool`)
``workerprocs``           how the pool's workers start (forked by one starter) and end;
                          the starter also hashes the output as it is written
``planning``              a source opened and planned under one :class:`ConvertOptions`
``resume``                the plan digest and checkpoints (``--resume``)
``outputs``               output names, writers, option checks and metadata
``report``                :class:`ConversionReport`: what a conversion wrote, kept and skipped
``done``                  the one rule of "done" (done records: sizes and digests)
``chunks``                a worker's tasks: a chunk encoded into a segment, segments copied
``encode``                per-item work in the worker processes (:func:`encode_item`)
``options``               :class:`ConvertOptions` and which options each conversion reads
``sample``                small synthetic datasets in real layouts, for demos and tests
``sources``               source layouts: a folder (or an im2rec ``.lst``) listed as items
``source_files``          what a source may read: paths confined to its root, sizes bounded
========================  ==================================================================

The running statistics are :class:`gluon_data.tools.stats.RunningStats`. The public names
of ``__all__`` import from ``gluon_data.convert`` (on first use); a module's helpers that other
modules of the package use are public in that module (``gluon_data.convert.outputs``, ...).
"""
import importlib
import warnings

from .._callable import callable_module

# Names are imported on first use (PEP 562, as the top-level package does): a worker process
# that only encodes items (it unpickles ``encode.encode_job``) imports ``encode`` and what it
# needs, not the writers, the copy and sharded drivers and their containers. Only public
# names: a module's helpers are imported from that module.
_EXPORTS = {
    "convert": ".driver", "is_dataset": ".planning", "ConvertOptions": ".options",
    "SplitJobs": ".loop", "drive": ".loop",
    **{n: ".encode" for n in (
        "EncodeOptions", "encode_item", "encode_legacy", "image_part", "mask_part")},
    **{n: ".outputs" for n in (
        "ENCODINGS", "FORMATS", "Outputs", "open_writers", "output_format", "output_paths",
        "outputs_for")},
    "ConversionReport": ".report",
    **{n: ".shard_task" for n in ("ShardJob", "write_shard")},
}

__all__ = ["convert", "ConvertOptions",
           "ConversionReport", "EncodeOptions", "encode_item", "ENCODINGS", "FORMATS",
           "output_paths", "output_format", "open_writers", "outputs_for", "Outputs", "drive",
           "SplitJobs", "is_dataset"]

#: The conversion functions beside :func:`convert` that are internal now: still importable
#: from here, with a ``DeprecationWarning`` saying what to call instead and where the name
#: itself can still be imported from.
_INTERNAL = {
    "convert_sharded": ("shards=N (or shard_size=, shard_items=)", ".sharded"),
    "convert_to_uri": ("an output at a URI (s3://...)", ".to_uri"),
    "copy_dataset": ("a converted dataset as the source (.rec, .lmdb)", ".copy"),
    "import_lmdb": ("layout='raw-lmdb' or 'caffe-lmdb'", ".copy"),
    "convert_local": ("a local output", ".local"),
}


_SUBMODULES = ("copy", "driver", "encode", "local", "loop", "options", "outputs", "planning",
               "report", "resume", "shard_task", "sharded", "to_uri")


def __getattr__(name):
    if name in _INTERNAL:
        how, home = _INTERNAL[name]
        warnings.warn("gluon_data.convert.%s is internal now: call gluon_data.convert() with "
                      "%s, which decides the conversion (the name is importable from "
                      "gluon_data.convert%s for now)" % (name, how, home),
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home, __name__), name)
    where = _EXPORTS.get(name)
    if where is None and name in _SUBMODULES:  # ``gluon_data.convert.loop``, as before
        where = ("." + name, None)
    if where is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = importlib.import_module(module, __name__)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES) | set(_INTERNAL))


callable_module(__name__)  # from gluon_data import convert: the function, even once the module is loaded
