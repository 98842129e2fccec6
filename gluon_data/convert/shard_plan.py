"""The plan of a sharded conversion, made and checked before any shard is written.

:func:`plan_shards` turns a source and :class:`~gluon_data.convert.options.ConvertOptions` into
a :class:`ShardPlan`: each split's :class:`SplitPlan` (its shard jobs, manifest path and
digests), with every output checked first: none shares a file with the source, and none
replaces what is not this plan's (the one rule of
:func:`~gluon_data.format.ownership.check_replaceable`).

A source layout is planned by the same steps as a local conversion's
(:func:`~.planning.plan_source`): each shard job carries its items. A dataset (a ``.rec``,
``.lmdb`` or ``.shards.json``, local or at a URI) is copied: each job carries a record range.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..errors import ConversionError
from ..format.meta import read_meta
from ..format.ownership import check_disjoint, check_replaceable
from ..format.plan import part_digest, plan_digest, source_head
from ..format.recindex import BINARY_INDEX_SUFFIX
from ..storage.credentials import forward_options
from ..stores.base import is_uri, open_store
from ..stores.lmdbio import is_lmdb
from ..stores.shards import (dataset_files, is_manifest, manifest_path, parse_size,
                             plan_ranges, prefix_of, read_manifest, read_shard_meta,
                             shard_files, shard_name)
from .copy import open_copy_sources
from .options import ConvertOptions
from .outputs import output_format
from .report import ConversionReport
from .planning import check_values, plan_source, take_problems
from .shard_task import ShardJob, source_location

__all__ = ["ShardPlan", "SplitPlan", "plan_shards"]

#: ``cut(sizes)``: the ``[start, end)`` ranges of a split's shards, from its items' sizes.
Cut = Callable[[List[int]], List[Tuple[int, int]]]


@dataclasses.dataclass(frozen=True)
class SplitPlan:
    """One split of a sharded conversion: its shards' jobs and what its manifest records."""

    split: str
    #: the shards' names start with it; the manifest is ``manifest``
    prefix: str
    manifest: str
    jobs: List[ShardJob]
    #: the plan's digest (item names and each file's stamp) and its names-only digest
    digest: str
    names: str
    #: the manifest's ``plan`` entry (its ``digest`` added when written)
    doc: dict
    #: a copy: the source's metadata; an encode: what merging the shards' metadata takes,
    #: ``(source stub, EncodeOptions, classes, num_classes, recorded options)``
    meta: Optional[dict] = None
    merge: Optional[tuple] = None


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """A sharded conversion, planned and checked: :func:`plan_shards`."""

    #: how the plan names its source (a path made absolute, a URI as given)
    source: str
    container: str
    #: records copied from a dataset (else a source layout encoded)
    copying: bool
    splits: List[SplitPlan]
    #: what every Dask task checks on its worker before it starts: ``(what, path)``
    shared: List[Tuple[str, str]]
    #: the source's own files (:func:`~gluon_data.stores.shards.dataset_files`), listed once:
    #: no output may be one of them, nor may an old shard removed as superseded
    reads: List[str]

    @property
    def jobs(self) -> List[ShardJob]:
        return [j for p in self.splits for j in p.jobs]


def plan_shards(source: str, output: str, layout: Optional[str], o: ConvertOptions,
                report: ConversionReport, sink: Any = None) -> ShardPlan:
    """Plan the sharded conversion of ``source`` into ``output`` under ``o`` (checked), its
    outputs checked before any work; a source layout's problems go into ``report``
    (``sink``: where the shards go instead of ``output``'s folder, as for
    :func:`~gluon_data.convert.sharded.sharded_conversion`)."""
    cut = _cut(o)
    # paths resolve here, on the client: a Dask worker runs in its own working directory
    source, output = (source_location(os.fspath(x)) for x in (source, output))
    if o.lst_root is not None:
        o = o.replace(lst_root=os.path.abspath(o.lst_root))
    source_options = o.source_options
    if o.forward_credentials and is_uri(source):
        source_options = dict(source_options or {}, storage_options=forward_options(
            source, (source_options or {}).get("storage_options")))
    container = output_format(output, o.format)  # (the name checked)
    copying = (is_manifest(source) or source.endswith(".rec") or is_lmdb(source)
               or (is_uri(source) and source.rstrip("/").endswith(".lmdb")))
    if copying:
        splits, root = _plan_copy(source, o.split, source_options, prefix_of(output),
                                  container, cut), source
    else:
        splits, root = _plan_encoding(source, layout, prefix_of(output), container, cut,
                                      report, o)
    reads = dataset_files(source)
    _check_targets(splits, container, reads, o.overwrite)
    shared = [] if is_uri(source) else [("source", root)]
    if sink is None and o.engine == "dask":
        shared.append(("output folder", os.path.dirname(output)))
    return ShardPlan(source, container, copying, splits, shared, reads)


