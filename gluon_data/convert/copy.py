"""Container copy and legacy import: a converted dataset copied between containers
(``.rec`` <-> ``.lmdb``) byte for byte, and the legacy LMDB layouts (``raw-lmdb``,
``caffe-lmdb``) imported through the conversion driver (workers, resume, progress, report).
"""
from __future__ import annotations

import itertools
import os
import time
from functools import partial
from typing import Any, Dict, Optional, Tuple, cast

from .._version import __version__
from ..format import codec
from ..errors import ConversionError, FormatError, SourceError
from ..format.ownership import check_disjoint
from ..stores.legacy import LEGACY_LAYOUTS, caffe_lmdb_items, raw_lmdb_items
from ..stores.lmdbio import LMDBFile, is_lmdb, read_lmdb_meta
from ..format.meta import CONTAINER_KEYS, FORMAT_NAME, FORMAT_VERSION, ids_are_keys, read_meta
from ..stores.recordio import RecordFile
from ..stores.shards import dataset_files
from .sources import Source
from ..stores.base import is_uri, open_store
from .options import ConvertOptions, refuse_unread
from .encode import EncodeOptions, encode_legacy_job
from .loop import SplitJobs, drive
from .done import file_facts, output_unit
from .outputs import (check_choices, check_options, check_output, done_record, fail_conversion,
                      output_lock, outputs_for, split_metadata, writer_conversion_id)
from .report import ConversionReport
from .resume import import_digest

__all__ = ["copy_dataset", "import_lmdb", "open_copy_sources", "stock_meta"]


#: The options a legacy LMDB import reads.
_IMPORT_READS = frozenset(("split", "image_shape", "mask_shape", "channels_first", "bgr",
                           "encoding", "quality", "classes", "num_classes", "ignore_label",
                           "format", "overwrite", "on_error", "max_pixels", "progress",
                           "workers", "resume", "checkpoint_every", "source_options"))


def import_lmdb(source: str, output: str, layout: str,
                options: Optional[ConvertOptions] = None, **overrides) -> ConversionReport:
    """Import a ``raw-lmdb`` (the original recipe) or ``caffe-lmdb`` into our format.

    Raw arrays are kept raw by ``encoding='passthrough'`` for ``raw-lmdb`` (lossless, no
    decode cost) and stored as PNG for Caffe; encoded Caffe images keep their bytes. Runs
    through the conversion driver: ``workers`` encode, ``resume`` continues an interrupted
    import from its last checkpoint (as :func:`~gluon_data.convert.convert`).

    Examples
    --------
    >>> import_lmdb("voc_lmdb", "voc.rec", "raw-lmdb", split="train",
    ...             image_shape=(256, 256, 3))                                  # doctest: +SKIP
    """
    o = ConvertOptions.merge(options, overrides)
    refuse_unread(o, _IMPORT_READS, "a legacy LMDB import")
    split, image_shape, mask_shape = o.split, o.image_shape, o.mask_shape
    channels_first, bgr, encoding, quality = o.channels_first, o.bgr, o.encoding, o.quality
    classes, num_classes, ignore_label = o.classes, o.num_classes, o.ignore_label
    format, on_error, max_pixels, workers = o.format, o.on_error, o.max_pixels, o.workers
    checkpoint_every = o.checkpoint_every
    check_choices(encoding, on_error)
    check_options(quality=quality, max_pixels=max_pixels, ignore_label=ignore_label,
                   num_classes=num_classes, workers=workers, checkpoint_every=checkpoint_every)
    outputs = outputs_for(output, format)
    check_output(output, outputs.name)
    source = os.fspath(source)
    t0 = time.perf_counter()
    split = split or "train"

    def read():
        if layout == "raw-lmdb":
            return raw_lmdb_items(source, split, image_shape, mask_shape, channels_first, bgr)
        if layout == "caffe-lmdb":
            return caffe_lmdb_items(source)
        raise SourceError("unknown LMDB layout %r; valid: %s"
                          % (layout, ", ".join(LEGACY_LAYOUTS)), source)
    try:
        n, _ = read()
    except (SourceError, FormatError) as e:
        raise ConversionError("cannot read source: %s" % e.reason, e.path or source) from None
    task, raw_as = (("segmentation", "raw") if layout == "raw-lmdb"
                    else ("classification", "png"))
    if classes is not None:
        classes = list(classes)
        num_classes = len(classes)
    opts = EncodeOptions(task=task, encoding=encoding, quality=quality,
                         num_classes=num_classes if task == "segmentation" else None,
                         ignore_label=ignore_label, max_pixels=max_pixels)
    src = Source(layout, source, task, {split: []}, classes)
    report = ConversionReport(outputs=outputs.paths(os.fspath(output), [split]))
    check_disjoint(dataset_files(*report.outputs.values(), container=outputs.name),
                   dataset_files(source))
    import_options = dict(encoding=encoding, quality=quality,
                          image_shape=list(image_shape) if image_shape is not None else None,
                          mask_shape=list(mask_shape) if mask_shape is not None else None,
                          channels_first=channels_first, bgr=bgr)

    def jobs(start):  # records are read (and parsed) here, encoded in the workers
        return itertools.islice(enumerate(read()[1]), start, None)

    whole = import_digest(source, layout, split, n, opts, import_options)

    def finish_meta(s, w, st, digest, facts=file_facts):
        meta = split_metadata(src, s, w.count, st, opts, classes, num_classes, report.skipped,
                              import_options)
        meta["conversion_id"] = writer_conversion_id(digest, s, w, st)
        meta["done"] = done_record(output_unit(s), whole, w, facts)
        return meta

    return drive(output, outputs, {split: SplitJobs(n, jobs)},
                 partial(encode_legacy_job, opts=opts, raw_as=raw_as),
                 digest=whole, root=source,
                 options=import_options, report=report, finish_meta=finish_meta, source=source,
                 run=o, verb="import", t0=t0)



