"""The shard tasks: each a pure function of (plan, shard number, options) that writes one
shard with the converter's writers, publishes it by rename, and is skipped on a rerun when
the shard's metadata carries the plan's digest (:func:`write_shard`, :class:`ShardJob`); all
of a plan's run on its engine by :func:`run_shards`."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, List, Optional, Tuple, cast


from ..format import codec
from ..storage.fsutil import OutputLock
from ..errors import ConversionError, GluonDataError, WorkerPathError
from ..format.plan import conversion_id, part_digest
from ..stores.lmdbio import LMDBFile, is_lmdb
from ..format.meta import CONTAINER_KEYS, read_meta
from ..stores.recordio import RecordFile
from ..stores.shardstore import ShardedStore
from ..stores.shards import is_manifest, read_shard_meta, shard_files, shard_summary
from ..tools.progress import progress_bar
from ..tools.stats import RunningStats as _Stats
from ..stores.base import is_uri, open_store
from .done import record_in, shard_unit, why_not_done, why_rec_not_done
from .encode import EncodeOptions, encode_job
from .engines import SHARED_PATH_RULE, run_tasks
from .options import ConvertOptions
from .outputs import fail_conversion, split_metadata, split_fields, done_record, open_writers
from .sources import Source

__all__ = ["write_shard", "ShardJob", "run_shards", "source_location", "NOT_COPIED"]


@dataclass(frozen=True)
class ShardJob:
    """Everything one shard task needs (picklable; sent to a process or a Dask worker).

    ``items`` (encode: ``(global position, Item)`` pairs) or ``copy_from`` (copy: a store
    location, its split and the ``[start, end)`` record range) say what goes in.
    """

    path: str
    index: int
    count: int
    container: str
    split: str
    digest: str
    items: Optional[tuple] = None
    copy_from: Optional[Tuple[str, Optional[str], int, int]] = None
    source_meta: Optional[dict] = None
    src: Optional[Source] = None  # convert's Source, without its item lists
    opts: Optional[EncodeOptions] = None
    classes: Optional[list] = None
    num_classes: Optional[int] = None
    options: Optional[dict] = None
    on_error: str = "fail"
    source_options: Optional[dict] = None  # a copy from a URI: the remote store's options
    plan: Optional[str] = None  # the split plan's names-only digest (``digest``: this shard's)


def _finished(job: ShardJob) -> Optional[dict]:
    """The summary of a shard this plan already published from the same state of its items,
    else ``None``: by the one rule of "done" (:func:`~gluon_data.convert.done.why_not_done`),
    the ``done`` record in the shard's metadata must name this shard and ``job.digest`` (its
    items' stamps: size, mtime, inode, ctime), and its ``.rec`` and ``.idx`` (both named by
    the record, in metadata whose checksum holds) have the recorded sizes and SHA-256 (read
    once each). A shard of a changed source, damaged, of the
    previous release (its metadata records no digests: not provably complete), or with no
    readable metadata, is rewritten (the client refused, before any task, to replace one
    that is not of this plan: :func:`gluon_data.convert.shard_plan.plan_shards`); a shard
    whose metadata holds an invalid record is refused (:class:`ConversionError` naming it)."""
    try:
        meta = read_shard_meta(job.path, job.container, job.split)
    except (GluonDataError, OSError):
        return None
    info = (meta or {}).get("shard")
    if not info or "done" not in info:
        return None
    record = record_in(info, job.path, what="shard metadata's done record")
    unit = shard_unit(job.index, job.count)
    if any(not os.path.exists(p) for p in shard_files(job.path, job.container)) or \
            (why_rec_not_done(cast(dict, meta), record, unit, job.digest, job.path)
             if job.container == "rec" else why_not_done(record, unit, job.digest)) is not None:
        return None
    return dict(shard_summary(job.path, job.container, job.split), reused=True)


def _open_writer(job: ShardJob):
    _, writers = open_writers(job.path, [job.split], job.container, overwrite=True)
    return writers


def write_shard(job: ShardJob) -> dict:
    """Write shard ``job.index`` (or recognise it as done); return its manifest entry.

    Idempotent: a shard published by the same plan is kept; anything else under its name
    (partial files of a killed attempt included) is rewritten from scratch and published
    by rename. Raises :class:`ConversionError` naming the shard and the bad item.
    """
    # the one output lock, as every writer takes it: a rerun or a retried task of the same
    # shard running at the same time fails at once instead of writing the same files
    with OutputLock([job.path]):
        return _write_shard_locked(job)


def _write_shard_locked(job: ShardJob) -> dict:
    done = _finished(job)
    if done is not None:
        return done
    label = "shard %d of %d (%s)" % (job.index, job.count, os.path.basename(job.path))
    shard_info = {"index": job.index, "count": job.count, "plan_digest": job.digest,
                  "plan": job.plan}
    writers: Dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        writers = _open_writer(job)
        w = _KeyLog(writers[job.split])
        written_keys = w.keys
        if job.copy_from is not None:
            meta = _copy_records(job, w, label)
        else:  # an encode job: its items, src and opts are set
            items = cast(tuple, job.items)
            src, opts = cast(Source, job.src), cast(EncodeOptions, job.opts)
            st, skipped = _Stats(), []
            for pos, item in items:
                _, payload, info, err = encode_job((pos, item), opts)
                if err is not None:
                    if job.on_error == "fail":
                        raise ConversionError("%s, item %d (%s): %s"
                                              % (label, pos, item.name, err[1]), err[0])
                    skipped.append({"file": err[0], "reason": err[1]})
                    continue
                w.write(item.key if item.key is not None else pos, payload)
                st.add(info)
                if src.task == "segmentation":  # as convert(): mode='test' returns it
                    st.names.append(os.path.basename(item.image))
            meta = split_metadata(src, job.split, w.count, st, opts, job.classes,
                                  job.num_classes, skipped, job.options)
            meta.update(split_fields(src, job.split, _shard_digest(job), w, st,
                        [i for _, i in items]))
            shard_info.update(items=[items[0][0], items[-1][0] + 1],
                              stats=st.state())
        shard_info["done"] = done_record(shard_unit(job.index, job.count), job.digest, w)
        meta["shard"] = shard_info
        if job.container == "lmdb" and written_keys != list(range(len(written_keys))):
            meta["record_keys"] = written_keys  # LMDB keys are positions: keep the .idx keys
        w.finish(meta)
        w.publish()
    except BaseException as e:
        fail_conversion(e, writers, job.path)
    out = shard_summary(job.path, job.container, job.split)
    out.update(reused=False, seconds=time.perf_counter() - t0)
    return out


def _shard_digest(job: ShardJob) -> str:
    """The shard's names-only identity (:func:`~gluon_data.format.plan.part_digest` of the
    split plan's names-only digest): its ``conversion_id`` derives from it (and from what
    was written), as an unsharded conversion's derives from its plan's."""
    return str(part_digest({"plan": job.plan or job.digest}, job.index))


class _KeyLog:
    """A writer that remembers the keys written through it (LMDB shards store them)."""

    def __init__(self, writer):
        self.writer, self.keys = writer, []

    def write(self, key: int, payload) -> int:
        self.keys.append(int(key))
        return self.writer.write(key, payload)

    def __getattr__(self, name):
        return getattr(self.writer, name)


def _copy_records(job: ShardJob, w, label: str) -> dict:
    """Copy records ``[start, end)`` of a store byte for byte (checksums verified)."""
    # a copy job: its copy_from and source_meta are set
    location, split, start, end = cast(Tuple[str, Optional[str], int, int], job.copy_from)
    source_meta = cast(dict, job.source_meta)
    store = _open_source_store(location, split, job.source_options)
    seg = source_meta["task"] == "segmentation"
    keys = source_meta.get("record_keys")
    for i in range(start, end):
        payload = store.read(i)
        try:
            codec.unpack(payload, segmentation=seg, verify=True, path=location,
                         key=store.key(i), offset=store.offset(i))
        except GluonDataError as e:
            raise ConversionError("%s: source record %d: %s" % (label, i, e.reason),
                                  e.path or location) from None
        w.write(keys[i] if keys is not None else store.key(i), payload)
    meta = {k: v for k, v in source_meta.items()
            if k not in NOT_COPIED}
    meta["num_records"] = end - start
    if meta.get("item_names") is not None:  # position i of this shard is start + i
        meta["item_names"] = meta["item_names"][start:end]
    if "conversion_id" in meta:  # a shard is its own dataset: its own, derived id
        meta["conversion_id"] = conversion_id(_shard_digest(job), job.split, w.count,
                                              w.bytes_written)
    return meta


#: Metadata keys a copied shard (and its manifest) does not take from the source: the
#: container's own (:data:`gluon_data.format.meta.CONTAINER_KEYS`), ``shard`` and ``done``
#: (the done record of the source's own files).
NOT_COPIED = CONTAINER_KEYS + ("shard", "done")


def source_location(source: str) -> str:
    """How a plan names its source: a URI as given, a path made absolute."""
    return source if is_uri(source) else os.path.abspath(source)


def _open_source_store(location: str, split: Optional[str],
                       options: Optional[dict] = None):
    if is_uri(location):  # through the remote store (whole objects cached on the node)
        return open_store(location, split, **(options or {}))
    if is_manifest(location):
        return ShardedStore(location, split)
    if is_lmdb(location):
        return LMDBFile(location, split or "train")
    meta = read_meta(location)
    return RecordFile(location, expected_count=meta["num_records"] if meta else None)


def _job_items(job: ShardJob) -> int:
    if job.items is not None:
        return len(job.items)
    return cast(tuple, job.copy_from)[3] - cast(tuple, job.copy_from)[2]  # a copy job


def run_shards(jobs: List[ShardJob], sink: Any, o: ConvertOptions,
               shared: List[Tuple[str, str]]) -> Dict[str, dict]:
    """Run every shard task on ``o.engine`` (``o.workers``, ``o.scheduler``,
    ``o.task_retries``, ``o.progress``) with a progress bar: each by
    :func:`write_shard`, or by ``sink.write_shard(job, write=write_shard)`` where a
    ``sink`` takes the shards. Returns each shard's manifest entry, by shard path.

    ``shared``: what every Dask task checks on its worker first (the ``output folder`` is
    made here); a shard a Dask worker reports written must then be on this machine too, else
    :class:`~gluon_data.errors.WorkerPathError` (the manifest would name shards the client
    does not have)."""
    engine = o.engine
    made: List[str] = []  # the folders made here, deepest first: removed, if empty, on failure
    if engine == "dask":
        for what, path in shared:
            if what == "output folder":
                folder = os.path.abspath(path)
                while not os.path.exists(folder):
                    made.append(folder)
                    folder = os.path.dirname(folder)
                os.makedirs(path, exist_ok=True)
    bar = progress_bar(sum(map(_job_items, jobs)), "convert %d shards" % len(jobs),
                       enabled=o.progress)
    results: Dict[str, dict] = {}
    nbytes = 0
    try:
        keys = ["gluon-data-%s-%s" % (os.path.basename(j.path), j.digest[:16]) for j in jobs]
        task = write_shard if sink is None else partial(sink.write_shard, write=write_shard)
        for i, res in run_tasks(task, jobs, engine=engine, workers=o.workers,
                                scheduler=o.scheduler, scheduler_wait=o.scheduler_wait,
                                retries=o.task_retries, keys=keys,
                                shared_paths=shared):
            job = jobs[i]
            rec = shard_files(job.path, job.container)[0]
            if sink is None and engine == "dask" and (not os.path.exists(rec) or (
                    job.container == "rec" and os.path.getsize(rec) != res["bytes"])):
                raise WorkerPathError("a worker wrote this shard, but it is not on this "
                                      "machine: %s" % SHARED_PATH_RULE, rec)
            results[job.path] = res
            nbytes += res["bytes"]
            bar.update(_job_items(job))
            bar.set_postfix_str("%.1f MB, %d/%d shards" % (nbytes / 1e6, len(results),
                                                           len(jobs)))
    except BaseException:
        for folder in made:  # (a WorkerPathError: nothing was written there)
            try:
                os.rmdir(folder)  # only an empty one
            except OSError:
                break
        raise
    finally:
        bar.close()
    return results
