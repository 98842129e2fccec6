"""Writing a ``.rec``/``.idx`` pair: :class:`RecordWriter`, the same bytes as
``mx.recordio.MXIndexedRecordIO`` under temporary names, published by rename only when
complete (with the binary index beside it).

Records come one at a time (:meth:`RecordWriter.write`) or as *segments*: files of framed
records that conversion workers write beside the output (:meth:`RecordWriter.segment_path`)
and the writer appends by a kernel copy (:meth:`RecordWriter.append_segment`), so the
process that orders the records does not handle their bytes (except to renumber the records
that follow a skipped item). It need not copy them either: :meth:`RecordWriter.reserve_segment`
indexes the records and gives the offset their bytes go to, and a worker copies them there
(:func:`~gluon_data.storage.rangecopy.copy_segment`)."""
from __future__ import annotations

import os
import shutil
from typing import List, Optional, Sequence, Set, Tuple

from ..format import codec
from ..errors import FormatError, OutputError
from ..storage.fsutil import fsync_dir, open_new
from ..storage.rangecopy import copy_runs, copy_segment, pwrite_all
from ..format.ownership import KINDS, check_replaceable, is_ours
from ..format.layout import SEGMENT_SUFFIX
from ..format.meta import dumps_meta, meta_path
from ..format.recindex import BINARY_INDEX_SUFFIX, idx_path_for, read_index, write_binary_index

__all__ = ["RecordWriter", "copy_segment", "segment_file", "remove_segments"]


#: How a partial file a killed writer left may begin, besides as its kind's own output:
#: a torn metadata document as every one does; any of them with a hole (a ``.rec``'s place
#: reserved for a worker's copy of its records, not filled yet; blocks a crash of the
#: system left unwritten).
_LEFTOVER_HEADS = {"meta": (dumps_meta({})[:4], bytes(4)), "rec": (bytes(4),),
                   "idx": (bytes(4),)}


def _check_leftover(path: str, kind: str) -> None:
    """Refuse a regular file at ``path``, a partial file's name, that is not a partial file
    of ``kind`` a writer left (empty, :func:`~gluon_data.format.ownership.is_ours`, or
    beginning as :data:`_LEFTOVER_HEADS` says); a link or another file type is refused when
    opened (``open_new``)."""
    if not os.path.isfile(path) or os.path.islink(path) or not os.path.getsize(path):
        return
    with open(path, "rb") as f:
        if f.read(4) in _LEFTOVER_HEADS[kind]:
            return
    if not is_ours(path, kind):
        raise OutputError("is in the way of a partial file gluon-data writes, and is not one "
                          "(not %s); it was left untouched: move it away or remove it"
                          % KINDS[kind], path)


