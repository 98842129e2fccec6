"""What a conversion writes: output names and containers, option checks,
metadata, output locks and the clean-up of a failed run. The loop, copies, planning, resume
and shard tasks import from here; it imports only ``done``, ``encode`` and ``sources`` of the
conversion package, which sit below it.

Each container is one :class:`Outputs` object: the driver and the copy code open, resume,
checkpoint and publish writers through it, and the writers share one interface
(``write(key, payload)``, ``count``, ``bytes_written``, ``sync()``, ``keeps_progress``,
``checkpoint(progress)`` and ``holds_progress(progress)`` where ``keeps_progress``,
``finish(meta)``, ``publish()``,
``suspend()``, ``abort()``), so nothing above branches on the container.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
from typing import Any, Callable, Dict, List, Optional, Sequence, cast

import lmdb
import numpy as np

from .._version import __version__
from ..errors import ConversionError, EmptyOutputError, GluonDataError, mark_interrupt
from ..storage.fileio import read_input
from ..storage.fsutil import OutputLock
from ..stores.lmdbio import LMDBWriter, is_lmdb, names_lmdb, read_lmdb_meta
from ..format.meta import FORMAT_NAME, FORMAT_VERSION, meta_path, read_meta
from ..format.ownership import check_replaceable
from ..format.recindex import BINARY_INDEX_SUFFIX, idx_path_for
from ..format.plan import conversion_id
from ..stores.recordio import RecordWriter
from ..stores.shards import is_manifest
from .sources import Item, Source, voc_palette
from ..tools.stats import RunningStats
from .encode import EncodeOptions
from .done import Done, file_facts
from .report import ConversionReport  # noqa: F401  (its home before report.py)

__all__ = ["done_record", "ConversionReport", "ENCODINGS", "FORMATS", "Outputs", "outputs_for", "output_format",
           "output_paths", "open_writers", "output_lock", "fail_conversion", "check_options",
           "check_output", "check_choices", "split_metadata", "split_fields", "writer_conversion_id"]

ENCODINGS = ("passthrough", "jpg", "png", "raw")


FORMATS = ("rec", "lmdb")


class Outputs:
    """The outputs of one container (``'rec'`` or ``'lmdb'``): names, writers, where a
    checkpoint lives and how a finished dataset is recognised. Use :func:`outputs_for`.

    >>> outputs_for("data.lmdb").paths("data.lmdb", ["train", "val"])
    {'train': 'data.lmdb', 'val': 'data.lmdb'}
    """

    name = ""
    keeps_progress = False  # the checkpoint is inside the partial output (else a file)

    def paths(self, output: str, splits: Sequence[str]) -> Dict[str, str]:
        """The final path of each split."""
        raise NotImplementedError

    def open(self, output: str, splits: Sequence[str], overwrite: bool,
             positions: Optional[Dict[str, Optional[list]]] = None) -> Dict[str, Any]:
        """One writer per split; ``positions`` (a split's ``sync()`` from a checkpoint, or
        None for a split not started) continues an interrupted run. Nothing is visible
        under a final name before ``publish``."""
        raise NotImplementedError

    def progress(self, output: str, path: str) -> Optional[bytes]:
        """The checkpoint document of an interrupted run (``path``: the checkpoint file
        where the container keeps none itself), or None."""
        try:
            return read_input(path)  # (a FIFO there is refused, never waited on)
        except FileNotFoundError:
            return None

    def complete_publish(self, paths: Dict[str, str]) -> None:
        """Finish a publish that a crash interrupted."""

    def published_meta(self, output: str, paths: Dict[str, str]) -> Optional[Dict[str, dict]]:
        """Metadata of every split already published under ``paths``, or None where one is
        missing or unreadable."""
        raise NotImplementedError

    def check_discard(self, path: str) -> None:
        """Raise :class:`~gluon_data.errors.OutputError` unless every file of the output at
        ``path`` that exists is ours (what :meth:`discard` checks first)."""
        raise NotImplementedError

    def discard(self, path: str) -> None:
        """Remove the published output ``path`` (only what is ours: a file that is not is
        refused with :class:`~gluon_data.errors.OutputError`, never removed), to be redone."""
        raise NotImplementedError

    def bytes_on_disk(self, path: str) -> int:
        return 0

    def copy_meta(self, meta: dict, keys: List[int]) -> dict:
        """Metadata of a copied split whose records have ``keys``."""
        return meta


class _RecordIOOutputs(Outputs):
    name = "rec"

    def paths(self, output, splits):
        if len(splits) == 1:
            return {s: output for s in splits}
        stem, ext = os.path.splitext(output)
        return {s: "%s_%s%s" % (stem, s, ext or ".rec") for s in splits}

    def open(self, output, splits, overwrite, positions=None):
        writers = {}
        try:
            for s, path in self.paths(os.fspath(output), list(splits)).items():
                # refuse to overwrite before any work is done
                pos = (positions or {}).get(s)
                writers[s] = RecordWriter(path, overwrite=overwrite or positions is not None,
                                          resume=tuple(pos) if pos is not None else None)
        except BaseException:
            for w in writers.values():
                w.abort()
            raise
        return writers

    def complete_publish(self, paths):
        for path in paths.values():
            RecordWriter.complete_publish(path)

    def published_meta(self, output, paths):
        metas = {}
        for split, path in paths.items():
            try:
                meta = read_meta(path)
            except GluonDataError:
                return None
            if meta is None or not os.path.exists(path):
                return None
            metas[split] = meta
        return metas

    def bytes_on_disk(self, path):
        return os.path.getsize(path)

    @staticmethod
    def _files(path):
        idx = idx_path_for(path)
        return ((path, "rec"), (idx, "idx"), (meta_path(path), "meta"),
                (idx + BINARY_INDEX_SUFFIX, "gdx"))

    def check_discard(self, path):
        for p, kind in self._files(path):
            check_replaceable(p, kind, True)

    def discard(self, path):
        self.check_discard(path)
        for p, _ in self._files(path):
            if os.path.lexists(p):
                os.remove(p)


class _LMDBOutputs(Outputs):
    name = "lmdb"
    keeps_progress = True

    def paths(self, output, splits):
        return {s: output for s in splits}

    def open(self, output, splits, overwrite, positions=None):
        env = LMDBWriter(os.fspath(output), overwrite=overwrite or positions is not None,
                         resume=positions is not None)
        return {s: env.split(s, tuple((positions or {}).get(s) or (0, 0))
                             if positions is not None else None) for s in splits}

    def progress(self, output, path):
        return LMDBWriter.read_progress(output)

    def published_meta(self, output, paths):
        try:
            metas = read_lmdb_meta(output) if is_lmdb(output) else None
        except GluonDataError:
            return None
        if metas is None or any(metas.get(s) is None for s in paths):
            return None
        return {s: metas[s] for s in paths}

    def check_discard(self, path):
        check_replaceable(path, "lmdb", True)

    def discard(self, path):
        self.check_discard(path)
        if os.path.lexists(path):
            shutil.rmtree(path)

    def copy_meta(self, meta, keys):
        if keys != list(range(len(keys))):  # non-dense .idx keys: the LMDB keys are positions
            meta = dict(meta, record_keys=keys)
        return meta


_OUTPUTS = {o.name: o for o in (_RecordIOOutputs(), _LMDBOutputs())}


def output_format(output: str, fmt: Optional[str] = None) -> str:
    """``fmt``, else ``lmdb`` for a ``.lmdb`` output, ``rec`` otherwise (``x.LMDB``: refused)."""
    ext = os.path.splitext(os.fspath(output).rstrip("/"))[1]
    if fmt is None and ext.lower() in (".lmdb", ".rec") and ext not in (".lmdb", ".rec"):
        raise ValueError("output %s: its suffix chooses the container and is read in lower "
                         "case only: name it %s, or pass --format" % (output, ext.lower()))
    if fmt is None:
        fmt = "lmdb" if names_lmdb(output) else "rec"
    if fmt not in FORMATS:
        raise ValueError("unknown format %r; valid: %s" % (fmt, ", ".join(FORMATS)))
    return fmt


def outputs_for(output: str, fmt: Optional[str] = None) -> Outputs:
    """The :class:`Outputs` of container ``fmt`` (default: from the output's name)."""
    return _OUTPUTS[output_format(output, fmt)]


def output_paths(output: str, splits: Sequence[str], fmt: str = "rec") -> Dict[str, str]:
    """RecordIO: one split is ``output`` itself, several ``NAME_<split>.rec`` beside it.
    LMDB: every split lives in the one ``output`` environment."""
    return _OUTPUTS[output_format(output, fmt)].paths(output, list(splits))


def open_writers(output: str, splits: Sequence[str], fmt: str, overwrite: bool):
    """``(paths, writers)``: one writer per split with the shared writer interface; nothing
    visible until publish."""
    out = _OUTPUTS[output_format(output, fmt)]
    return out.paths(os.fspath(output), list(splits)), out.open(output, list(splits), overwrite)


def _free_space(path: str) -> str:
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
        return "%d bytes free" % (st.f_bavail * st.f_frsize)
    except OSError:
        return "free space unknown"


def output_lock(output: str, splits: Sequence[str], fmt: str) -> OutputLock:
    """Hold the exclusive lock of every path a conversion to ``output`` writes (the output
    itself names the checkpoint); a second conversion to any of them fails at once."""
    paths = output_paths(os.fspath(output), list(splits), fmt)
    return OutputLock([os.fspath(output)] + list(paths.values())).acquire()


def fail_conversion(exc: BaseException, writers: Any, output: str,
                    ckpt: Any = None) -> None:
    """Clean up after a failed or interrupted conversion, then re-raise (an I/O or LMDB
    error as one :class:`ConversionError` naming the output).

    Where a checkpoint was taken (``ckpt.saved``), the partial files and the checkpoint are
    kept, closed, for ``--resume`` to continue from, unless the plan itself cannot be
    finished (:class:`~gluon_data.errors.EmptyOutputError`: a resume would end the same);
    otherwise every partial output and any checkpoint file is removed, so nothing that
    ``--resume`` would refuse stays behind.
    """
    keep = ckpt is not None and ckpt.saved and not isinstance(exc, EmptyOutputError)
    for w in writers.values():
        if w._state in ("open", "finished"):
            if keep:
                w.suspend()
            else:
                w.abort()
    if ckpt is not None and not keep:
        ckpt.remove()
    if isinstance(exc, KeyboardInterrupt) and ckpt is not None:
        mark_interrupt(exc, keep)
    hint = ("; the partial output and its checkpoint are kept: rerun the same command with "
            "--resume to continue" if keep else "")
    if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # (measured after the cleanup above)
            reason += " (%s%s)" % (_free_space(output), "" if keep else
                                   " once the partial files were removed")
        raise ConversionError("writing failed: %s%s" % (reason, hint),
                              getattr(exc, "filename", None) or output) from exc
    if isinstance(exc, lmdb.Error):  # LMDB reports a full disk as EIO or ENOSPC
        raise ConversionError("writing the LMDB environment failed: %s (the disk may be full: "
                              "%s)%s" % (exc, _free_space(output), hint), output) from exc
    if isinstance(exc, ConversionError) and hint:
        raise ConversionError(exc.reason + hint, exc.path, exc.key, exc.offset) from None
    raise exc


def _check_range(name: str, value, lo, hi=None, what: str = "") -> None:
    number = isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, bool)
    ok = number and math.isfinite(value) and value >= lo and (hi is None or value <= hi)
    if not ok:
        raise ValueError("%s (--%s) must be %s%s, got %r"
                         % (name, name.replace("_", "-"), "" if number else "a number, ",
                            what or ("%s..%s" % (lo, hi) if hi is not None else ">= %s" % lo),
                            value))


