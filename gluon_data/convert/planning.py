"""The planning steps every conversion shares, local and sharded alike: a source's items split
(and shuffled), its classes resolved, its problems taken, how each item is encoded, and
whether a source is a converted dataset to copy rather than a layout to convert."""
from __future__ import annotations

import os
import random
from typing import Dict, List, Optional, Sequence

from dataclasses import dataclass

from ..errors import ConversionError, SourceError
from ..format import codec
from ..format.ownership import LOCATIONS, classify_location
from ..stores.base import is_uri
from ..stores.lmdbio import is_lmdb, names_lmdb
from .encode import EncodeOptions
from .options import ConvertOptions, check_layout_options
from .outputs import check_choices, check_options
from .report import ConversionReport
from .sources import DEFAULT_MAX_FILE_BYTES, Item, Source, open_source

__all__ = ["plan_splits", "resolve_classes", "take_problems", "encode_options", "is_dataset",
           "Planned", "plan_source", "check_values"]


def plan_splits(src: Source, val_ratio: float, shuffle: bool, seed: int) -> Dict[str, List[Item]]:
    """The items of each split: the source's splits, shuffled (seeded) if asked, and one
    list cut into ``train`` and ``val`` by ``val_ratio``."""
    splits = {k: list(v) for k, v in src.splits.items()}
    if shuffle:
        rng = random.Random(seed)
        for k in splits:
            rng.shuffle(splits[k])
    if val_ratio:
        if not 0 < val_ratio < 1:
            raise ValueError("val_ratio (--val-ratio) must lie in (0, 1), the share of the "
                             "items held out for val (0, the default, holds out none); got %r"
                             % val_ratio)
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
    """``(classes, num_classes)``: the names given (matched to an image folder's class
    folders by name: :meth:`Source.name_classes`), else the source's; a count that
    disagrees with the names is a ValueError."""
    if classes is not None:
        classes = src.name_classes(classes)
    elif src.classes is not None:
        classes = list(src.classes)
    if classes is not None:
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

def encode_options(src: Source, num_classes: Optional[int], o: ConvertOptions,
                   classes: Optional[List[str]] = None):
    """``(EncodeOptions, options)``: how each item of ``src`` is encoded under the
    conversion's options ``o``, and the options recorded in the metadata and the plan
    digest. ``classes``: the class names resolved, recorded when the user gave them (they
    name the ids, and for an image folder they choose each folder's label)."""
    max_pixels = codec.DEFAULT_MAX_PIXELS if o.max_pixels is None else o.max_pixels
    max_file_bytes = DEFAULT_MAX_FILE_BYTES if o.max_file_bytes is None else o.max_file_bytes
    opts = EncodeOptions(task=src.task, encoding=o.encoding, quality=o.quality,
                         resize=o.resize,
                         num_classes=num_classes if src.task == "segmentation" else None,
                         ignore_label=o.ignore_label, max_pixels=max_pixels,
                         mask_lut=src.mask_lut, mask_encoding=o.mask_encoding,
                         max_file_bytes=max_file_bytes)
    options = dict(encoding=o.encoding, quality=o.quality, resize=o.resize,
                   shuffle=o.shuffle, seed=o.seed, val_ratio=o.val_ratio,
                   on_error=o.on_error)
    if o.mask_encoding != "zraw" and src.task == "segmentation":
        # in the digest, so a resume never mixes mask kinds; zraw (the only kind before
        # others existed) is left out, so the digests of those conversions are unchanged
        options["mask_encoding"] = o.mask_encoding
    if o.classes is not None:
        # in the digest, so a rerun never keeps outputs whose ids name other classes; the
        # layout's own classes are left out, so the digests of those conversions are unchanged
        options["classes"] = list(classes) if classes is not None else o.classes
    return opts, options


@dataclass(frozen=True)
class Planned:
    """A source layout opened and planned under one :class:`ConvertOptions`: the source,
    its classes, its items per split, and how each is encoded (``opts``) with the options
    the metadata and the plan digest record (``options``)."""

    src: Source
    classes: Optional[List[str]]
    num_classes: Optional[int]
    plan: Dict[str, List[Item]]
    opts: EncodeOptions
    options: dict


