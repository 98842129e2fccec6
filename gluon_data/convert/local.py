"""The local, unsharded conversion: :func:`convert_local` imports a legacy LMDB, copies a
dataset, or plans a source layout into splits (:mod:`.planning`) and hands them to
:func:`~.loop.drive`, the loop every planned conversion runs through."""
from __future__ import annotations

import os
import time
from functools import partial
from typing import Dict, List, Optional, Sequence

from .engines import _stop_pool
from ..errors import ConversionError, SourceError
from ..format import codec
from ..format.ownership import check_disjoint
from ..stores.shards import dataset_files
from .sources import Item, Source, open_source
from .copy import copy_dataset, import_lmdb
from .encode import EncodeOptions, _work
from .loop import SplitJobs, drive, start_encoders
from .done import output_unit
from .outputs import (ConversionReport, _check_choices, _check_options, _check_output,
                      _metadata, _split_fields, done_record, outputs_for)
from .options import ConvertOptions
from .planning import encode_options, is_dataset, plan_splits, resolve_classes, take_problems
from .resume import _plan_digest

__all__ = ["convert_local"]

def convert_local(source: str, output: str, layout: Optional[str],
                  options: ConvertOptions) -> ConversionReport:
    """One conversion into a local output, unsharded: a legacy LMDB imported
    (:func:`~.copy.import_lmdb`), a dataset copied (:func:`~.copy.copy_dataset`), or a source
    layout planned (:mod:`.planning`) and driven (:func:`~.loop.drive`). Reached through
    :func:`gluon_data.convert`, which decides which conversion runs."""
    o = options
    split, val_ratio, shuffle, seed = o.split, o.val_ratio, o.shuffle, o.seed
    encoding, quality, resize, workers = o.encoding, o.quality, o.resize, o.workers
    overwrite, on_error, classes, num_classes = o.overwrite, o.on_error, o.classes, o.num_classes
    ignore_label, images_dir, masks_dir = o.ignore_label, o.images_dir, o.masks_dir
    lst_root, max_pixels, format = o.lst_root, o.max_pixels, o.format
    checkpoint_every, progress = o.checkpoint_every, o.progress
    mask_encoding, follow_symlinks = o.mask_encoding, o.follow_symlinks
    max_file_bytes, source_options = o.max_file_bytes, o.source_options
    _check_choices(encoding, on_error)
    if mask_encoding not in codec.MASK_ENCODINGS:
        raise ValueError("unknown mask_encoding %r; valid: %s"
                         % (mask_encoding, ", ".join(codec.MASK_ENCODINGS)))
    _check_options(quality=quality, resize=resize, workers=workers, max_pixels=max_pixels,
                   max_file_bytes=max_file_bytes, checkpoint_every=checkpoint_every,
                   ignore_label=ignore_label, num_classes=num_classes)
    outputs = outputs_for(output, format)
    _check_output(output, outputs.name)
    source = os.fspath(source)
    if layout in ("raw-lmdb", "caffe-lmdb"):
        return import_lmdb(source, output, layout, o.replace(format=outputs.name))
    if is_dataset(source):
        return copy_dataset(source, output, split=split, format=outputs.name,
                            overwrite=overwrite, progress=progress,
                            source_options=source_options)
    t0 = time.perf_counter()
    # the workers start (import the encoder) while the source is listed and stamped; drive
    # owns the pool
    pool = start_encoders(workers, _work)
    try:
        src, classes, num_classes, plan, report = _open_and_plan(
            source, layout, output, outputs, split=split, images_dir=images_dir,
            masks_dir=masks_dir, lst_root=lst_root, follow_symlinks=follow_symlinks,
            classes=classes, num_classes=num_classes, val_ratio=val_ratio, shuffle=shuffle,
            seed=seed, on_error=on_error)
        opts, options = encode_options(
            src, num_classes, encoding=encoding, quality=quality, resize=resize,
            ignore_label=ignore_label, max_pixels=max_pixels, mask_encoding=mask_encoding,
            max_file_bytes=max_file_bytes, shuffle=shuffle, seed=seed, val_ratio=val_ratio,
            on_error=on_error)
        splits, meta, digest = _drive_args(src, plan, opts, options, classes, num_classes,
                                           report)
    except BaseException:
        if pool is not None:
            _stop_pool(pool)
        raise
    return drive(output, outputs, splits, partial(_work, opts=opts), digest=digest,
                 root=src.root, options=options, report=report, finish_meta=meta,
                 source=source, run=o, t0=t0, pool=pool)


def _open_and_plan(source: str, layout: Optional[str], output: str, outputs, *,
                   split: Optional[str], images_dir: str, masks_dir: str,
                   lst_root: Optional[str], follow_symlinks: bool,
                   classes: Optional[Sequence[str]], num_classes: Optional[int],
                   val_ratio: float, shuffle: bool, seed: int, on_error: str):
    """The planning of :func:`convert`: ``(src, classes, num_classes, plan, report)``, the
    source opened, its classes resolved and its items split, and the report naming the
    outputs (checked disjoint from the source files) with the source's problems taken."""
    try:
        src = open_source(source, layout, split=split, images_dir=images_dir,
                          masks_dir=masks_dir, lst_root=lst_root,
                          follow_symlinks=follow_symlinks)
    except SourceError as e:
        raise ConversionError("cannot read source: %s" % e.reason, e.path or source) from None
    classes, num_classes = resolve_classes(src, classes, num_classes)
    plan = plan_splits(src, val_ratio, shuffle, seed)
    report = ConversionReport(outputs=outputs.paths(os.fspath(output), list(plan)))
    check_disjoint(dataset_files(*report.outputs.values(), container=outputs.name),
                   dataset_files(source))
    take_problems(src, on_error, report)
    if not any(plan.values()):
        raise ConversionError("source holds no items to convert (layout %r)" % src.layout,
                              source)
    return src, classes, num_classes, plan, report


def _drive_args(src: Source, plan: Dict[str, List[Item]], opts: EncodeOptions, options: dict,
                classes, num_classes, report: ConversionReport):
    """What :func:`~.loop.drive` takes of a planned conversion: ``(splits, finish_meta,
    digest)``, one job list per split, each split's metadata made from the source and the
    plan, and the plan's digest (every file stamped)."""
    seg = src.task == "segmentation"
    splits = {s: SplitJobs(len(items), partial(_from, list(enumerate(items))),
                           partial(_item_key, items),
                           partial(_item_name, items) if seg else (lambda pos: None))
              for s, items in plan.items()}

    whole = _plan_digest(src, plan, opts, options)

    def finish_meta(s, w, st, digest):
        meta = _metadata(src, s, w.count, st, opts, classes, num_classes, report.skipped,
                         options)
        meta.update(_split_fields(src, s, digest, w, st, plan[s]))
        meta["done"] = done_record(output_unit(report.outputs[s], s), whole, w)
        return meta

    return splits, finish_meta, whole


def _from(jobs: list, start: int) -> list:
    return jobs[start:]


def _item_key(items: List[Item], pos: int) -> Optional[int]:
    return items[pos].key


def _item_name(items: List[Item], pos: int) -> str:
    return os.path.basename(items[pos].image)

