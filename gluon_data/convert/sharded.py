"""Sharded conversion: a plan, one task per shard, a manifest per split.

A source layout (encoded through the converter's per-item code,
:func:`~.encode.encode_job`) or a dataset (its records copied, checksums verified) is
planned into shards and its outputs checked (:mod:`.shard_plan`); the datasets it writes
over are taken over (:mod:`.superseded`); each shard is one task, a pure function of (plan,
shard number, options) run by :mod:`gluon_data.convert.engines` (:mod:`.shard_task`), which
writes it with the converter's writers and publishes it by rename; each split's manifest
(:mod:`gluon_data.stores.shards`) is written last (:mod:`.publish`). A rerun keeps the
shards the one rule of "done" (:mod:`gluon_data.convert.done`) proves finished and redoes
the rest.

:func:`sharded_conversion` is internal: :func:`gluon_data.convert.convert` runs it for
``shards=N`` (or ``shard_size=``, ``shard_items=``). The old entry :func:`convert_sharded`
still imports from ``gluon_data.convert`` (and the old ``gluon_data.shards``), with a
``DeprecationWarning``.
"""
from __future__ import annotations

import time
from typing import Optional

from .engines import refuse_in_bootstrap
from .options import SHARDED_READS, ConvertOptions, deprecated_retries, refuse_unread
from .report import ConversionReport
from .publish import publish
from .shard_plan import plan_shards
from .shard_task import ShardJob, run_shards, write_shard
from .superseded import remove_superseded, replace_datasets

__all__ = ["convert_sharded", "sharded_conversion", "write_shard", "ShardJob"]


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
    storage (:class:`gluon_data.convert.upload.ShardUploader`): ``sink.prepare(splits,
    container)`` (a :class:`~gluon_data.convert.shard_plan.SplitPlan` per split) runs once
    the plan is known and checked, before any task; each task is then
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
                       sink=None) -> ConversionReport:
    """:func:`convert_sharded` once its options are merged and checked (by
    :func:`gluon_data.convert` or :func:`convert_sharded`): planned and checked, the old
    datasets it replaces taken over, every shard task run, each manifest written, the
    superseded shards removed."""
    refuse_in_bootstrap()
    t0 = time.perf_counter()
    report = ConversionReport()
    plan = plan_shards(source, output, layout, o, report, sink)
    replaced = replace_datasets(plan.splits, plan.source, plan.reads,
                                remove_shards=sink is None)
    if sink is not None:
        sink.prepare(plan.splits, plan.container)
    publish(plan, run_shards(plan.jobs, sink, o, plan.shared), report)
    remove_superseded(replaced.shards, report)
    report.seconds = time.perf_counter() - t0
    return report