def check_values(o: ConvertOptions) -> None:
    """The option values every conversion of a source layout checks before any work."""
    check_choices(o.encoding, o.on_error)
    if o.seed != 0 and not o.shuffle:  # (the one thing it seeds)
        raise ValueError("--seed %d without --shuffle: the seed only orders a shuffle, and the "
                         "items would keep the source's order; add --shuffle (shuffle=True)"
                         % o.seed)
    if o.mask_encoding not in codec.MASK_ENCODINGS:
        raise ValueError("unknown mask_encoding %r; valid: %s"
                         % (o.mask_encoding, ", ".join(codec.MASK_ENCODINGS)))
    check_options(quality=o.quality, resize=o.resize, workers=o.workers,
                  max_pixels=codec.DEFAULT_MAX_PIXELS if o.max_pixels is None
                  else o.max_pixels,
                  max_file_bytes=DEFAULT_MAX_FILE_BYTES if o.max_file_bytes is None
                  else o.max_file_bytes,
                  checkpoint_every=o.checkpoint_every, ignore_label=o.ignore_label,
                  num_classes=o.num_classes, scheduler_wait=o.scheduler_wait)


def _refuse_output_folder(folder: str, what: str) -> None:
    """Raise :class:`SourceError` when ``folder``, read as ``what`` of a source, is or holds
    a dataset (an LMDB, a ``.rec``, a manifest, metadata, an ``.idx``): a conversion's output
    written inside its source, which a later conversion of that source would read as data.
    Hidden and empty files (a ``.gitkeep``) are no output."""
    why = "is %s" % LOCATIONS["lmdb"] if classify_location(folder) == "lmdb" else None
    for name in sorted(os.listdir(folder)) if why is None else ():
        path = os.path.join(folder, name)
        if name.startswith(".") or (os.path.isfile(path) and not os.path.getsize(path)):
            continue
        kind = classify_location(path)
        if kind in ("rec", "lmdb", "manifest", "meta", "gdx") or name.endswith(".idx"):
            why = "holds %s (%s)" % (LOCATIONS[kind], name)
            break
    if why is not None:
        raise SourceError("%s %s, no image: a conversion's output written inside its source "
                          "folder; write outputs outside the source, or move it" % (what, why),
                          folder)


def plan_source(source: str, layout: Optional[str], o: ConvertOptions) -> Planned:
    """Open the source layout at ``source`` (a :class:`ConversionError` when it cannot be
    read), refuse an option its layout does not read
    (:func:`~gluon_data.convert.options.check_layout_options`), resolve its classes, split
    its items and say how each is encoded: the one planning of local and sharded
    conversions alike."""
    try:
        src = open_source(source, layout, split=o.split, images_dir=o.images_dir,
                          masks_dir=o.masks_dir, lst_root=o.lst_root,
                          follow_symlinks=o.follow_symlinks)
        if src.layout == "imagefolder":  # (an empty class keeps its label, as in MXNet's
            labelled = {i.label for s in src.splits.values() for i in s}  # ImageFolder)
            for k, cls in enumerate(src.classes or []):
                if float(k) not in labelled:
                    _refuse_output_folder(os.path.join(src.root, cls), "class folder %r" % cls)
    except SourceError as e:
        raise ConversionError("cannot read source: %s" % e.reason, e.path or source) \
            from None
    check_layout_options(o, src.layout, src.task)
    classes, num_classes = resolve_classes(src, o.classes, o.num_classes)
    if src.task == "segmentation" and num_classes is not None \
            and 0 <= o.ignore_label < num_classes:  # its pixels would read as unlabelled
        raise ValueError("--ignore-label %d%s is a class id of the %d classes (0..%d): pass an "
                         "ignore label outside them, e.g. --ignore-label 65535 for 16-bit masks"
                         % (o.ignore_label, " (the default)" if o.ignore_label == 255 else "",
                            num_classes, num_classes - 1))
    plan = plan_splits(src, o.val_ratio, o.shuffle, o.seed)
    opts, options = encode_options(src, num_classes, o, classes)
    return Planned(src, classes, num_classes, plan, opts, options)


def is_dataset(source: str) -> bool:
    """Whether ``source`` is a converted dataset (a ``.rec`` or an LMDB of ours, local or at
    a URI) to copy rather than a source layout to convert."""
    source = os.fspath(source)
    return source.endswith(".rec") or is_lmdb(source) or (is_uri(source)
                                                          and names_lmdb(source))

