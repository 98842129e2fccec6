"""The shards of a sharded dataset that a new conversion to the same prefix supersedes.

Written again with another shard count (``--shards 2`` where it was 4) or container (LMDB
where it was ``.rec``), a dataset's shards get other names (``train-00000-of-00002.rec``), so
the old manifest's shards would stay beside the new ones, where a glob over the folder mixes
the two datasets. :func:`superseded_shards` lists them before the run and
:func:`remove_superseded` removes them once every new manifest is written; a run that fails
or is interrupted removes nothing, and keeps the old manifest (:func:`still_whole`), so its
rerun finds them again.

Only shards the old manifest names, in its own folder, named as shards of its own prefix
(``PREFIX-NNNNN-of-NNNNN.rec``), that this run does not write and that are no file of the
run's source (a source given as a URI: none is removed), only gluon-data's own files
(:meth:`~gluon_data.convert.outputs.Outputs.check_discard`), and only while each is still
what the old manifest recorded (records, bytes, SHA-256 of its ``.idx`` and metadata).
"""
from __future__ import annotations

import os
import re
from typing import List, Tuple

from ..errors import GluonDataError, OutputError
from ..format.ownership import check_disjoint
from ..stores.base import is_uri
from ..stores.shards import dataset_files, manifest_path, read_manifest, shard_summary
from .outputs import ConversionReport, outputs_for

__all__ = ["superseded_shards", "remove_superseded", "still_whole"]


def _shard_pattern(prefix: str) -> "re.Pattern[str]":
    """The names :func:`~gluon_data.stores.shards.shard_name` gives shards of ``prefix``."""
    return re.compile(re.escape(os.path.basename(prefix)) + r"-\d{5,}-of-\d{5,}\.(rec|lmdb)\Z")


#: An old shard: ``(path, container, split, its entry in the old manifest)``.
Superseded = Tuple[str, str, str, dict]
_RECORDED = ("records", "bytes", "idx_sha256", "meta_sha256")


def superseded_shards(plans: List[dict], source: str) -> List[Superseded]:
    """An entry for each shard that a manifest this run replaces names and that
    no longer belongs to the dataset once the run is done (see the module docstring), checked
    ours now: call it after the targets are checked and before the old manifests are removed.

    Raises
    ------
    OutputError
        Naming an old shard's file that is not gluon-data's, before anything is written or
        removed (``--overwrite`` replaces only gluon-data's own).
    """
    if is_uri(source):  # (which local files it reads cannot be told: none is removed)
        return []
    written = {os.path.abspath(j.path) for p in plans for j in p["jobs"]}
    reads = dataset_files(source)
    found: List[Superseded] = []
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
                    or any(f[0] == shard for f in found)):
                continue
            try:  # a file of the source (a re-shard of one old shard) is kept
                check_disjoint(dataset_files(shard, container=doc["container"]), reads)
            except OutputError:
                continue
            outputs_for(shard, doc["container"]).check_discard(shard)
            found.append((shard, doc["container"], doc["split"], s))
    return found


def still_whole(plans: List[dict]) -> List[str]:
    """The manifests this run replaces that name none of the shards it writes (a re-shard
    into other names): they stay valid while it runs, so they are kept until the new ones
    replace them. A run that fails then leaves the old dataset whole and readable, and the
    rerun still finds its shards to remove. (Any other is removed before any shard is
    written: it names shards the run rewrites.)"""
    written = {os.path.abspath(j.path) for p in plans for j in p["jobs"]}
    kept = []
    for p in plans:
        path = manifest_path(p["prefix"])
        try:
            doc = read_manifest(path)
        except (GluonDataError, OSError):  # missing or unreadable: nothing to keep
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not any(os.path.join(folder, s["name"]) in written for s in doc["shards"]):
            kept.append(path)
    return kept


def remove_superseded(shards: List[Superseded], report: ConversionReport) -> None:
    """Remove ``shards`` (from :func:`superseded_shards`) once the new manifests are written:
    each is in ``report.removed``. One that is no longer what the old manifest recorded, or
    no longer ours, or that cannot be removed, is left, in ``report.left`` with the reason
    (the conversion has succeeded: nothing here raises)."""
    for path, container, split, entry in shards:
        try:
            have = shard_summary(path, container, split)
            changed = [k for k in _RECORDED if have[k] != entry.get(k)]
            if changed:
                report.left.append({"file": path, "reason": "its %s changed since the manifest "
                                    "it replaced recorded them" % ", ".join(changed)})
                continue
            outputs_for(path, container).discard(path)
        except (GluonDataError, OSError) as e:
            report.left.append({"file": path, "reason": str(e)})
        else:
            report.removed.append(path)
