"""The conversion driver: :func:`convert` plans a source into splits and hands them to
:func:`~.loop.drive`, the loop any planned conversion (a source layout, or a legacy LMDB
import) runs through; a dataset or a legacy LMDB given as the source is handed over to
:mod:`.copy`. The planning steps (classes, problems, encode options) are shared with the
sharded conversion (:mod:`.sharded`).
"""
from __future__ import annotations

import os
import random
import time
from functools import partial
from typing import Dict, List, Optional, Sequence

from ..format import codec
from .engines import _start_pool, _stop_pool
from ..errors import ConversionError, SourceError
from ..format.ownership import check_disjoint
from ..stores.lmdbio import is_lmdb, names_lmdb
from ..stores.shards import dataset_files
from .sources import DEFAULT_MAX_FILE_BYTES, Item, Source, open_source
from ..stores.base import is_uri
from .copy import copy_dataset, import_lmdb
from .encode import EncodeOptions, _work
from .loop import SplitJobs, drive
from .outputs import (ConversionReport, _check_choices, _check_options, _check_output,
                      _metadata, _split_fields, outputs_for)
from .resume import _plan_digest

__all__ = ["convert", "drive", "SplitJobs"]


def _plan(src: Source, val_ratio: float, shuffle: bool, seed: int) -> Dict[str, List[Item]]:
    splits = {k: list(v) for k, v in src.splits.items()}
    if shuffle:
        rng = random.Random(seed)
        for k in splits:
            rng.shuffle(splits[k])
    if val_ratio:
        if not 0 < val_ratio < 1:
            raise ValueError("val_ratio must lie in (0, 1), got %r" % val_ratio)
        if len(splits) != 1:
            raise ValueError("val_ratio splits a single list; this source already has splits %s"
                             % sorted(splits))
        (items,) = splits.values()
        nval = min(len(items) - 1, max(1, int(round(len(items) * val_ratio))))
        if nval < 1:
            raise ValueError("val_ratio needs at least 2 items, source has %d" % len(items))
        splits = {"train": items[:-nval], "val": items[-nval:]}
    return splits


def resolve_classes(src: Source, classes: Optional[Sequence[str]],
                    num_classes: Optional[int]):
    """``(classes, num_classes)``: the names given, else the source's; a count that
    disagrees with the names is a ValueError."""
    if classes is None and src.classes is not None:
        classes = src.classes
    if classes is not None:
        classes = list(classes)
        if num_classes is not None and num_classes != len(classes):
            raise ValueError("num_classes=%d disagrees with %d class names"
                             % (num_classes, len(classes)))
        num_classes = len(classes)
    return classes, num_classes


def take_problems(src: Source, on_error: str, report: ConversionReport) -> None:
    """The source's unreadable entries: a ConversionError (``on_error="fail"``), else listed
    in the report as skipped."""
    for f, reason in src.problems:
        if on_error == "fail":
            raise ConversionError(reason, f)
        report.skipped.append({"file": f, "reason": reason})


def encode_options(src: Source, num_classes: Optional[int], *, encoding: str, quality: int,
                   resize: int, ignore_label: int, max_pixels: int, mask_encoding: str,
                   max_file_bytes: int, shuffle: bool, seed: int, val_ratio: float,
                   on_error: str):
    """``(EncodeOptions, options)``: how each item of ``src`` is encoded, and the options
    recorded in the metadata and the plan digest."""
    opts = EncodeOptions(task=src.task, encoding=encoding, quality=quality, resize=resize,
                         num_classes=num_classes if src.task == "segmentation" else None,
                         ignore_label=ignore_label, max_pixels=max_pixels,
                         mask_lut=src.mask_lut, mask_encoding=mask_encoding,
                         max_file_bytes=max_file_bytes)
    options = dict(encoding=encoding, quality=quality, resize=resize, shuffle=shuffle,
                   seed=seed, val_ratio=val_ratio, on_error=on_error)
    return opts, options


