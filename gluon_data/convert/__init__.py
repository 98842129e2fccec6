"""Converters: pack a source layout into RecordIO or LMDB, validating every image and mask;
copy a dataset between containers; import the legacy LMDB layouts.

The package reads as the data flow, each module one concern, imports pointing one way
(each module imports only those below it):

========================  ==================================================================
``driver``                :func:`convert`: the one merge of the options and the one dispatch
``to_uri``                into object storage: staged, then uploaded (``upload``)
``upload``                uploads and shard uploads by the one commit protocol
``sharded``               sharded conversions: one task per shard, a manifest per split
``shard_task``            one shard task (written, or kept by the one rule of "done")
``engines``               where shard tasks and encoders run (process pool, Dask)
``local``                 the local, unsharded conversion of a source layout
``copy``                  copies of a dataset (rec <-> lmdb) and legacy LMDB imports
``loop``                  :func:`drive`, the loop every planned conversion runs
``resume``                the plan digest and checkpoints (``--resume``)
``planning``              a source opened and planned under one :class:`ConvertOptions`
``outputs``               :class:`ConversionReport`, output names, the writers of each
                          container (:class:`Outputs`), option checks, metadata
``done``                  the one rule of "done" (done records: sizes and digests)
``encode``                per-item work in the worker processes (:func:`encode_item`)
``options``               :class:`ConvertOptions` and which options each conversion reads
``sources``               source layouts (``source_files``: reading their files)
``sample``, ``demo``      small generated datasets, the demo
========================  ==================================================================

The running statistics are :class:`gluon_data.tools.stats.RunningStats`. Everything is
importable from ``gluon_data.convert`` as before the split (on first use).
"""
import importlib
import warnings

from .._callable import callable_module

# Names are imported on first use (PEP 562, as the top-level package does): a worker process
# that only encodes items (it unpickles ``encode._work``) imports ``encode`` and what it needs,
# not the writers, the copy and sharded drivers and their containers.
_EXPORTS = {
    "_start_pool": ".engines", "_stop_pool": ".engines", "_worker_init": ".engines",
    "_Stats": ("..tools.stats", "RunningStats"),
    "_stock_meta": ".copy",
    "_plan": (".planning", "plan_splits"), "convert": ".driver", "is_dataset": ".planning",
    "ConvertOptions": ".options",
    "SplitJobs": ".loop", "drive": ".loop",
    **{n: ".encode" for n in (
        "_PASSTHROUGH_FORMATS", "EncodeOptions", "_check_pixels", "_decode_like_reader",
        "_encode_pixels", "_legacy_work", "_mask_indices", "_open_strict", "_pixel_stats",
        "_read_bytes", "_reads_back", "_resize_short", "_work", "encode_item", "encode_legacy",
        "image_part", "mask_part")},
    **{n: ".outputs" for n in (
        "ENCODINGS", "FORMATS", "ConversionReport", "Outputs", "_check_choices",
        "_check_options", "_check_output", "_check_range", "_conversion_id", "_fail",
        "_free_space", "_metadata", "_output_lock", "_split_fields", "open_writers",
        "output_format", "output_paths", "outputs_for")},
    **{n: ".resume" for n in ("_Checkpoint", "_import_digest", "_plan_digest",
                              "_resume_finished")},
    **{n: ".sharded" for n in ("ShardJob", "write_shard")},
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
               "resume", "shard_task", "sharded", "to_uri")


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
