"""The manifests of a sharded conversion, written last: each names the shards its split's
tasks wrote (or kept), with the whole split's metadata merged from theirs."""
from __future__ import annotations

import types
from typing import Dict, List

from ..stores.shards import MANIFEST_FORMAT, MANIFEST_VERSION, write_manifest
from ..tools.stats import RunningStats
from .outputs import split_fields, split_metadata
from .report import ConversionReport
from .shard_plan import ShardPlan, SplitPlan
from .shard_task import NOT_COPIED

__all__ = ["publish"]

#: What a manifest records of each shard (its entry, from the task that wrote it).
_ENTRY = ("name", "records", "bytes", "idx_sha256", "meta_sha256")


def publish(plan: ShardPlan, results: Dict[str, dict], report: ConversionReport) -> None:
    """Write each split's manifest (once every shard task has returned its entry in
    ``results``, by shard path) and account its shards in ``report``: ``outputs`` (split:
    manifest), ``written``, ``kept``, ``shards``, ``bytes_written`` and ``skipped``."""
    report.shards = []  # type: ignore[attr-defined]
    for p in plan.splits:
        entries = [results[j.path] for j in p.jobs]
        meta = _merged_meta(p, entries, report.skipped)
        write_manifest(p.manifest, {
            "format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION,
            "container": plan.container, "split": p.split, "task": meta["task"],
            "num_records": sum(e["records"] for e in entries),
            "plan": dict(p.doc, digest=p.digest),
            "shards": [{k: e[k] for k in _ENTRY} for e in entries], "meta": meta})
        report.outputs[p.split] = p.manifest
        report.written[p.split] = sum(e["records"] for e in entries if not e["reused"])
        kept = [e for e in entries if e["reused"]]
        if kept:  # shards a rerun (or a retried task) found complete: not written again
            report.kept[p.split] = sum(e["records"] for e in kept)
            report.kept_shards += len(kept)
        for k, e in enumerate(entries):
            report.shards.append(dict(e, split=p.split, index=k))  # type: ignore
            report.bytes_written += 0 if e["reused"] else e["bytes"]
            report.skipped.extend(e["meta"].get("skipped", []) if not plan.copying else [])


def _merged_meta(p: SplitPlan, entries: List[dict], problems: list) -> dict:
    """The whole split's metadata: the copy source's, or recomputed by the converter's own
    :func:`~gluon_data.convert.outputs.split_metadata` from the shards' merged statistics."""
    if p.merge is None:
        meta = {k: v for k, v in (p.meta or {}).items() if k not in NOT_COPIED}
        meta["num_records"] = sum(e["records"] for e in entries)
        return meta
    stub, opts, classes, num_classes, options = p.merge
    st = RunningStats()
    skipped = list(problems)
    for e in entries:
        st.merge(RunningStats.from_state(e["meta"]["shard"]["stats"]))
        skipped.extend(e["meta"].get("skipped", []))
    count = sum(e["records"] for e in entries)
    meta = split_metadata(stub, p.split, count, st, opts, classes, num_classes, skipped,
                          options)
    written = types.SimpleNamespace(count=count,
                                    bytes_written=sum(e["bytes"] for e in entries))
    meta.update(split_fields(stub, p.split, p.names, written, st,
                [i for j in p.jobs for _, i in j.items or ()]))
    return meta
