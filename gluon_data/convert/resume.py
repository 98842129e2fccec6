"""Resume: a conversion's identity (its plan digest) and its checkpoints.

A checkpoint records, per split, how many items are done, the writer's position
(``writer.sync()``) and the running statistics, under a done record
(:mod:`gluon_data.convert.done`: the conversion of ``OUTPUT``, done so far under the plan's
digest) read and written by the one resume rule. It lives where the container keeps it
(:attr:`Outputs.keeps_progress`: an LMDB commits it with the records it describes) or in
``OUTPUT.resume.json``, replaced atomically after the partial files were fsynced.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, cast

from ..errors import ConversionError, FormatError
from ..storage.fileio import open_regular
from ..storage.fsutil import LMDB_DATA, fsync_dir
from ..format.ownership import check_replaceable, is_ours
from ..format.plan import PlanDigest, changed_files, plan_digest, source_head
from .sources import Item, Source
from ..tools.stats import RunningStats
from .encode import EncodeOptions
from .outputs import Outputs
from .report import ConversionReport
from .done import (Done, is_done, output_unit, read_record, record_in, why_not_done,
                   why_rec_not_done, write_record)

__all__ = ["Checkpoint", "source_plan_digest", "resume_finished", "import_digest"]


def source_plan_digest(src: Source, plan: Dict[str, List[Item]], opts: EncodeOptions,
                       options: dict) -> PlanDigest:
    """Identity of a conversion (:func:`gluon_data.format.plan.plan_digest`): a checkpoint only
    resumes the same inputs (names and each file's stamp: size, mtime, inode, ctime) and
    options."""
    return plan_digest(source_head(src, opts, options), plan, src.root)


def _holds(path: str, doc: bytes) -> bool:
    """Whether ``path`` is a regular file holding exactly ``doc`` (a small document), read
    under the one input rule (:func:`~gluon_data.storage.fileio.open_regular`: a FIFO there
    is refused, never waited on)."""
    try:
        with open_regular(path) as f:
            return f.read(len(doc) + 1) == doc
    except (OSError, FormatError):
        return False


class Checkpoint:
    """Resume state: per split, items done, writer position and statistics.

    RecordIO: ``OUTPUT.resume.json``, replaced atomically after the partial files were
    fsynced, so it never promises bytes that are not on disk. LMDB: the same document in the
    partial environment, committed in the same transaction as the records it describes.
    """

    def __init__(self, output: str, digest: str, outputs: Outputs):
        self.output = os.fspath(output)
        self.path = self.output + ".resume.json"
        self.digest = digest
        self.outputs = outputs
        self.splits: Dict[str, dict] = {}
        self.saved = False  # a checkpoint describes partial files on disk

    @property
    def unit(self) -> str:
        """The unit of work a checkpoint records: the conversion into this output."""
        return "conversion to " + os.path.basename(self.output)

    def load(self) -> Optional[dict]:
        raw = self.outputs.progress(self.output, self.path)
        if raw is None:
            return None
        where = self.output if self.outputs.keeps_progress else self.path
        state: dict = {}
        record = read_record(raw, "checkpoint", where, what="resume checkpoint", keep=state,
                             legacy=lambda d: Done(self.unit, d["digest"]))  # previous release
        if not is_done(record, self.unit, self.digest) and not self._written_unchanged(state):
            raise ConversionError(self._mismatch(state), where)
        self.splits = state["splits"]
        self.saved = True
        return state

    def _written_unchanged(self, state: dict) -> bool:
        """Same plan, and each split's written prefix is done by the one rule of "done"
        (:func:`~gluon_data.convert.done.is_done`): its record (the stamps the checkpoint
        took of the files of the items written: size, mtime, inode, ctime) under the digest
        of those files' stamps now. Files of items not yet written may change (a corrupt
        image fixed after the run stopped on it), those already written may not."""
        names = getattr(self.digest, "names", None)
        if names is None or state.get("names") != names or state.get("publishing"):
            return False
        digest = cast(PlanDigest, self.digest)  # it has names: a PlanDigest
        for s, sp in state["splits"].items():
            if not isinstance(sp, dict) or not isinstance(sp.get("stamps"), str):
                return False
            unit = "the first %s items of split %s" % (sp["done"], s)
            if not is_done(Done(unit, sp["stamps"]), unit, digest.prefix(s, sp["done"])):
                return False
        return True

    def _mismatch(self, state: dict) -> str:
        """Why a checkpoint is not this conversion's: other inputs or options, or the same
        plan over source files changed since (named, with their size and times now)."""
        names = getattr(self.digest, "names", None)
        if names is None or state.get("names", state.get("digest")) != names:
            return ("this checkpoint belongs to a conversion with other inputs or options; "
                    "rerun with the same ones, or without --resume")
        if "names" not in state:
            return ("this checkpoint was written by a version that did not record the source "
                    "files' sizes and mtimes, so it cannot tell whether they changed; rerun "
                    "without --resume")
        digest = cast(PlanDigest, self.digest)  # it has names: a PlanDigest
        written = [f for s, sp in state["splits"].items()
                   for f in digest.files_of(s, sp["done"])]
        n, some = changed_files(written or digest.files,
                                int(state.get("planned_ns") or 0))
        return ("the source changed since this checkpoint was written (%s); resuming would "
                "mix records of both states: rerun without --resume to convert the current "
                "files" % ("%d file(s) modified after it: %s" % (n, ", ".join(some)) if n else
                           "a file's size, mtime, inode or ctime differs: rewritten in place "
                           "with its mtime set back, or replaced by a copy"))

    def _prefix(self, split: str, done: int) -> Optional[str]:
        prefix = getattr(self.digest, "prefix", None)
        return None if prefix is None else prefix(split, done)

    def _doc(self, skipped, **extra) -> dict:
        return dict({"done": Done(self.unit, self.digest).doc(),
                     "digest": self.digest, "names": getattr(self.digest, "names", None),
                     "planned_ns": getattr(self.digest, "taken_ns", None),
                     "splits": self.splits, "skipped": skipped}, **extra)

    def save(self, split: str, done: int, writer, stats: "RunningStats", skipped) -> None:
        """Record that ``done`` items of ``split`` are written (``writer`` made durable up
        to there first, so a checkpoint never promises bytes that are not on disk)."""
        self.splits[split] = {"done": done, "stats": stats.state(),
                              "writer": list(writer.sync()),  # buffered records included
                              "stamps": self._prefix(split, done)}
        doc = json.dumps(self._doc(skipped)).encode("utf-8")
        if writer.keeps_progress:  # committed with the records it describes
            try:
                writer.checkpoint(doc)
            except Exception:  # a commit or flush that failed (a full disk): not counted
                raise
            except BaseException:  # an interrupt may land once the commit did: the
                self.saved = self.saved or writer.holds_progress(doc)  # environment says
                raise
            self.saved = True
        else:
            self._write(doc)

    def _write(self, doc: bytes) -> None:
        check_replaceable(self.path, "checkpoint", True)  # never a link, never a user's file
        try:
            write_record(self.path, doc)
            self.saved = True  # on disk from the rename on: an interrupt from here keeps it
        except BaseException:  # an interrupt (Ctrl-C) may land after the rename, before the
            self.saved = self.saved or _holds(self.path, doc)  # flag: the file says
            raise
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def mark_publishing(self) -> None:
        """RecordIO: everything is on disk under partial names; a resume only renames.
        (An LMDB is published by one directory rename, which needs no such record.)"""
        if self.outputs.keeps_progress:
            return
        doc = self._doc(None, publishing=True)
        del doc["skipped"]
        self._write(json.dumps(doc).encode("utf-8"))

    def remove(self) -> None:
        """Delete the checkpoint (only if it is one of ours) and its temporary."""
        self.saved = False
        if os.path.lexists(self.path) and not os.path.islink(self.path) \
                and not is_ours(self.path, "checkpoint"):
            return  # a file of the user's under that name: not ours to delete
        for p in (self.path, self.path + ".partial"):
            try:
                if not os.path.isdir(p) or os.path.islink(p):
                    os.remove(p)
            except FileNotFoundError:
                pass


def resume_finished(state: Optional[dict], ckpt: "Checkpoint", report: ConversionReport,
                    root: str, options: dict) -> Optional[ConversionReport]:
    """With ``resume``: finish a publish that a crash interrupted, or recognise outputs that
    are already complete by the one rule of "done" (:func:`~gluon_data.convert.done.
    why_not_done`: each split's metadata, its checksum intact, holds the done record of this
    plan's digest, naming its ``.rec`` and ``.idx``, which have the recorded sizes and
    SHA-256, read once each); else
    ``None`` (convert as usual). A finished output of this plan that is not provably done
    (damaged since, or written by the previous release, whose metadata records no digests)
    is removed here and redone; one of another plan (other inputs or options, or the source
    changed since) is refused, naming it. ``root`` and ``options`` are in the digest."""
    outputs = report.outputs
    if state is not None and state.get("publishing"):
        ckpt.outputs.complete_publish(outputs)
        ckpt.remove()
    elif state is not None:
        return None
    metas = ckpt.outputs.published_meta(ckpt.output, outputs)
    if metas is None:
        return None
    redo = False
    for split, meta in metas.items():
        path = outputs[split]
        record = record_in(meta, path, lambda d: None, what="done record of the output")
        unit = output_unit(split)
        if record is None and not _made_by(meta, root, options):
            return None  # the previous release's output of another source or options: the
            # conversion then refuses it as any existing output (only --overwrite replaces it)
        if record is not None and (record.unit != unit or record.digest != str(ckpt.digest)):
            _check_unchanged_since(ckpt.digest, path)
            raise ConversionError("this output was made from other inputs or options, or "
                                  "from the source as it was before it changed; rerun with "
                                  "--overwrite to convert the current files", path)
        redo = redo or (why_rec_not_done(meta, record, unit, ckpt.digest, path)
                        if ckpt.outputs.name == "rec"
                        else why_not_done(record, unit, ckpt.digest)) is not None
    if redo:  # ours, of this plan, not provably complete: written again
        for path in dict.fromkeys(outputs.values()):
            ckpt.outputs.discard(path)
        return None
    for split, meta in metas.items():
        report.written[split] = report.resumed[split] = meta["num_records"]  # all there
        report.bytes_written += ckpt.outputs.bytes_on_disk(outputs[split])
    report.skipped[:] = next(iter(metas.values())).get("skipped", [])
    return report


def _made_by(meta: dict, root: str, options: dict) -> bool:
    """Whether metadata that records no done record (the previous release's) says it was
    made from ``root`` with ``options``: only then is it this plan's, to be redone."""
    made = meta.get("created_by") or {}
    return made.get("options") == options and made.get("source") == os.path.abspath(root)


def _check_unchanged_since(digest, output: str) -> None:
    """Refuse to call ``output`` complete when a file of the plan was modified after it was
    written (the files the digest stamped, by their mtime)."""
    data = os.path.join(output, LMDB_DATA) if os.path.isdir(output) else output
    try:
        written = os.stat(data).st_mtime_ns
    except OSError:
        return
    n, some = changed_files(getattr(digest, "files", []), written)
    if n:
        raise ConversionError("the source changed after this output was written (%d file(s) "
                              "modified since: %s); rerun with --overwrite to convert the "
                              "current files" % (n, ", ".join(some)), output)


def import_digest(source: str, layout: str, split: str, count: int, opts: EncodeOptions,
                  options: dict) -> PlanDigest:
    """Identity of a legacy LMDB import: its source (and the stamp of its
    ``data.mdb``), layout, split, record count and options."""
    mdb = os.path.join(source, LMDB_DATA) if os.path.isdir(source) else source
    head = {"source": os.path.abspath(source), "layout": layout, "split": split,
            "count": count, "options": options, "opts": repr(opts)}
    return plan_digest(head, {split: [mdb]})
