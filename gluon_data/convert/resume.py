"""Resume: a conversion's identity (its plan digest) and its checkpoints.

A checkpoint records, per split, how many items are done, the writer's position
(``writer.sync()``) and the running statistics. It lives where the container keeps it
(:attr:`Outputs.keeps_progress`: an LMDB commits it with the records it describes) or in
``OUTPUT.resume.json``, replaced atomically after the partial files were fsynced.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional

from ..documents import load_document
from ..errors import ConversionError, FormatError
from ..fsutil import atomic_write, check_replaceable, fsync_dir, is_ours
from ..sources import Item, Source
from ..stats import RunningStats
from .encode import EncodeOptions
from .outputs import ConversionReport, Outputs

__all__ = []


def _plan_digest(src: Source, plan: Dict[str, List[Item]], opts: EncodeOptions,
                 options: dict) -> str:
    """Identity of a conversion: a checkpoint only resumes the same inputs and options."""
    def rel(p):  # the same source spelled relative or absolute has the same digest
        return None if p is None else os.path.relpath(p, src.root)

    doc = {"source": os.path.abspath(src.root), "layout": src.layout, "options": options,
           "opts": repr(opts), "plan": {s: [(i.name, rel(i.image), rel(i.mask), i.label, i.key)
                                            for i in items] for s, items in plan.items()}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class _Checkpoint:
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

    def load(self) -> Optional[dict]:
        raw = self.outputs.progress(self.output, self.path)
        if raw is None:
            return None
        where = self.output if self.outputs.keeps_progress else self.path
        try:
            state = load_document(raw, "checkpoint", where)
        except FormatError as e:
            raise ConversionError("resume checkpoint is unreadable (%s); rerun without "
                                  "--resume" % e.reason, where) from None
        if state["digest"] != self.digest:
            raise ConversionError("this checkpoint belongs to a conversion with other inputs or "
                                  "options; rerun with the same ones, or without --resume",
                                  where)
        self.splits = state["splits"]
        self.saved = True
        return state

    def _doc(self, skipped, **extra) -> dict:
        return dict({"digest": self.digest, "splits": self.splits, "skipped": skipped}, **extra)

    def save(self, split: str, done: int, writer, stats: "RunningStats", skipped) -> None:
        """Record that ``done`` items of ``split`` are written (``writer`` made durable up
        to there first, so a checkpoint never promises bytes that are not on disk)."""
        self.splits[split] = {"done": done, "stats": stats.state(),
                              "writer": list(writer.sync())}  # buffered records included
        doc = json.dumps(self._doc(skipped)).encode("utf-8")
        if writer.keeps_progress:  # committed with the records it describes
            writer.checkpoint(doc)
            self.saved = True
        else:
            self._write(doc)

    def _write(self, doc: bytes) -> None:
        check_replaceable(self.path, "checkpoint", True)  # never a link, never a user's file
        atomic_write(self.path, doc, sync_dir=False)
        self.saved = True  # on disk from the rename on: an interrupt from here keeps it
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def mark_publishing(self) -> None:
        """RecordIO: everything is on disk under partial names; a resume only renames.
        (An LMDB is published by one directory rename, which needs no such record.)"""
        if self.outputs.keeps_progress:
            return
        self._write(json.dumps({"digest": self.digest, "splits": self.splits,
                                "publishing": True}).encode("utf-8"))

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


def _resume_finished(state, ckpt: "_Checkpoint", report: ConversionReport, root: str,
                     options: dict) -> Optional[ConversionReport]:
    """With ``resume``: finish a publish that a crash interrupted, or recognise outputs that
    are already complete (same source ``root`` and options); else ``None`` (convert as
    usual)."""
    outputs = report.outputs
    if state is not None and state.get("publishing"):
        ckpt.outputs.complete_publish(outputs)
        ckpt.remove()
    elif state is not None:
        return None
    metas = ckpt.outputs.published_meta(ckpt.output, outputs)
    if metas is None:
        return None
    for split, meta in metas.items():
        made = meta.get("created_by", {})
        if made.get("options") != options or made.get("source") != os.path.abspath(root):
            return None
    for split, meta in metas.items():
        report.written[split] = meta["num_records"]
        report.bytes_written += ckpt.outputs.bytes_on_disk(outputs[split])
    report.skipped[:] = next(iter(metas.values())).get("skipped", [])
    return report


def _import_digest(source: str, layout: str, split: str, count: int, opts: EncodeOptions,
                   options: dict) -> str:
    """Identity of a legacy LMDB import: its source (and the stamp of its ``data.mdb``),
    layout, split, record count and options."""
    mdb = os.path.join(source, "data.mdb") if os.path.isdir(source) else source
    try:
        st = os.stat(mdb)
        stamp = [st.st_size, st.st_mtime_ns]
    except OSError:
        stamp = None
    doc = {"source": os.path.abspath(source), "layout": layout, "split": split,
           "count": count, "stamp": stamp, "options": options, "opts": repr(opts)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