def check_options(*, quality=95, resize=0, workers=1, max_pixels=1, max_file_bytes=1,
                  checkpoint_every=1, ignore_label=255, num_classes=None,
                  scheduler_wait=0.0) -> None:
    """Refuse option values that cannot work, before anything is read or written."""
    _check_range("quality", quality, 0, 100, "a JPEG quality 0..100")
    _check_range("resize", resize, 0, what="0 (keep the size) or a positive short side")
    _check_range("workers", workers, 1)
    _check_range("max_pixels", max_pixels, 1)
    _check_range("max_file_bytes", max_file_bytes, 1)
    if checkpoint_every is not None:  # None: by time and bytes
        _check_range("checkpoint_every", checkpoint_every, 1)
    _check_range("ignore_label", ignore_label, 0, 65535, "a mask value 0..65535")
    if num_classes is not None:
        _check_range("num_classes", num_classes, 1)
    _check_range("scheduler_wait", scheduler_wait, 0, what="0 (no limit) or seconds")


def check_output(output: str, fmt: str) -> str:
    """Refuse an output that cannot be written (empty name, a directory where a ``.rec``
    goes, a file where an LMDB directory goes, a missing or read-only folder) with one
    clear error, before any work is done."""
    output = os.fspath(output)
    if not output or not output.strip() or not os.path.basename(output.rstrip("/")):
        raise ValueError("output name is empty: give a file name (e.g. data.rec or data.lmdb)")
    if is_manifest(output):  # (a .rec under that name: a "manifest" nothing can open)
        raise ValueError("output %s names a shard manifest, which only a sharded conversion "
                         "writes: add --shards, --shard-size or --shard-items (shards=...), or "
                         "name the output .rec or .lmdb" % output)
    if fmt == "rec" and os.path.isdir(output):
        raise ConversionError("output is a directory; a .rec output is a file name (for an "
                              "LMDB directory use a .lmdb name or --format lmdb)", output)
    if fmt == "lmdb" and os.path.exists(output) and not os.path.isdir(output):
        raise ConversionError("output exists and is not a directory; an LMDB output is a "
                              "directory", output)
    parent = os.path.dirname(os.path.abspath(output.rstrip("/") or output))
    probe = parent
    while not os.path.exists(probe):  # the writers create missing folders
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConversionError("cannot create the output folder: %s is not a directory"
                              % probe, output)
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            os.statvfs(probe)
            ro = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):
            ro = False
        raise ConversionError("cannot write to the output folder %s: %s"
                              % (probe, os.strerror(errno.EROFS) if ro else "permission denied"),
                              output)
    return output


