"""Writing an LMDB dataset (the layout of :mod:`gluon_data.stores.lmdbio`): :class:`LMDBWriter`
builds the environment in ``NAME.lmdb.partial``, growing its map as needed, and publishes it
under the final name atomically; :class:`_SplitWriter` is the RecordWriter of one split.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import List, Optional, Tuple

import lmdb

from ..errors import OutputError
from ..format import codec
from ..storage.fileio import require_regular
from ..storage.fsutil import LMDB_DATA, LMDB_LOCK, exchange_dirs, fsync_dir, remove_partial_dir
from ..format.ownership import check_replaceable
from .lmdb_pages import MAX_DBS, META_DB, record_key
from ..format.meta import dumps_meta
from .recwriter import remove_segments, segment_file

__all__ = ["LMDBWriter"]


class LMDBWriter:
    """Write one LMDB dataset (several splits) atomically, growing the map as needed.

    Records are buffered and committed every ``commit_every`` puts. When the map is full
    the transaction is aborted, the map doubled and the *whole* batch replayed, so no put
    is lost. The environment is built in ``NAME.lmdb.partial`` and renamed on
    :meth:`publish`.
    """

    PARTIAL = ".partial"
    PROGRESS_DB = b"__progress__"

    def __init__(self, path: str, *, overwrite: bool = False, map_size: int = 64 << 20,
                 commit_every: int = 256, resume: bool = False):
        self.path = os.fspath(path).rstrip("/")
        check_replaceable(self.path, "lmdb", overwrite)  # only our own LMDB, never a link
        self.tmp = self.path + self.PARTIAL
        if not resume:
            remove_partial_dir(self.tmp)
        elif os.path.lexists(self.tmp) and (os.path.islink(self.tmp)
                                            or not os.path.isdir(self.tmp)):
            raise OutputError("cannot resume: the partial LMDB environment is not a directory "
                              "(a link?); rerun without --resume", self.tmp)
        os.makedirs(self.tmp, exist_ok=True)
        self.segments = self.path + ".segments" + self.PARTIAL  # of conversion workers
        remove_segments(self.segments)  # a crashed run's
        self.env = lmdb.open(self.tmp, map_size=map_size, max_dbs=MAX_DBS, subdir=True,
                             sync=False, metasync=False, writemap=False)
        self.env.set_mapsize(max(map_size, self.env.info()["map_size"]))
        self.commit_every = commit_every
        self.grows = 0
        self._state = "open"
        self._dirs_synced = False

    def split(self, name: str, resume: Optional[Tuple[int, int]] = None) -> "_SplitWriter":
        """A writer for split ``name``; ``resume=(count, bytes)`` continues a checkpoint."""
        if name == META_DB.decode() or not name:
            raise ValueError("invalid split name %r" % name)
        return _SplitWriter(self, name, resume)

    @classmethod
    def read_progress(cls, path: str) -> Optional[bytes]:
        """The progress document of an interrupted write of ``path``, if there is one."""
        tmp = os.fspath(path).rstrip("/") + cls.PARTIAL
        # the one input rule: a FIFO there is refused, named (never opened by LMDB, nor
        # taken for "no checkpoint" and removed by a fresh start)
        if require_regular(os.path.join(tmp, LMDB_DATA)) is None:
            return None
        env = lmdb.open(tmp, readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
        try:
            return _progress(env, cls.PROGRESS_DB)
        finally:
            env.close()

    def flush_to_disk(self) -> None:
        """Make what is committed durable: the environment is written without a sync per
        commit, so a checkpoint flushes it (and, the first time, the partial directory's
        entry and its own), as a RecordIO checkpoint fsyncs its files."""
        self.env.sync(True)
        if not self._dirs_synced:
            fsync_dir(self.tmp)
            fsync_dir(os.path.dirname(os.path.abspath(self.tmp)))
            self._dirs_synced = True

    def committed_progress(self) -> Optional[bytes]:
        """The progress document this writer's environment holds committed (None: none)."""
        return _progress(self.env, self.PROGRESS_DB)

    def _commit(self, db, batch, progress: Optional[bytes] = None) -> None:
        """Put ``batch`` (and the progress document) in one transaction; on a full map, grow
        it and replay the whole batch, so nothing is lost and nothing is half-written."""
        pdb = self.env.open_db(self.PROGRESS_DB) if progress is not None else None
        while True:
            try:
                with self.env.begin(write=True, db=db) as txn:
                    # one call for the batch: the same puts in the same order as one
                    # put each (so the same file), without a Python call per record
                    txn.cursor(db=db).putmulti(batch)
                    if pdb is not None and progress is not None:  # (pdb: progress given)
                        txn.put(b"state", progress, db=pdb)
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
                self.grows += 1

    def put_meta(self, split: str, meta: dict) -> None:
        self._commit(self.env.open_db(META_DB), [(split.encode(), dumps_meta(meta))])

    def publish(self) -> None:
        if self._state == "published":
            return
        with self.env.begin(write=True) as txn:  # resume bookkeeping does not ship
            try:
                txn.drop(self.env.open_db(self.PROGRESS_DB, txn=txn), delete=True)
            except lmdb.NotFoundError:
                pass
        self.env.sync(True)
        self.env.close()
        remove_segments(self.segments)
        try:  # readers run lock-free; a published dataset is just data.mdb
            os.remove(os.path.join(self.tmp, LMDB_LOCK))
        except FileNotFoundError:
            pass
        self._replace_final()
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._state = "published"

    def suspend(self) -> None:
        """Close the partial environment and keep it: its committed progress document says
        where a resume continues."""
        if self._state in ("published", "aborted", "suspended"):
            return
        try:
            self.env.close()
        except lmdb.Error:
            pass
        remove_segments(self.segments)
        self._state = "suspended"

    def _replace_final(self) -> None:
        """Put the finished environment under the final name. An existing dataset (checked
        as ours when the writer opened) is swapped out in one atomic exchange, so the final
        name always holds a complete dataset, then removed; without ``renameat2`` it is moved
        to a fresh ``NAME.lmdb.old-*`` folder for the instant between two renames. (A
        directory, so not :func:`~gluon_data.storage.fsutil.atomic_write`, which writes one file;
        :meth:`publish` syncs the environment first and the parent directory after.)"""
        if not os.path.lexists(self.path):
            os.rename(self.tmp, self.path)
            return
        if exchange_dirs(self.tmp, self.path):
            shutil.rmtree(self.tmp)  # now the previous dataset
            return
        parent, base = os.path.split(os.path.abspath(self.path))
        old = tempfile.mkdtemp(prefix=base + ".old-", dir=parent)
        os.rename(self.path, old)  # replaces the empty folder we just made, nothing else
        try:
            os.rename(self.tmp, self.path)
        except BaseException:
            os.rename(old, self.path)
            raise
        shutil.rmtree(old)

    def abort(self) -> None:
        if self._state in ("published", "aborted"):
            return
        try:
            self.env.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
            remove_segments(self.segments)
            self._state = "aborted"