def _cut(o: ConvertOptions) -> Optional[Cut]:
    """How the shards are cut from ``o`` (checked): ``None`` where no cut is given."""
    shard_size = parse_size(o.shard_size) if isinstance(o.shard_size, str) else o.shard_size
    given = sum(x is not None for x in (o.shards, shard_size, o.shard_items))
    if given > 1:
        raise ValueError("give only one of --shards, --shard-size, --shard-items")
    check_values(o)
    return partial(plan_ranges, shards=o.shards, shard_size=shard_size,
                   shard_items=o.shard_items) if given else None


# --------------------------------------------------------------------------- a source layout
def _plan_encoding(source: str, layout: Optional[str], prefix: str, container: str,
                   cut: Optional[Cut], report: ConversionReport,
                   o: ConvertOptions) -> Tuple[List[SplitPlan], str]:
    """The split plans of a source encoded through the per-item code, and its root: the
    source opened and planned (:func:`~.planning.plan_source`, as a local conversion's),
    its problems taken into ``report``."""
    planned = plan_source(source, layout, o)
    take_problems(planned.src, o.on_error, report)
    src = planned.src
    how = (planned.opts, planned.classes, planned.num_classes, planned.options, o.on_error)
    stub = dataclasses.replace(src, splits={}, problems=[])
    return ([_encode_split(stub, s, items, source, prefix if len(planned.plan) == 1
                           else "%s_%s" % (prefix, s), container, cut, how)
             for s, items in planned.plan.items()], os.path.abspath(src.root))


def _split_ranges(cut: Cut, sizes: List[int], split: Optional[str]) -> List[Tuple[int, int]]:
    """``cut(sizes)``, a ValueError naming the split it cuts (``--shards 16: need 1..6`` of
    a 24-item source is its 6-item ``val``)."""
    try:
        return cut(sizes)
    except ValueError as e:
        if split is None:
            raise
        raise ValueError("split %r (%d items): %s" % (split, len(sizes), e)) from None


def _item_size(item) -> int:
    size = 0
    for p in (item.image, item.mask):
        if p:
            try:
                size += os.path.getsize(p)
            except OSError:
                pass
    return size


def _encode_split(stub, s: str, items: list, source: str, prefix: str, container: str,
                  cut: Optional[Cut], how: tuple) -> SplitPlan:
    """Split ``s`` of a source layout encoded into shards (``how``: ``(opts, classes,
    num_classes, options, on_error)``): its jobs (the items of each shard, with the digest
    of their state), manifest skeleton and what merging the shards' metadata takes.
    ``cut(sizes)`` gives the ranges (``None``: one shard)."""
    opts, classes, num_classes, options, on_error = how
    if not items:
        raise ConversionError("split %r would be empty" % s, source)
    ranges = (_split_ranges(cut, [_item_size(i) for i in items], s) if cut is not None
              else [(0, len(items))])
    head = source_head(stub, opts, dict(options, shards=ranges, container=container))
    names = plan_digest(head, {s: items}, stub.root, stamps=False)
    each = [str(part_digest(head, k, {s: items[a:b]}, stub.root))
            for k, (a, b) in enumerate(ranges)]  # each shard: its own items' stamps
    jobs = [ShardJob(path=shard_name(prefix, k, len(ranges), container), index=k,
                     count=len(ranges), container=container, split=s, digest=each[k],
                     items=tuple((p, items[p]) for p in range(a, b)), src=stub,
                     opts=opts, classes=classes, num_classes=num_classes,
                     options=options, on_error=on_error, plan=str(names))
            for k, (a, b) in enumerate(ranges)]
    return SplitPlan(s, prefix, manifest_path(prefix), jobs,
                     plan_digest(dict(head, shards=each)), names,
                     {"source": os.path.abspath(stub.root), "layout": stub.layout,
                      "kind": "encode", "options": options, "items": len(items),
                      "ranges": ranges, "names": names},
                     merge=(stub, opts, classes, num_classes, options))


# --------------------------------------------------------------------------- a dataset copied
def _plan_copy(source: str, split: Optional[str], source_options: Optional[dict],
               prefix: str, container: str, cut: Optional[Cut]) -> List[SplitPlan]:
    """The plan of each split of a dataset copied into shards: its jobs (a record range
    each), manifest skeleton and digests. ``cut(sizes)`` gives the ranges (``None``: the
    source's own shards)."""
    plans: List[SplitPlan] = []
    found = list(_copy_sources(source, split, source_options))
    stamped = _stamped_files(source)
    for s, loc_split, meta, ranges_default, sizes in found:
        ranges = _split_ranges(cut, sizes, s) if cut is not None else ranges_default
        if ranges is None:
            raise ValueError("re-sharding %s needs --shards, --shard-size or "
                             "--shard-items" % source)
        spfx = prefix if len(found) == 1 else "%s_%s" % (prefix, s)
        head = {"copy": source, "split": s, "ranges": ranges, "container": container,
                "meta": meta}
        names = plan_digest(head)
        digest = plan_digest(head, {s: stamped})
        jobs = [ShardJob(path=shard_name(spfx, k, len(ranges), container), index=k,
                         count=len(ranges), container=container, split=meta.get("split")
                         or "train", digest=str(part_digest({"plan": digest}, k)),
                         copy_from=(source, loc_split, a, b), source_meta=meta,
                         source_options=source_options, plan=str(names))
                for k, (a, b) in enumerate(ranges)]
        plans.append(SplitPlan(meta.get("split") or "train", spfx, manifest_path(spfx), jobs,
                               digest, names, {"source": source, "kind": "copy",
                                               "ranges": ranges, "names": names},
                               meta=meta))
    return plans


