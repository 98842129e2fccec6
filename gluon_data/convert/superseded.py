"""The shards of a sharded dataset that a new conversion to the same prefix supersedes.

Written again with another shard count (``--shards 2`` where it was 4) or container (LMDB
where it was ``.rec``), a dataset's shards get other names (``train-00000-of-00002.rec``), so
the old manifest's shards would stay beside the new ones, where a glob over the folder mixes
the two datasets. :func:`replace_datasets` lists them before the run and
:func:`remove_superseded` removes them once every new manifest is written; a run that fails
or is interrupted removes nothing, and keeps the old manifest (``Replaced.kept_manifests``),
so its rerun finds them again.

Only shards the old manifest names, in its own folder, named as shards of its own prefix
(``PREFIX-NNNNN-of-NNNNN.rec``), that this run does not write and that are no file of the
run's source (a source given as a URI: none is removed), only gluon-data's own files
(:meth:`~gluon_data.convert.outputs.Outputs.check_discard`), and only while each is still
what the old manifest recorded (records, bytes, SHA-256 of its ``.idx`` and metadata).
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, NamedTuple, Tuple

from ..errors import GluonDataError, OutputError
from ..format.ownership import check_disjoint
from ..stores.base import is_uri
from ..stores.shards import dataset_files, read_manifest, shard_summary
from .outputs import outputs_for
from .report import ConversionReport
from .shard_plan import SplitPlan

__all__ = ["Replaced", "replace_datasets", "remove_superseded"]


def _shard_pattern(prefix: str) -> "re.Pattern[str]":
    """The names :func:`~gluon_data.stores.shards.shard_name` gives shards of ``prefix``."""
    return re.compile(re.escape(os.path.basename(prefix)) + r"-\d{5,}-of-\d{5,}\.(rec|lmdb)\Z")


#: An old shard: ``(path, container, split, its entry in the old manifest)``.
Superseded = Tuple[str, str, str, dict]
_RECORDED = ("records", "bytes", "idx_sha256", "meta_sha256")


class Replaced(NamedTuple):
    """What a run does with the datasets it replaces (:func:`replace_datasets`)."""

    #: manifests naming none of the shards the run writes (a re-shard into other names):
    #: valid while it runs, kept until the new ones replace them, so a run that fails leaves
    #: the old dataset whole and its rerun finds the old shards again; any other manifest is
    #: removed before any shard is written (it names shards the run rewrites)
    kept_manifests: List[str]
    #: the old shards to remove once every new manifest is written
    shards: List[Superseded]


def replace_datasets(plans: List[SplitPlan], source: str, reads: List[str],
                     remove_shards: bool = True) -> Replaced:
    """Begin replacing the datasets this run writes over, before any shard is written (after
    the targets are checked): read each manifest it replaces once, list which stay until
    replaced and (``remove_shards``) each shard that no longer belongs to the dataset once
    the run is done (see the module docstring), checked ours now; then remove every other
    old manifest, so that none names shards the run rewrites in place (a reader would mix
    the old metadata with the new records), and a run interrupted or failed leaves none.
    ``reads``: the source's files, as the plan listed them
    (:attr:`~.shard_plan.ShardPlan.reads`).

    Raises
    ------
    OutputError
        Naming an old shard's file that is not gluon-data's, before anything is written or
        removed (``--overwrite`` replaces only gluon-data's own).
    """
    written = {os.path.abspath(j.path) for p in plans for j in p.jobs}
    # (a source given as a URI: which local files it reads cannot be told, none is removed)
    remove_shards = remove_shards and not is_uri(source)
    kept: List[str] = []
    found: Dict[str, Superseded] = {}
    for p in plans:
        try:
            doc = read_manifest(p.manifest)
        except (GluonDataError, OSError):  # missing or unreadable: it names nothing
            continue
        folder, ours = os.path.dirname(os.path.abspath(p.manifest)), _shard_pattern(p.prefix)
        shards = [(os.path.join(folder, s["name"]), s) for s in doc["shards"]]
        if not any(shard in written for shard, _ in shards):
            kept.append(p.manifest)
        for shard, s in shards if remove_shards else ():
            if (not ours.match(s["name"]) or shard in written or shard in found
                    or not os.path.lexists(shard)):
                continue
            try:  # a file of the source (a re-shard of one old shard) is kept
                check_disjoint(dataset_files(shard, container=doc["container"]), reads)
            except OutputError:
                continue
            outputs_for(shard, doc["container"]).check_discard(shard)
            found[shard] = (shard, doc["container"], doc["split"], s)
    for p in plans:  # (checked: ours to replace) rewritten in place, named by none until
        if p.manifest not in kept:  # the new manifest is written
            try:
                os.remove(p.manifest)
            except FileNotFoundError:
                pass
    return Replaced(kept, list(found.values()))


def remove_superseded(shards: List[Superseded], report: ConversionReport) -> None:
    """Remove ``shards`` (``Replaced.shards``) once the new manifests are written:
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