class RecordWriter:
    """Write a ``.rec``/``.idx`` pair (plus optional metadata) atomically.

    Records go to ``NAME.partial`` files; :meth:`finish` flushes them to disk and
    :meth:`publish` renames them to their final names, metadata last. Until then nothing
    exists under the final names; :meth:`abort` removes the partial files. The bytes are
    identical to ``mx.recordio.MXIndexedRecordIO(idx, rec, 'w').write_idx(key, payload)``.

    Examples
    --------
    >>> with RecordWriter("out.rec", overwrite=True) as w:
    ...     offset = w.write(0, codec.pack_classification(1.0, b"image bytes"))
    ...     w.finish()                 # or w.finish(meta): the .meta.json document
    ...     w.publish()
    >>> from gluon_data.stores.recordio import RecordFile
    >>> len(RecordFile("out.rec")), codec.unpack(RecordFile("out.rec").read(0)).image
    (1, b'image bytes')
    """

    PARTIAL = ".partial"

    def __init__(self, path: str, idx_path: Optional[str] = None, *, overwrite: bool = False,
                 resume: Optional[Tuple[int, int, int]] = None):
        """``resume=(rec_bytes, idx_bytes, count)`` continues partial files from a checkpoint
        taken with :meth:`sync`: they are cut back to those sizes and appended to."""
        self.path = os.fspath(path)
        self.idx_path = os.fspath(idx_path) if idx_path else idx_path_for(self.path)
        self.meta_path = meta_path(self.path)
        self._finals = [self.path, self.idx_path, self.meta_path]
        # Only our own outputs may be replaced, and only with overwrite (fsutil's rule).
        # Sidecars without their .rec and .idx (left by a crash) are replaced when ours.
        data_exists = any(os.path.lexists(p) for p in self._finals[:2])
        for p, kind in ((self.path, "rec"), (self.idx_path, "idx"), (self.meta_path, "meta"),
                        (self.idx_path + BINARY_INDEX_SUFFIX, "gdx")):
            check_replaceable(p, kind, overwrite or (kind in ("meta", "gdx")
                                                     and not data_exists))
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._tmp = [p + self.PARTIAL for p in self._finals]
        if resume is None:  # a crashed run's partial files are replaced, nothing else
            for p, kind in zip(self._tmp, ("rec", "idx", "meta")):
                _check_leftover(p, kind)
        self._segments = self._tmp[0] + ".segments"
        remove_segments(self._segments)  # a crashed run's
        self._keys: Set[int] = set()
        if resume is None:
            self._rec = open_new(self._tmp[0], "wb")
            self._idx = open_new(self._tmp[1], "w", encoding="ascii", newline="\n")
            self._pos, self._idx_bytes, self.count = 0, 0, 0
        else:
            rec_bytes, idx_bytes, count = resume
            for p, n in ((self._tmp[0], rec_bytes), (self._tmp[1], idx_bytes)):
                if os.path.islink(p) or (os.path.exists(p) and not os.path.isfile(p)):
                    raise OutputError("cannot resume: the partial file is not a regular file "
                                      "(a link?); rerun without --resume", p)
                have = os.path.getsize(p) if os.path.exists(p) else -1
                if have < n:
                    raise FormatError("cannot resume: %s has %d bytes, its checkpoint promises "
                                      "%d; rerun without --resume" % (p, have, n), p)
                os.truncate(p, n)  # drop whatever was written after the checkpoint
            self._rec = open(self._tmp[0], "r+b")  # not "ab": records go by offset
            self._idx = open(self._tmp[1], "a", encoding="ascii", newline="\n")
            self._pos, self._idx_bytes, self.count = rec_bytes, idx_bytes, count
            if count:
                self._keys.update(int(k) for k in read_index(self._tmp[1], binary=False)[0])
        self._state = "open"

    def write(self, key: int, payload: bytes) -> int:
        """Append one record under integer ``key``; return its offset."""
        if self._state != "open":
            raise RuntimeError("RecordWriter is %s" % self._state)
        key = int(key)
        if key in self._keys:  # readers refuse an index with a duplicate key
            raise FormatError("record key %d is used twice: every record needs its own key"
                              % key, self.path, key)
        self._keys.add(key)
        data = b"".join(codec.frame(payload))
        offset = self._pos
        pwrite_all(self._rec.fileno(), data, offset)
        line = "%d\t%d\n" % (key, offset)
        self._idx.write(line)
        self._pos += len(data)
        self._idx_bytes += len(line)
        self.count += 1
        return offset

    takes_segments = True  # conversion workers may write segments (see the module's doc)

    def segment_path(self, n: int) -> str:
        """Where segment ``n`` of this output is written: a file in a folder beside the
        partial ``.rec`` (same filesystem, so the append is a kernel copy), removed with the
        partial files."""
        return segment_file(self._segments, "%08d" % n)

    def append_segment(self, fd: int, offset: int, entries: Sequence[Tuple[int, int]]) -> None:
        """Append records already framed (:func:`~gluon_data.format.codec.frame`): the
        ``sum(nbytes)`` bytes of open file ``fd`` from ``offset``, one record per ``(key,
        nbytes)`` of ``entries`` in order, copied by the kernel
        (``os.copy_file_range``; a read and write where it is missing). The same bytes and
        index as :meth:`write` of each record."""
        start = self.reserve_segment(entries)
        self.fill(fd, [(offset, self._pos - start, start)])

    def fill(self, fd: int, runs: Sequence[Tuple[int, int, int]]) -> None:
        """Copy runs ``(offset, nbytes, dest_offset)`` of open file ``fd`` into the places
        :meth:`reserve_segment` gave (what :func:`copy_segment` does in another process)."""
        copy_runs(fd, self._rec.fileno(), runs, self.path)

    def reserve_segment(self, entries: Sequence[Tuple[int, int]]) -> int:
        """Index records already framed, one per ``(key, nbytes)`` of ``entries`` in order,
        as :meth:`append_segment` does, without their bytes: returns the offset in
        :attr:`partial_path` where those ``sum(nbytes)`` bytes go. Whoever holds them copies
        them there (:func:`copy_segment`) before the writer is synced or finished."""
        if self._state != "open":
            raise RuntimeError("RecordWriter is %s" % self._state)
        lines: List[str] = []
        start = pos = self._pos
        for key, nbytes in entries:
            key = int(key)
            if key in self._keys:
                raise FormatError("record key %d is used twice: every record needs its own "
                                  "key" % key, self.path, key)
            self._keys.add(key)
            lines.append("%d\t%d\n" % (key, pos))
            pos += nbytes
        text = "".join(lines)
        self._idx.write(text)
        self._pos = pos
        self._idx_bytes += len(text)
        self.count += len(lines)
        return start

    @property
    def partial_path(self) -> str:
        """The ``.rec`` being written (its final name + :attr:`PARTIAL`)."""
        return self._tmp[0]

    @property
    def partial_files(self) -> Tuple[str, str]:
        """The ``.rec`` and ``.idx`` being written, under their partial names."""
        return self._tmp[0], self._tmp[1]

    keeps_progress = False  # a conversion's checkpoint goes to a file beside the output

    def flush(self) -> None:
        """Hand everything written so far to the operating system (the ``.idx`` is buffered
        here): the partial files then read as they will be published. :meth:`sync` also
        makes them durable."""
        for f in (self._rec, self._idx):
            f.flush()

    def sync(self) -> Tuple[int, int, int]:
        """Make everything written so far durable; return ``(rec_bytes, idx_bytes, count)``,
        the argument ``resume`` takes to continue from exactly here."""
        self.flush()
        for f in (self._rec, self._idx):
            os.fsync(f.fileno())
        return self._pos, self._idx_bytes, self.count

    @property
    def bytes_written(self) -> int:
        return self._pos

    def finish(self, meta: Optional[dict] = None) -> None:
        """Flush everything to stable storage under the partial names."""
        for f in (self._rec, self._idx):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        remove_segments(self._segments)
        if meta is not None:
            # Not fsutil.atomic_write: the .rec, .idx and metadata are published together
            # (complete_publish renames all three, metadata last, and finishes a publish a
            # crash interrupted), so each is only written and fsynced under its partial name.
            with open_new(self._tmp[2], "wb") as f:
                f.write(dumps_meta(meta))
                f.flush()
                os.fsync(f.fileno())
        self._has_meta = meta is not None
        self._state = "finished"

    def publish(self) -> None:
        """Rename the partial files to their final names (metadata last)."""
        if self._state != "finished":
            raise RuntimeError("call finish() before publish()")
        self.complete_publish(self.path, self.idx_path)
        self._state = "published"

    @classmethod
    def complete_publish(cls, path: str, idx_path: Optional[str] = None) -> None:
        """Rename whatever partial files of ``path`` remain (also after a crash mid-publish)."""
        idx_path = idx_path or idx_path_for(path)
        finals = [path, idx_path, meta_path(path)]
        tmps = [p + cls.PARTIAL for p in finals]
        if os.path.exists(tmps[0]) or os.path.exists(tmps[1]):
            for stale in (finals[2], idx_path + BINARY_INDEX_SUFFIX):
                if os.path.lexists(stale):  # a stale sidecar must never describe new data
                    os.remove(stale)  # (checked as ours, or a link, by the writer)
        for tmp, final in zip(tmps, finals):  # one directory fsync for the three renames
            if os.path.exists(tmp):
                os.replace(tmp, final)
        if os.path.exists(idx_path) and not os.path.exists(idx_path + BINARY_INDEX_SUFFIX):
            try:
                write_binary_index(idx_path, lock_held=True)  # (the conversion's lock)
            except (OSError, FormatError):  # an optimisation only: the .idx is what counts
                pass
        fsync_dir(os.path.dirname(os.path.abspath(path)))

    def suspend(self) -> None:
        """Close the partial files and keep them (a checkpoint describes a prefix of them:
        ``resume`` cuts them back to it)."""
        for f in (self._rec, self._idx):
            try:
                f.close()
            except OSError:  # a full disk fails the last flush: the checkpoint predates it
                pass
        remove_segments(self._segments)
        self._state = "suspended"

    def abort(self) -> None:
        """Close and delete the partial files; the final names are untouched."""
        for f in (self._rec, self._idx):
            try:
                f.close()
            except OSError:
                pass
        for p in self._tmp:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass
        remove_segments(self._segments)
        self._state = "aborted"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self._state in ("open", "finished"):
            self.abort()
        return False


def segment_file(folder: str, stem: str) -> str:
    """The path of segment ``stem`` in a writer's segment ``folder``, made on first use."""
    if not os.path.isdir(folder):
        os.mkdir(folder)
    return os.path.join(folder, stem + SEGMENT_SUFFIX)


def remove_segments(folder: str) -> None:
    """Remove a writer's segment folder, only if it is ours (a directory holding nothing but
    segment files: the one rule of :func:`~gluon_data.format.ownership.check_replaceable`);
    anything else there is an :class:`OutputError`, and is left untouched."""
    check_replaceable(folder, "segments", True)
    if os.path.lexists(folder):
        shutil.rmtree(folder)