def stock_meta(path: str, count: int) -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "task": "classification",
            "split": "train", "num_records": count, "checksum": None,
            "image_encoding": "passthrough", "classes": None, "num_classes": None,
            "created_by": {"tool": "gluon_data %s" % __version__, "layout": "stock-rec",
                           "source": path if is_uri(path) else os.path.abspath(path),
                           "options": {}},
            "skipped": []}


def _uri_sources(source: str, split: Optional[str],
                 options: dict) -> Dict[str, Tuple[Any, dict]]:
    """``{split: (store, meta)}`` of a dataset at a URI, read through its remote store (a
    ``.rec`` and its ``.idx`` downloaded whole into the cache on the first read; an LMDB's
    ``data.mdb`` when opened)."""
    first = open_store(source, **options)
    names = getattr(first, "splits", None)  # an LMDB holds several
    if names is None:
        meta = first.meta or stock_meta(source, len(first))
        return {meta.get("split") or "train": (first, meta)}
    out: Dict[str, Tuple[Any, dict]] = {}
    for s in (split.split(",") if split else names):
        f = first if s == first.split else open_store(source, s, **options)
        out[s] = (f, cast(dict, f.meta))  # an LMDB split's metadata: always there
    return out


def copy_dataset(source: str, output: str, *, split: Optional[str] = None,
                 format: Optional[str] = None, overwrite: bool = False,
                 progress: bool = False,
                 source_options: Optional[dict] = None) -> ConversionReport:
    """Copy a dataset between containers (``.rec`` <-> ``.lmdb``) without re-encoding.

    Record payloads are copied byte for byte after their checksum is verified; keys and
    metadata travel with them, so ``rec -> lmdb -> rec`` reproduces the ``.rec``, ``.idx``
    and ``.meta.json`` exactly. A stock ``.rec`` (no metadata) gets classification metadata.

    ``source`` may be a URI (``s3://bucket/voc.rec``, ``s3://bucket/voc.lmdb``): its records
    are read through the remote store (:mod:`gluon_data.stores.remote`, options from
    ``source_options``: ``storage_options``, ``cache_dir``...), the same bytes as a local copy.

    Examples
    --------
    >>> copy_dataset("s3://bucket/voc_train.rec", "voc_train.lmdb",
    ...              source_options={"storage_options": {"endpoint_url": "http://127.0.0.1:9000"}})  # doctest: +SKIP
    """
    outputs = outputs_for(output, format)
    if is_uri(output):
        raise ValueError("copy_dataset writes a local output, not %s: use "
                         "gluon_data.convert.to_uri.convert_to_uri (CLI: gluon-data convert SRC URI)"
                         % output)
    check_output(output, outputs.name)
    t0 = time.perf_counter()
    sources = open_copy_sources(source, split, source_options)
    report = ConversionReport(outputs=outputs.paths(os.fspath(output), list(sources)))
    check_disjoint(dataset_files(*report.outputs.values(), container=outputs.name),
                   dataset_files(source))
    writers: Dict[str, Any] = {}
    lock = None
    try:
        lock = output_lock(output, list(sources), outputs.name)
        writers = outputs.open(output, list(sources), overwrite)
        for s, (f, meta) in sources.items():
            w = writers[s]
            _copy_split(f, meta, w, outputs)
            report.written[s] = w.count
            report.bytes_written += w.bytes_written
        for w in writers.values():
            w.publish()
    except BaseException as e:
        fail_conversion(e, writers, output)
    finally:
        if lock is not None:
            lock.release()
    report.seconds = time.perf_counter() - t0
    return report


