"""Sharded conversion: a plan, one task per shard, a manifest per split.

A source layout (encoded through the converter's per-item code,
:func:`~.encode.encode_job`) or a dataset (its records copied, checksums verified) is
planned into shards; each shard is one task, a pure function of (plan, shard number,
options) run by :mod:`gluon_data.convert.engines`, which writes it with the converter's
writers and publishes it by rename; the manifest (:mod:`gluon_data.stores.shards`) is
written last. A rerun keeps the shards the one rule of "done" proves finished
(:mod:`gluon_data.convert.done`) and redoes the rest.

:func:`sharded_conversion` is internal: :func:`gluon_data.convert.convert` runs it for
``shards=N`` (or ``shard_size=``, ``shard_items=``). The old entry :func:`convert_sharded`
still imports from ``gluon_data.convert`` (and the old ``gluon_data.shards``), with a
``DeprecationWarning``.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import types
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, cast

import numpy as np

from ..storage.credentials import forward_options
from .engines import SHARED_PATH_RULE, run_tasks
from ..errors import ConversionError, WorkerPathError
from ..stores.lmdbio import LMDBFile, is_lmdb, read_lmdb_meta
from ..format.meta import read_meta
from ..format.ownership import check_replaceable
from ..format.plan import part_digest, plan_digest, source_head
from ..format.recindex import BINARY_INDEX_SUFFIX
from ..tools.progress import progress_bar
from ..stores.recordio import RecordFile
from ..stores.shards import (MANIFEST_FORMAT, MANIFEST_VERSION, is_manifest, manifest_path,
                             parse_size, plan_ranges, prefix_of, read_manifest, read_shard_meta,
                             shard_files, shard_name, write_manifest)
from ..tools.stats import RunningStats as _Stats
from ..stores.base import is_uri, open_store
from .copy import stock_meta
from .options import SHARDED_READS, ConvertOptions, deprecated_retries, refuse_unread
from .planning import check_values, plan_source, take_problems
from .outputs import ConversionReport, split_metadata, split_fields, output_format
from .shard_task import (ShardJob, NOT_COPIED, check_not_source, source_location, write_shard)
from .superseded import remove_superseded, replaced_datasets

__all__ = ["convert_sharded", "sharded_conversion", "write_shard", "ShardJob"]


# --------------------------------------------------------------------------- conversion
def _shard_plan(container: str, split: str):
    """``recorded(path)`` of :func:`~gluon_data.format.ownership.check_replaceable` for a
    shard: the names-only plan digest its metadata records (older shards: their digest)."""
    def recorded(path: str) -> Optional[str]:
        meta = read_meta(path) if container == "rec" else read_shard_meta(path, container,
                                                                           split)
        info = (meta or {}).get("shard") or {}
        return info.get("plan", info.get("plan_digest"))
    return recorded


def _manifest_plan(path: str) -> Optional[str]:
    """The names-only plan digest a manifest records (older ones: their digest)."""
    made = read_manifest(path)["plan"]
    return made.get("names", made["digest"])


def _item_size(item) -> int:
    size = 0
    for p in (item.image, item.mask):
        if p:
            try:
                size += os.path.getsize(p)
            except OSError:
                pass
    return size


def convert_sharded(source: str, output: str, layout: Optional[str] = None,
                    options: Optional[ConvertOptions] = None, *, sink=None, **overrides):
    """Convert a source (or re-shard a dataset) into shards plus a manifest per split.

    ``source`` is a folder / ``.lst`` (encoded through the converter's per-item code), or a
    ``.rec``, ``.lmdb`` or ``.shards.json`` dataset (records copied, no re-encoding). The
    items are planned into shards by ``shards``, ``shard_size`` (bytes or ``"1GB"``) or
    ``shard_items`` (a ``.shards.json`` source keeps its own shards when none is given),
    one task per shard runs on ``engine`` (``local`` or ``dask``, see
    :func:`gluon_data.convert.engines.run_tasks`), and the manifest is written last. The output is
    byte-identical for any engine and number of workers; rerunning the same call skips the
    shards already published and finishes the rest.

    A dataset source may be a URI (``s3://bucket/x.rec``, ``.lmdb``, ``.shards.json``): each
    task reads its records through the remote store (:mod:`gluon_data.stores.remote`, with
    ``source_options``: ``storage_options``, ``cache_dir``...; they travel with the tasks and
    are never written into the output), whole objects downloaded once per node into the cache.

    Tasks use the storage options they are given and, for the rest, the environment of the
    machine running them (a Dask worker's own); ``forward_credentials`` completes
    ``source_options``' ``storage_options`` with this machine's credentials
    (:func:`gluon_data.storage.credentials.forward_options`), in memory only. Local paths are made
    absolute here; with ``engine='dask'`` every task first checks that the source (and the
    output folder) exist on its worker (:class:`~gluon_data.errors.WorkerPathError`).

    ``sink`` (optional) puts each shard elsewhere than ``output``'s folder, e.g. into object
    storage (:class:`gluon_data.convert.upload.ShardUploader`): ``sink.prepare(plans, container)`` runs
    once the plan is known and checked, before any task; each task is then
    ``sink.write_shard(job, write=write_shard)`` instead of :func:`write_shard` (it returns
    the manifest entry, and may add ``files``); the manifests are still written locally under
    ``output``.

    ``options`` is a :class:`~gluon_data.convert.options.ConvertOptions` (or its fields as
    keywords); the options a sharded conversion does not read (``resume``,
    ``checkpoint_every``, the legacy-import and object-storage ones) must be left at their
    defaults. :func:`gluon_data.convert` calls this for ``shards``/``shard_size``/
    ``shard_items`` or a manifest source.

    Returns
    -------
    ConversionReport
        ``outputs`` maps each split to its manifest; ``shards`` lists per-shard entries.
    """
    o = ConvertOptions.merge(options, deprecated_retries(overrides, "task_retries"))
    refuse_unread(o, SHARDED_READS, "a sharded conversion")
    return sharded_conversion(source, output, layout, o, sink)


def sharded_conversion(source: str, output: str, layout: Optional[str], o: ConvertOptions,
                       sink=None):
    """:func:`convert_sharded` once its options are merged and checked (by
    :func:`gluon_data.convert` or :func:`convert_sharded`)."""
    shard_size, given = _checked_options(o)
    cut = partial(plan_ranges, shards=o.shards, shard_size=shard_size,
                  shard_items=o.shard_items) if given else None
    # paths resolve here, on the client: a Dask worker runs in its own working directory
    source, output = (source_location(os.fspath(x)) for x in (source, output))
    if o.lst_root is not None:
        o = o.replace(lst_root=os.path.abspath(o.lst_root))
    source_options = o.source_options
    if o.forward_credentials and is_uri(source):
        source_options = dict(source_options or {}, storage_options=forward_options(
            source, (source_options or {}).get("storage_options")))
    container = o.format or ("lmdb" if output.rstrip("/").endswith(".lmdb") else "rec")
    output_format(output, container)  # validates the name
    prefix = prefix_of(output)
    t0 = time.perf_counter()
    report = ConversionReport()
    report.shards = []  # type: ignore[attr-defined]
    copying = (is_manifest(source) or source.endswith(".rec") or is_lmdb(source)
               or (is_uri(source) and source.rstrip("/").endswith(".lmdb")))
    plans, root = (_plan_copy(source, o.split, source_options, prefix, container, cut),
                   source) if copying else _plan_encoding(source, layout, prefix, container,
                                                          cut, report, o)
    _check_targets(plans, container, source, o.overwrite)
    replaced = replaced_datasets(plans, source, remove_shards=sink is None)
    for p in plans:  # (checked above: ours to replace) a rerun rewrites shards in place, and
        if manifest_path(p["prefix"]) not in replaced.kept_manifests:  # no manifest may name
            _drop(manifest_path(p["prefix"]))  # them until it is written anew
    if sink is not None:
        sink.prepare(plans, container)
    results = _run_shards(plans, sink, o, _shared_paths(source, root, output, sink, o.engine))
    for p in plans:
        _write_split_manifest(p, [results[j.path] for j in p["jobs"]], container, report,
                              copying)
    remove_superseded(replaced.shards, report)
    report.seconds = time.perf_counter() - t0
    return report


def _drop(path: str) -> None:
    """Remove a manifest the run replaces, before any shard is written: one interrupted or
    failed then leaves no manifest that names shards rewritten since (a reader would mix the
    old metadata with the new records); a rerun writes it again."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _shared_paths(source: str, root: str, output: str, sink, engine: str) -> list:
    """What every Dask task checks on its worker before it starts (the output folder made
    here first when the shards are written there)."""
    shared = []
    if not is_uri(source):
        shared.append(("source", root))
    if sink is None and engine == "dask":
        os.makedirs(os.path.dirname(output), exist_ok=True)
        shared.append(("output folder", os.path.dirname(output)))
    return shared


def _plan_encoding(source: str, layout: Optional[str], prefix: str, container: str, cut,
                   report: ConversionReport, o: ConvertOptions) -> Tuple[List[dict], str]:
    """The shard plans of a source encoded through the per-item code, and its root: the
    source opened and planned (:func:`~.planning.plan_source`, as a local conversion's),
    its problems taken into ``report``."""
    planned = plan_source(source, layout, o)
    take_problems(planned.src, o.on_error, report)
    return (_plan_encode(planned.src, planned.plan, source, prefix, container, cut,
                         (planned.opts, planned.classes, planned.num_classes,
                          planned.options, o.on_error)),
            os.path.abspath(planned.src.root))


def _checked_options(o: ConvertOptions):
    """The checked options: ``(shard_size in bytes, whether the shards are given)``."""
    shard_size = parse_size(o.shard_size) if isinstance(o.shard_size, str) else o.shard_size
    given = sum(x is not None for x in (o.shards, shard_size, o.shard_items))
    if given > 1:
        raise ValueError("give only one of --shards, --shard-size, --shard-items")
    check_values(o)
    return shard_size, bool(given)


def _plan_copy(source: str, split: Optional[str], source_options: Optional[dict],
               prefix: str, container: str, cut) -> List[dict]:
    """The plan of each split of a dataset copied into shards: its jobs (a record range
    each), manifest skeleton and digests. ``cut(sizes)`` gives the ranges (``None``: the
    source's own shards)."""
    plans: List[dict] = []
    found = list(_copy_sources(source, split, source_options))
    for s, loc_split, meta, ranges_default, sizes in found:
        ranges = cut(sizes) if cut is not None else ranges_default
        if ranges is None:
            raise ValueError("re-sharding %s needs --shards, --shard-size or "
                             "--shard-items" % source)
        spfx = prefix if len(found) == 1 else "%s_%s" % (prefix, s)
        head = {"copy": source_location(source), "split": s, "ranges": ranges,
                "container": container, "meta": meta}
        names = plan_digest(head)
        digest = plan_digest(head, {s: _stamped_files(source)})
        jobs = [ShardJob(path=shard_name(spfx, k, len(ranges), container), index=k,
                         count=len(ranges), container=container, split=meta.get("split")
                         or "train", digest=str(part_digest({"plan": digest}, k)),
                         copy_from=(source, loc_split, a, b), source_meta=meta,
                         source_options=source_options, plan=str(names))
                for k, (a, b) in enumerate(ranges)]
        plans.append({"prefix": spfx, "jobs": jobs, "digest": digest, "meta": meta,
                      "names": names, "split": meta.get("split") or "train",
                      "ranges": ranges,
                      "plan": {"source": source_location(source), "kind": "copy",
                               "ranges": ranges, "names": names}})
    return plans


def _plan_encode(src, plan: Dict[str, list], source: str, prefix: str, container: str,
                 cut, how: tuple) -> List[dict]:
    """The plan of each split of a source layout encoded into shards (``how``: ``(opts,
    classes, num_classes, options, on_error)``): its jobs (the items of each shard, with
    the digest of their state), manifest skeleton and what merging the shards' metadata
    takes. ``cut(sizes)`` gives the ranges (``None``: one shard)."""
    opts, classes, num_classes, options, on_error = how
    stub = dataclasses.replace(src, splits={}, problems=[])
    plans: List[dict] = []
    for s, items in plan.items():
        if not items:
            raise ConversionError("split %r would be empty" % s, source)
        ranges = (cut([_item_size(i) for i in items]) if cut is not None
                  else [(0, len(items))])
        spfx = prefix if len(plan) == 1 else "%s_%s" % (prefix, s)
        head = source_head(src, opts, dict(options, shards=ranges, container=container))
        names = plan_digest(head, {s: items}, src.root, stamps=False)
        each = [str(part_digest(head, k, {s: items[a:b]}, src.root))
                for k, (a, b) in enumerate(ranges)]  # each shard: its own items' stamps
        digest = plan_digest(dict(head, shards=each))
        jobs = [ShardJob(path=shard_name(spfx, k, len(ranges), container), index=k,
                         count=len(ranges), container=container, split=s, digest=each[k],
                         items=tuple((p, items[p]) for p in range(a, b)), src=stub,
                         opts=opts, classes=classes, num_classes=num_classes,
                         options=options, on_error=on_error, plan=str(names))
                for k, (a, b) in enumerate(ranges)]
        plans.append({"prefix": spfx, "jobs": jobs, "digest": digest, "names": names,
                      "split": s,
                      "ranges": ranges, "merge": (stub, opts, classes, num_classes,
                                                  options),
                      "plan": {"source": os.path.abspath(src.root), "layout": src.layout,
                               "kind": "encode", "options": options,
                               "items": len(items), "ranges": ranges, "names": names}})
    return plans


def _check_targets(plans: List[dict], container: str, source: str, overwrite: bool) -> None:
    """Before any work: no output shares a file with the source, and none replaces what is
    not this plan's (by the one rule of :func:`~gluon_data.format.ownership.
    check_replaceable`): without ``overwrite`` only a manifest and shards of this plan;
    with it, only gluon-data's own (a plain file, foreign JSON or a cut or edited manifest
    is refused even then)."""
    check_not_source(plans, container, source)
    for p in plans:
        check_replaceable(manifest_path(p["prefix"]), "manifest", overwrite,
                          plan=str(p["names"]), recorded=_manifest_plan)
        for j in p["jobs"]:
            if container == "lmdb":
                files = [(j.path, "lmdb")]
            else:
                rec, idx, mp = shard_files(j.path, container)
                files = [(rec, "rec"), (idx, "idx"), (idx + BINARY_INDEX_SUFFIX, "gdx"),
                         (mp, "meta")]
            once = functools.lru_cache(maxsize=None)(  # the shard's metadata read once
                partial(_shard_plan(container, j.split), j.path))
            recorded = lambda _, once=once: once()  # noqa: E731 (of the shard, any file)
            for path, kind in files:
                check_replaceable(path, kind, overwrite, plan=str(p["names"]),
                                  recorded=recorded)


def _job_items(job: ShardJob) -> int:
    if job.items is not None:
        return len(job.items)
    copy_from = cast(tuple, job.copy_from)  # a copy job
    return copy_from[3] - copy_from[2]


def _run_shards(plans: List[dict], sink, o: ConvertOptions, shared: list) -> Dict[str, dict]:
    """Run every shard task on ``o.engine`` (``o.workers``, ``o.scheduler``,
    ``o.task_retries``); each shard's manifest entry, by shard path."""
    engine = o.engine
    jobs = [j for p in plans for j in p["jobs"]]
    bar = progress_bar(sum(map(_job_items, jobs)), "convert %d shards" % len(jobs),
                       enabled=o.progress)
    results: Dict[str, dict] = {}
    nbytes = 0
    try:
        keys = ["gluon-data-%s-%s" % (os.path.basename(j.path), j.digest[:16]) for j in jobs]
        task = write_shard if sink is None else partial(sink.write_shard, write=write_shard)
        for i, res in run_tasks(task, jobs, engine=engine, workers=o.workers,
                                scheduler=o.scheduler, retries=o.task_retries, keys=keys,
                                shared_paths=shared):
            if sink is None and engine == "dask":
                _check_shard_here(jobs[i], res)
            results[jobs[i].path] = res
            nbytes += res["bytes"]
            bar.update(_job_items(jobs[i]))
            bar.set_postfix_str("%.1f MB, %d/%d shards" % (nbytes / 1e6, len(results),
                                                           len(jobs)))
    finally:
        bar.close()
    return results


def _write_split_manifest(p: dict, entries: List[dict], container: str,
                          report: ConversionReport, copying: bool) -> None:
    """Write split ``p``'s manifest (last: it names the shards written) and account its
    shards in ``report``."""
    meta = _merged_meta(p, entries, report.skipped)
    doc = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
           "container": container, "split": p["split"], "task": meta["task"],
           "num_records": sum(e["records"] for e in entries),
           "plan": dict(p["plan"], digest=p["digest"]),
           "shards": [{k: e[k] for k in ("name", "records", "bytes", "idx_sha256",
                                         "meta_sha256")} for e in entries],
           "meta": meta}
    mp = manifest_path(p["prefix"])
    write_manifest(mp, doc)
    report.outputs[p["split"]] = mp
    report.written[p["split"]] = sum(e["records"] for e in entries if not e["reused"])
    kept = [e for e in entries if e["reused"]]
    if kept:  # shards a rerun (or a retried task) found complete: not written again
        report.kept[p["split"]] = sum(e["records"] for e in kept)
        report.kept_shards += len(kept)
    for k, e in enumerate(entries):
        report.shards.append(dict(e, split=p["split"], index=k))  # type: ignore
        report.bytes_written += 0 if e["reused"] else e["bytes"]
        report.skipped.extend(e["meta"].get("skipped", []) if not copying else [])


def _check_shard_here(job: ShardJob, entry: dict) -> None:
    """A shard a Dask worker reports written must be on this machine too (the output folder
    is shared): else the manifest would name shards the client does not have."""
    rec = shard_files(job.path, job.container)[0]
    if not os.path.exists(rec) or (job.container == "rec"
                                   and os.path.getsize(rec) != entry["bytes"]):
        raise WorkerPathError("a worker wrote this shard, but it is not on this machine: %s"
                              % SHARED_PATH_RULE, rec)


def _merged_meta(p: dict, entries: List[dict], problems: list) -> dict:
    """The whole split's metadata: the copy source's, or recomputed by the converter's own
    :func:`~gluon_data.convert.outputs.split_metadata` from the shards' merged statistics."""
    if "merge" not in p:
        meta = {k: v for k, v in p["meta"].items() if k not in NOT_COPIED}
        meta["num_records"] = sum(e["records"] for e in entries)
        return meta
    stub, opts, classes, num_classes, options = p["merge"]
    st = _Stats()
    skipped = list(problems)
    for e in entries:
        st.merge(_Stats.from_state(e["meta"]["shard"]["stats"]))
        skipped.extend(e["meta"].get("skipped", []))
    count = sum(e["records"] for e in entries)
    meta = split_metadata(stub, p["split"], count, st, opts, classes, num_classes, skipped,
                          options)
    written = types.SimpleNamespace(count=count, bytes_written=sum(e["bytes"] for e in entries))
    meta.update(split_fields(stub, p["split"], p["names"], written, st,
                [i for j in p["jobs"] for _, i in j.items]))
    return meta


def _stamped_files(source: str) -> List[str]:
    """The local files of a dataset being copied, whose stamps (size, mtime, inode, ctime)
    its plan binds (none for a URI: its metadata, in the plan, identifies it)."""
    if is_uri(source):
        return []
    if is_manifest(source):
        return [source]
    return shard_files(source, "lmdb" if is_lmdb(source) else "rec")


def _copy_sources(source: str, split: Optional[str], options: Optional[dict] = None):
    """``(split, store split, meta, default ranges, record sizes)`` per split to copy."""
    if is_uri(source):
        yield from _uri_copy_sources(source, split, options or {})
        return
    if is_manifest(source):
        yield _manifest_copy_source(read_manifest(source))
        return
    if is_lmdb(source):
        metas = read_lmdb_meta(source)
        for s in (split.split(",") if split else sorted(metas)):
            f = LMDBFile(source, s)
            yield s, s, f.meta, None, [len(f.read(i)) for i in range(len(f))]
        return
    meta = read_meta(source)
    rec = RecordFile(source, expected_count=meta["num_records"] if meta else None)
    meta = meta or stock_meta(source, len(rec))
    sizes = rec.extent_sizes().tolist()
    yield None, None, meta, None, sizes


def _manifest_copy_source(doc: dict):
    """:func:`_copy_sources`' entry of a manifest: its shards are the default ranges, and
    each record's size is estimated as its shard's mean."""
    bounds = np.concatenate(([0], np.cumsum([s["records"] for s in doc["shards"]])))
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    sizes = [0] * doc["num_records"]
    per = [s["bytes"] / max(s["records"], 1) for s in doc["shards"]]
    for k, (a, b) in enumerate(ranges):
        sizes[a:b] = [int(per[k])] * (b - a)
    return None, doc.get("split"), doc["meta"], ranges, sizes


def _uri_copy_sources(source: str, split: Optional[str], options: dict):
    """:func:`_copy_sources` of a dataset at a URI, read through its remote store."""
    first: Any = open_store(source, **options)  # which store decides what it has
    if is_manifest(source):  # a RemoteShardedStore: the manifest says it all
        yield _manifest_copy_source(first.manifest)
        return
    names = getattr(first, "splits", None)
    if names is not None:  # an LMDB (RemoteLMDBStore)
        for s in (split.split(",") if split else names):
            f = first if s == first.split else open_store(source, s, **options)
            yield s, s, f.meta, None, [len(f.read(i)) for i in range(len(f))]
        return
    f = first.record_file()  # a .rec: downloaded whole (with its .idx) into the cache
    meta = first.meta or stock_meta(source, len(first))
    yield None, None, meta, None, f.extent_sizes().tolist()