def _progress(env: lmdb.Environment, name: bytes) -> Optional[bytes]:
    """The progress document committed in ``env`` (its database ``name``), or None; read in
    a read transaction (opening the database without one would start a write transaction)."""
    with env.begin() as txn:
        try:
            db = env.open_db(name, txn=txn, create=False)
        except lmdb.NotFoundError:
            return None
        v = txn.get(b"state", db=db)
        return None if v is None else bytes(v)


class _SplitWriter:
    """The RecordWriter interface for one split of an :class:`LMDBWriter`."""

    def __init__(self, parent: LMDBWriter, name: str,
                 resume: Optional[Tuple[int, int]] = None):
        self.parent, self.name = parent, name
        self.db = parent.env.open_db(name.encode())
        count, nbytes = resume or (0, 0)
        if resume is not None:  # drop whatever was committed after the checkpoint
            with parent.env.begin(write=True, db=self.db) as txn:
                cur = txn.cursor()
                if cur.set_range(record_key(count)):
                    while cur.delete():
                        pass
        self.count = count
        self.bytes_written = nbytes
        self._batch: List[Tuple[bytes, bytes]] = []
        self._state = "open"

    def write(self, key: int, payload: bytes) -> int:
        """Append a record (``key`` is ignored: LMDB keys are positions)."""
        pos = self.count
        self._batch.append((record_key(pos), bytes(payload)))
        self.count += 1
        self.bytes_written += len(payload)
        if len(self._batch) >= self.parent.commit_every:
            self._flush()
        return pos

    def _flush(self, progress: Optional[bytes] = None):
        if self._batch or progress is not None:
            self.parent._commit(self.db, self._batch, progress)
            self._batch = []

    keeps_progress = True  # a conversion's checkpoint commits with the records
    takes_segments = True  # conversion workers write framed records into segments

    def segment_path(self, n: int) -> str:
        """Where segment ``n`` of this split is written (see
        :meth:`~gluon_data.stores.recwriter.RecordWriter.segment_path`)."""
        return segment_file(self.parent.segments, "%s-%08d" % (self.name, n))

    def append_segment(self, fd: int, offset: int, entries) -> None:
        """Put the framed records of open file ``fd`` from ``offset``, one per ``(key,
        nbytes)`` of ``entries`` (keys ignored, as in :meth:`write`): the segment is read in
        one call, the records are put in batches by this (the one writing) process."""
        total = sum(n for _, n in entries)
        buf = bytearray(total)
        view, got = memoryview(buf), 0
        while got < total:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                raise OutputError("a segment ended %d bytes before the records it announced"
                                  % (total - got), self.parent.segments)
            got += n
        pos = 0
        for _, nbytes in entries:
            payload, _ = codec.unframe(buf, pos, path=self.parent.segments, copy=False)
            self.write(0, payload)
            pos += nbytes

    def sync(self) -> Tuple[int, int]:
        """``(count, bytes)``, the argument ``resume`` takes to continue from here; the
        records up to it become durable with the next :meth:`checkpoint`."""
        return self.count, self.bytes_written

    def checkpoint(self, progress: bytes) -> None:
        """Commit the buffered records together with ``progress`` (atomically), and make
        them durable: the environment is written without a sync per commit, so a checkpoint
        is flushed to disk before the run counts on it, as a RecordIO one is."""
        self._flush(progress)
        self.parent.flush_to_disk()

    def holds_progress(self, progress: bytes) -> bool:
        """Whether ``progress`` is the progress document committed (after an interrupt in
        :meth:`checkpoint`: whether its commit landed)."""
        try:
            return self.parent.committed_progress() == progress
        except lmdb.Error:
            return False

    def finish(self, meta: Optional[dict] = None) -> None:
        self._flush()
        if meta is not None:
            self.parent.put_meta(self.name, dict(meta, container="lmdb"))
        self._state = "finished"

    def publish(self) -> None:
        self.parent.publish()
        self._state = "published"

    def suspend(self) -> None:
        self.parent.suspend()
        self._state = "suspended"

    def abort(self) -> None:
        self.parent.abort()
        self._state = "aborted"