def check_choices(encoding: str, on_error: str) -> None:
    if encoding not in ENCODINGS:
        raise ValueError("unknown encoding %r; valid: %s" % (encoding, ", ".join(ENCODINGS)))
    if on_error not in ("fail", "skip"):
        raise ValueError("on_error must be 'fail' or 'skip', got %r" % (on_error,))


def split_metadata(src: Source, split: str, count: int, st: RunningStats, opts: EncodeOptions,
                   classes, num_classes, skipped, options) -> dict:
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "task": src.task,
        "split": split,
        "num_records": count,
        "checksum": "crc32-id2",
        # every stored image decoded strictly by the decoder of record here, or encoded here
        "images_checked": "strict",
        "image_encoding": opts.encoding,
        "image_size": st.image_size(),
        "created_by": {"tool": "gluon_data %s" % __version__, "layout": src.layout,
                       "source": os.path.abspath(src.root), "options": options},
        "skipped": list(skipped),
        "image_stats": st.mean_std(),
    }
    if src.task == "segmentation":
        present = sorted(st.class_pixels)
        if num_classes is None:
            real = [i for i in present if i != opts.ignore_label]
            num_classes = (max(real) + 1) if real else 1
        if classes is None:
            classes = ["class_%d" % i for i in range(num_classes)]
        pal = st.palette
        palette = (src.palette if src.palette else
                   [pal[3 * i:3 * i + 3] for i in range(min(len(pal) // 3, 256))] if pal
                   else voc_palette(256))
        meta.update({
            "classes": list(classes), "num_classes": num_classes,
            "ignore_label": opts.ignore_label,
            "mask_encoding": "raw" if opts.encoding == "raw" else opts.mask_encoding,
            "palette": palette,
            "class_pixels": {str(k): v for k, v in sorted(st.class_pixels.items())},
            "class_images": {str(k): v for k, v in sorted(st.class_images.items())},
            "class_image_pixels": {str(k): v for k, v in
                                   sorted(st.class_image_pixels.items())},
            "pred_offset": src.pred_offset,
        })
    else:
        meta.update({"classes": list(classes) if classes is not None else None,
                     "num_classes": len(classes) if classes is not None else None})
    return meta


def split_fields(src: Source, split: str, digest: str, writer: Any, st: "RunningStats",
                 items: Sequence[Item]) -> dict:
    """Metadata fields of a split as written: its ``conversion_id``, and for segmentation
    the ``item_names`` (gluoncv's mode='test' returns them) and ``masks: false`` when no
    item has a mask (e.g. VOC test)."""
    out: Dict[str, Any] = {"conversion_id": writer_conversion_id(digest, split, writer, st)}
    if src.task == "segmentation":
        out["item_names"] = list(st.names)
        if all(i.mask is None for i in items):
            out["masks"] = False  # images only: mode='test'
    return out


def writer_conversion_id(digest: str, split: str, writer: Any, st: "RunningStats") -> str:
    """:func:`gluon_data.format.plan.conversion_id` of what ``writer`` wrote."""
    return conversion_id(digest, split, writer.count, writer.bytes_written, st.state())


def done_record(unit: str, digest: str, writer: Any,
                facts: Callable[[str], Optional[dict]] = file_facts) -> dict:
    """The done record (:mod:`gluon_data.convert.done`) of what ``writer`` wrote, taken
    before its ``finish``: a RecordIO output's ``.rec`` and ``.idx`` (named by their
    suffixes, so equal conversions write equal metadata under any name) with their sizes
    and SHA-256 (made durable, then read once: by ``facts``, which may be digests a
    conversion's workers took); an LMDB split's none (the environment's integrity is its own
    transactions)."""
    idx = getattr(writer, "idx_path", None)
    files: Dict[str, dict] = {}
    if idx is not None:
        writer.sync()
        for suffix, final in ((".rec", writer.path), (".idx", idx)):  # synced: both present
            files[suffix] = cast(dict, facts(final + RecordWriter.PARTIAL))
    return Done(unit, str(digest), files).doc()