def convert(source: str, output: str, layout: Optional[str] = None, *,
            split: Optional[str] = None, val_ratio: float = 0.0, shuffle: bool = False,
            seed: int = 0, encoding: str = "passthrough", quality: int = 95, resize: int = 0,
            workers: int = 1, overwrite: bool = False, on_error: str = "fail",
            classes: Optional[Sequence[str]] = None, num_classes: Optional[int] = None,
            ignore_label: int = 255, images_dir: str = "images", masks_dir: str = "masks",
            lst_root: Optional[str] = None, max_pixels: int = codec.DEFAULT_MAX_PIXELS,
            format: Optional[str] = None, image_shape: Optional[Sequence[int]] = None,
            mask_shape: Optional[Sequence[int]] = None, channels_first: bool = False,
            bgr: bool = False, resume: bool = False, checkpoint_every: Optional[int] = None,
            progress: bool = False, mask_encoding: str = "zraw",
            follow_symlinks: bool = False,
            max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
            source_options: Optional[dict] = None) -> ConversionReport:
    """Convert a source folder or ``.lst`` into RecordIO (``.rec`` + ``.idx`` + metadata).

    Parameters
    ----------
    source : str
        Folder (``pairs``, ``voc``, ``imagefolder``), ``.lst`` file (``lst``), or a dataset
        to copy into the other container: a ``.rec`` or a ``.lmdb`` directory, or one at a
        URI (``s3://bucket/voc.rec``, ``s3://bucket/voc.lmdb``; see
        :func:`~gluon_data.convert.copy_dataset`).
    output : str
        The ``.rec`` to write (several splits: ``NAME_<split>.rec`` beside it), or a
        ``.lmdb`` directory holding every split.
    layout : str, optional
        One of ``pairs``, ``voc``, ``imagefolder``, ``lst``; detected when omitted.
    split : str, optional
        VOC split(s) to convert, comma separated (default ``train``).
    val_ratio : float
        Move this fraction of the (shuffled) items into a ``val`` split.
    shuffle, seed
        Shuffle the item order with ``random.Random(seed)``; output is deterministic.
    encoding : {'passthrough', 'jpg', 'png', 'raw'}
        ``passthrough`` stores JPEG/PNG bytes unchanged (other formats become PNG);
        ``raw`` stores decoded uint8 arrays with their shape (no decode cost, more disk).
    quality : int
        JPEG quality when re-encoding.
    resize : int
        Resize the shorter side to this many pixels (masks by nearest neighbour); 0 = keep.
    mask_encoding : {'zraw', 'png'}
        How masks are stored: ``zraw`` (default), the class ids as one zlib stream (as small
        as PNG, ~3x faster to decode and ~7x faster to encode), or a single-channel PNG.
    workers : int
        Processes that read, validate and encode; one ordered writer.
    overwrite : bool
        Replace existing outputs; otherwise an existing output is an error.
    on_error : {'fail', 'skip'}
        ``fail``: the first bad item aborts the conversion, nothing is written.
        ``skip``: bad items are skipped and listed in the report and the metadata.
    classes, num_classes
        Declared classes (names, or only their number). Mask ids outside them, other than
        ``ignore_label``, are errors. VOC declares its 21 classes.
    ignore_label : int
        Mask value meaning "not labelled" (VOC: 255).
    format : {'rec', 'lmdb'}, optional
        Output container; by default ``lmdb`` when ``output`` ends in ``.lmdb``.
    image_shape, mask_shape, channels_first, bgr
        Layout ``raw-lmdb`` only (see :mod:`gluon_data.stores.legacy`): the stored array shapes,
        whether images are stored CxHxW, and whether their channels are BGR.
    resume : bool
        Continue an interrupted conversion from its last checkpoint, taken every
        ``checkpoint_every`` items, or when None every 5 s or 256 MiB written, whichever
        comes first, and at most every 64 items (RecordIO: ``OUTPUT.resume.json`` after an fsync; LMDB:
        inside the partial environment, in the same transaction as the records). The result
        equals an uninterrupted run (RecordIO: byte for byte); a checkpoint made with other
        inputs or options is refused. A conversion that failed or was interrupted (Ctrl-C,
        SIGTERM, a full disk) after its first checkpoint keeps its partial files and the
        checkpoint for this; one that failed before leaves nothing behind.
    follow_symlinks : bool
        Read files through symlinks that resolve outside the source root (refused by
        default, as are listed paths with ``..`` or absolute paths, in every layout).
    max_file_bytes : int
        Refuse source files larger than this (only regular files are ever read).
    max_pixels : int
        Refuse images whose decoded size, or whose size after ``resize``, exceeds this.
    source_options : dict, optional
        A dataset source at a URI: the remote store's options (``storage_options``,
        ``cache_dir``...).

    Returns
    -------
    ConversionReport

    Raises
    ------
    ConversionError
        On a bad item (``on_error='fail'``), an empty source or a write failure.

    Examples
    --------
    >>> report = convert("VOCdevkit", "voc_train.rec", layout="voc", split="train")  # doctest: +SKIP
    >>> print(report)                                                                 # doctest: +SKIP
    wrote 1464 records to voc_train.rec
    """
    _check_choices(encoding, on_error)
    if mask_encoding not in ("zraw", "png"):
        raise ValueError("unknown mask_encoding %r; valid: zraw, png" % (mask_encoding,))
    _check_options(quality=quality, resize=resize, workers=workers, max_pixels=max_pixels,
                   max_file_bytes=max_file_bytes, checkpoint_every=checkpoint_every,
                   ignore_label=ignore_label, num_classes=num_classes)
    outputs = outputs_for(output, format)
    _check_output(output, outputs.name)
    source = os.fspath(source)
    # The Python API keeps taking a dataset or a legacy LMDB as the source (the CLI calls
    # copy_dataset / import_lmdb itself): these hand the job over, unchanged.
    if layout in ("raw-lmdb", "caffe-lmdb"):
        return import_lmdb(source, output, layout, split=split, image_shape=image_shape,
                           mask_shape=mask_shape, channels_first=channels_first, bgr=bgr,
                           encoding=encoding, quality=quality, classes=classes,
                           num_classes=num_classes, ignore_label=ignore_label,
                           format=outputs.name, overwrite=overwrite, on_error=on_error,
                           max_pixels=max_pixels, progress=progress, workers=workers,
                           resume=resume, checkpoint_every=checkpoint_every)
    if is_dataset(source):
        return copy_dataset(source, output, split=split, format=outputs.name,
                            overwrite=overwrite, progress=progress,
                            source_options=source_options)
    t0 = time.perf_counter()
    # the workers start (import) while the source is listed and stamped; drive owns the pool
    pool = _start_pool(workers) if workers > 1 else None
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
                 source=source, workers=workers, overwrite=overwrite, on_error=on_error,
                 resume=resume, checkpoint_every=checkpoint_every, progress=progress, t0=t0,
                 pool=pool)


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
    plan = _plan(src, val_ratio, shuffle, seed)
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

    def finish_meta(s, w, st, digest):
        meta = _metadata(src, s, w.count, st, opts, classes, num_classes, report.skipped,
                         options)
        meta.update(_split_fields(src, s, digest, w, st, plan[s]))
        return meta

    return splits, finish_meta, _plan_digest(src, plan, opts, options)


def _from(jobs: list, start: int) -> list:
    return jobs[start:]


def _item_key(items: List[Item], pos: int) -> Optional[int]:
    return items[pos].key


def _item_name(items: List[Item], pos: int) -> str:
    return os.path.basename(items[pos].image)


def is_dataset(source: str) -> bool:
    """Whether ``source`` is a converted dataset (a ``.rec`` or an LMDB of ours, local or at
    a URI) to copy rather than a source layout to convert."""
    source = os.fspath(source)
    return source.endswith(".rec") or is_lmdb(source) or (is_uri(source)
                                                          and names_lmdb(source))