def open_copy_sources(source: str, split: Optional[str],
                      source_options: Optional[dict]) -> Dict[str, Tuple[Any, dict]]:
    """``{split: (store, meta)}``: the splits of a dataset to copy, at a URI, an LMDB or a
    ``.rec`` (a stock one given classification metadata); each store's ``split`` is ``None``
    for a ``.rec``. The one reading of a copy's source, for a copy and a sharded copy alike."""
    if is_uri(source):
        return _uri_sources(source, split, dict(source_options or {}))
    sources: Dict[str, Tuple[Any, dict]] = {}
    if is_lmdb(source):
        metas = read_lmdb_meta(source)
        names = split.split(",") if split else sorted(metas)
        for s in names:
            f = LMDBFile(source, s)  # raises listing the available splits
            sources[s] = (f, f.meta)
    else:
        meta = read_meta(source)
        rec = RecordFile(source, expected_count=meta["num_records"] if meta else None)
        meta = meta or stock_meta(source, len(rec))
        sources[meta.get("split") or "train"] = (rec, meta)
    return sources


def _copy_split(f, meta: dict, w, outputs) -> None:
    """Copy the records of one split, ``f``, into writer ``w``, each payload verified and
    kept byte for byte under its key; then finish ``w`` with the split's metadata."""
    keys = meta.get("record_keys")  # non-dense .idx keys kept by a rec -> lmdb copy
    # (``done`` is kept: a copy of the same records is the same bytes, which its digests
    # prove, and anything else fails them)
    meta = {k: v for k, v in meta.items() if k not in CONTAINER_KEYS}
    task_seg = meta["task"] == "segmentation"
    # ours, but written before header ids were always the keys (an LMDB from a .lst
    # without record_keys, or items skipped): the header ids are the true keys
    id_keys = (keys is None and meta.get("checksum") == "crc32-id2"
               and not ids_are_keys(meta, "lmdb" if f.split is not None else "rec"))
    for i in range(len(f)):
        payload = f.read(i)
        rec = codec.unpack(payload, segmentation=task_seg, verify=True,
                           path=f.location, key=f.key(i), offset=f.offset(i))
        key = keys[i] if keys is not None else rec.id if id_keys else f.key(i)
        w.write(key, payload)
    w.finish(outputs.copy_meta(meta, [f.key(i) for i in range(len(f))]
                               if keys is None else list(keys)))
