"""The local, unsharded conversion: :func:`convert_local` imports a legacy LMDB, copies a
dataset, or plans a source layout into splits (:mod:`.planning`) and hands them to
:func:`~.loop.drive`, the loop every planned conversion runs through."""
from __future__ import annotations

import os
import time
from functools import partial
from typing import List, Optional

from .engines import refuse_in_bootstrap, stop_pool
from ..errors import ConversionError
from ..format.ownership import check_disjoint
from ..format.plan import PlanDigest
from ..stores.shards import dataset_files
from .sources import Item
from .copy import copy_dataset, import_lmdb
from .encode import encode_job
from .loop import SplitJobs, drive, start_encoders
from .done import file_facts, output_unit
from .outputs import check_output, split_metadata, split_fields, done_record, outputs_for
from .report import ConversionReport
from .options import ConvertOptions, checkpoint_every_default
from .planning import Planned, check_values, is_dataset, plan_source, take_problems
from .resume import source_plan_digest

__all__ = ["convert_local"]

def convert_local(source: str, output: str, layout: Optional[str],
                  options: ConvertOptions) -> ConversionReport:
    """One conversion into a local output, unsharded: a legacy LMDB imported
    (:func:`~.copy.import_lmdb`), a dataset copied (:func:`~.copy.copy_dataset`), or a source
    layout planned (:func:`~.planning.plan_source`) and driven (:func:`~.loop.drive`).
    Reached through :func:`gluon_data.convert`, which decides which conversion runs."""
    refuse_in_bootstrap()
    o = checkpoint_every_default(options)
    check_values(o)
    outputs = outputs_for(output, o.format)
    check_output(output, outputs.name)
    source = os.fspath(source)
    if layout in ("raw-lmdb", "caffe-lmdb"):
        return import_lmdb(source, output, layout, o.replace(format=outputs.name))
    if is_dataset(source):
        return copy_dataset(source, output, split=o.split, format=outputs.name,
                            overwrite=o.overwrite, progress=o.progress,
                            source_options=o.source_options)
    t0 = time.perf_counter()
    # the workers start (import the encoder) while the source is listed and stamped; drive
    # owns the pool
    pool = start_encoders(o.workers, encode_job)
    try:
        planned, report = _open_and_plan(source, layout, output, outputs, o)
        splits, meta, digest = _drive_args(planned, report)
    except BaseException:
        if pool is not None:
            stop_pool(pool)
        raise
    return drive(output, outputs, splits, partial(encode_job, opts=planned.opts), digest=digest,
                 root=planned.src.root, options=planned.options, report=report,
                 finish_meta=meta, source=source, run=o, t0=t0, pool=pool)


def _open_and_plan(source: str, layout: Optional[str], output: str, outputs,
                   o: ConvertOptions):
    """The planning of :func:`convert`: ``(planned, report)``, the source opened and
    planned (:func:`~.planning.plan_source`), and the report naming the outputs (checked
    disjoint from the source files) with the source's problems taken."""
    planned = plan_source(source, layout, o)
    report = ConversionReport(outputs=outputs.paths(os.fspath(output), list(planned.plan)))
    check_disjoint(dataset_files(*report.outputs.values(), container=outputs.name),
                   dataset_files(source))
    take_problems(planned.src, o.on_error, report)
    if not any(planned.plan.values()):
        raise ConversionError("source holds no items to convert (layout %r)"
                              % planned.src.layout, source)
    return planned, report


def _drive_args(planned: Planned, report: ConversionReport):
    """What :func:`~.loop.drive` takes of a planned conversion: ``(splits, finish_meta,
    digest)``, one job list per split, each split's metadata made from the source and the
    plan, and the plan's digest (every file stamped)."""
    src, plan, opts, options = planned.src, planned.plan, planned.opts, planned.options
    seg = src.task == "segmentation"
    whole = source_plan_digest(src, plan, opts, options)
    splits = {s: SplitJobs(len(items), partial(_from, list(enumerate(items))),
                           partial(_item_key, items),
                           partial(_item_name, items) if seg else (lambda pos: None),
                           _item_bytes(whole, s))
              for s, items in plan.items()}

    def finish_meta(s, w, st, digest, facts=file_facts):
        meta = split_metadata(src, s, w.count, st, opts, planned.classes, planned.num_classes,
                              report.skipped, options)
        meta.update(split_fields(src, s, digest, w, st, plan[s]))
        meta["done"] = done_record(output_unit(s), whole, w, facts)
        return meta

    return splits, finish_meta, whole


def _item_bytes(digest: PlanDigest, split: str) -> Optional[float]:
    """The mean size of an item's files in ``split``, from the stamps the plan's digest
    took (None where it took none)."""
    entries = digest.stamped.get(split) or []
    sizes = [st[0] for _, pairs in entries for _, st in pairs if st]
    return sum(sizes) / len(entries) if sizes else None


def _from(jobs: list, start: int) -> list:
    return jobs[start:]


def _item_key(items: List[Item], pos: int) -> Optional[int]:
    return items[pos].key


def _item_name(items: List[Item], pos: int) -> str:
    return os.path.basename(items[pos].image)

