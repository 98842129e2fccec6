"""The shards of a sharded dataset that a new conversion to the same prefix supersedes.

Written again with another shard count (``--shards 2`` where it was 4) or container (LMDB
where it was ``.rec``), a dataset's shards get other names (``train-00000-of-00002.rec``), so
the old manifest's shards would stay beside the new ones, where a glob over the folder mixes
the two datasets. :func:`superseded_shards` lists them before the run (while the old
manifest can still be read) and :func:`remove_superseded` removes them once every new
manifest is written; a run that fails or is interrupted removes nothing.

Only shards the old manifest names, in its own folder, named as shards of its own prefix
(``PREFIX-NNNNN-of-NNNNN.rec``), that this run does not write and that are no file of the
run's source, and only gluon-data's own files
(:meth:`~gluon_data.convert.outputs.Outputs.check_discard`).
"""
from __future__ import annotations

import os
import re
from typing import List, Tuple

from ..errors import GluonDataError, OutputError
from ..format.ownership import check_disjoint
from ..stores.shards import dataset_files, manifest_path, read_manifest
from .outputs import ConversionReport, outputs_for

__all__ = ["superseded_shards", "remove_superseded"]


def _shard_pattern(prefix: str) -> "re.Pattern[str]":
    """The names :func:`~gluon_data.stores.shards.shard_name` gives shards of ``prefix``."""
    return re.compile(re.escape(os.path.basename(prefix)) + r"-\d{5,}-of-\d{5,}\.(rec|lmdb)\Z")


def superseded_shards(plans: List[dict], source: str) -> List[Tuple[str, str]]:
    """``(path, container)`` of each shard that a manifest this run replaces names and that
    no longer belongs to the dataset once the run is done (see the module docstring), checked
    ours now: call it after the targets are checked and before the old manifests are removed.

    Raises
    ------
    OutputError
        Naming an old shard's file that is not gluon-data's, before anything is written or
        removed (``--overwrite`` replaces only gluon-data's own).
    """
    writes = [j.path for p in plans for j in p["jobs"]]
    written = {os.path.abspath(w) for w in writes}
    reads = dataset_files(source)
    found: List[Tuple[str, str]] = []
    for p in plans:
        path = manifest_path(p["prefix"])
        if not os.path.isfile(path):
            continue
        try:
            doc = read_manifest(path)
        except (GluonDataError, OSError):  # (replaceable, checked before: it names nothing)
            continue
        folder, ours = os.path.dirname(os.path.abspath(path)), _shard_pattern(p["prefix"])
        for s in doc["shards"]:
            shard = os.path.join(folder, s["name"])
            if (not ours.match(s["name"]) or shard in written or not os.path.lexists(shard)
                    or (shard, doc["container"]) in found):
                continue
            try:  # a file of the source (a re-shard of one old shard) is kept
                check_disjoint(dataset_files(shard, container=doc["container"]), reads)
            except OutputError:
                continue
            outputs_for(shard, doc["container"]).check_discard(shard)
            found.append((shard, doc["container"]))
    return found


def remove_superseded(shards: List[Tuple[str, str]], report: ConversionReport) -> None:
    """Remove ``shards`` (from :func:`superseded_shards`) once the new manifests are written:
    each is in ``report.removed``; one whose files changed since and are no longer ours is
    left, in ``report.left`` with the reason."""
    for path, container in shards:
        try:
            outputs_for(path, container).discard(path)
        except OutputError as e:
            report.left.append({"file": path, "reason": str(e)})
        else:
            report.removed.append(path)