def _stamped_files(source: str) -> List[str]:
    """The local files of a dataset being copied, whose stamps (size, mtime, inode, ctime)
    its plan binds (none for a URI: its metadata, in the plan, identifies it)."""
    if is_uri(source):
        return []
    if is_manifest(source):
        return [source]
    return shard_files(source, "lmdb" if is_lmdb(source) else "rec")


def _copy_sources(source: str, split: Optional[str],
                  options: Optional[dict] = None) -> Iterator[tuple]:
    """``(split, store split, meta, default ranges, record sizes)`` per split to copy: a
    manifest's from the manifest, the others' as a copy reads them
    (:func:`~.copy.open_copy_sources`)."""
    if is_manifest(source):  # (at a URI: its remote store holds the manifest, checked)
        remote: Any = open_store(source, **(options or {})) if is_uri(source) else None
        yield _manifest_copy_source(read_manifest(source) if remote is None
                                    else remote.manifest)
        return
    for s, (f, meta) in open_copy_sources(source, split, options).items():
        if f.split is not None:  # an LMDB's split: each record's size read
            yield s, s, meta, None, [len(f.read(i)) for i in range(len(f))]
        else:  # a .rec (at a URI: downloaded whole, with its .idx, into the cache)
            rec = f.record_file() if is_uri(source) else f
            yield None, None, meta, None, rec.extent_sizes().tolist()


def _manifest_copy_source(doc: dict) -> tuple:
    """:func:`_copy_sources`' entry of a manifest: its shards are the default ranges, and
    each record's size is estimated as its shard's mean."""
    bounds = np.concatenate(([0], np.cumsum([s["records"] for s in doc["shards"]])))
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    sizes = [0] * doc["num_records"]
    per = [s["bytes"] / max(s["records"], 1) for s in doc["shards"]]
    for k, (a, b) in enumerate(ranges):
        sizes[a:b] = [int(per[k])] * (b - a)
    return None, doc.get("split"), doc["meta"], ranges, sizes


# --------------------------------------------------------------------------- the outputs
def _check_targets(plans: List[SplitPlan], container: str, reads: List[str],
                   overwrite: bool) -> None:
    """Before any work: no output shares a file with the source (``reads``, its files), and
    none replaces what is not this plan's (by the one rule of
    :func:`~gluon_data.format.ownership.check_replaceable`): without ``overwrite`` only a
    manifest and shards of this plan; with it, only gluon-data's own (a plain file, foreign
    JSON or a cut or edited manifest is refused even then)."""
    shards = dataset_files(*(j.path for p in plans for j in p.jobs), container=container)
    check_disjoint([p.manifest for p in plans] + shards, reads)
    for p in plans:
        check_replaceable(p.manifest, "manifest", overwrite, plan=str(p.names),
                          recorded=_manifest_plan)
        for j in p.jobs:
            if container == "lmdb":
                files = [(j.path, "lmdb")]
            else:
                rec, idx, mp = shard_files(j.path, container)
                files = [(rec, "rec"), (idx, "idx"), (idx + BINARY_INDEX_SUFFIX, "gdx"),
                         (mp, "meta")]
            recorded = _read_once(partial(_shard_plan, container, j.split, j.path))
            for path, kind in files:
                check_replaceable(path, kind, overwrite, plan=str(p.names),
                                  recorded=recorded)


def _read_once(read: Callable[[], Optional[str]]) -> Callable[[str], Optional[str]]:
    """``recorded(path)`` for each file of one shard: the shard's metadata read once."""
    once = functools.lru_cache(maxsize=None)(read)
    return lambda _path: once()


def _shard_plan(container: str, split: str, path: str) -> Optional[str]:
    """The names-only plan digest a shard's metadata records (older shards: their digest):
    ``recorded`` of :func:`~gluon_data.format.ownership.check_replaceable` for a shard."""
    meta = read_meta(path) if container == "rec" else read_shard_meta(path, container, split)
    info = (meta or {}).get("shard") or {}
    return info.get("plan", info.get("plan_digest"))


def _manifest_plan(path: str) -> Optional[str]:
    """The names-only plan digest a manifest records (older ones: their digest)."""
    made = read_manifest(path)["plan"]
    return made.get("names", made["digest"])
