"""The planning steps every conversion shares, local and sharded alike: a source's items split
(and shuffled), its classes resolved, its problems taken, how each item is encoded, and
whether a source is a converted dataset to copy rather than a layout to convert."""
from __future__ import annotations

import os
import random
from typing import Dict, List, Optional, Sequence

from ..errors import ConversionError
from ..stores.base import is_uri
from ..stores.lmdbio import is_lmdb, names_lmdb
from .encode import EncodeOptions
from .outputs import ConversionReport
from .sources import Item, Source

__all__ = ["plan_splits", "resolve_classes", "take_problems", "encode_options", "is_dataset"]


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
    if mask_encoding != "zraw" and src.task == "segmentation":
        # in the digest, so a resume never mixes mask kinds; zraw (the only kind before
        # others existed) is left out, so the digests of those conversions are unchanged
        options["mask_encoding"] = mask_encoding
    return opts, options

def is_dataset(source: str) -> bool:
    """Whether ``source`` is a converted dataset (a ``.rec`` or an LMDB of ours, local or at
    a URI) to copy rather than a source layout to convert."""
    source = os.fspath(source)
    return source.endswith(".rec") or is_lmdb(source) or (is_uri(source)
                                                          and names_lmdb(source))

