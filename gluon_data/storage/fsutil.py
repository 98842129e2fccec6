"""Safe writes: what an output may replace, atomic file replacement, exclusive output locks.

Every command that writes a file goes through here, so one rule holds everywhere:

* an existing path is only replaced when the user asked for it (``overwrite``) *and* it is
  recognisably gluon_data's own output of the same kind (:func:`check_replaceable`);
* nothing is ever written through a symbolic link, and a link is never replaced
  (:func:`open_new`, :func:`atomic_write`);
* a file appears under its final name only complete and on disk (temporary sibling, fsync,
  rename, fsync of the directory);
* two processes never write the same output at once (:class:`OutputLock`).
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import stat
from typing import IO, Any, Iterable, List, Optional, Tuple

from ..errors import CacheError, ConversionError, FormatError, OutputError, ResourceError
from .fileio import open_or_explain

__all__ = ["open_new", "atomic_write", "fsync_dir", "remove_partial_dir", "exchange_dirs",
           "OutputLock", "holds_only_lmdb", "LMDB_DATA", "LMDB_LOCK", "sha256_file",
           "file_facts", "GrowingDigest", "start_writeback"]

#: LMDB's own files in an environment directory: the data, and the lock file py-lmdb makes
#: beside it (never published: FORMAT.md section 5). Defined here, the lowest layer naming them.
LMDB_DATA = "data.mdb"
LMDB_LOCK = "lock.mdb"
_LMDB_FILES = frozenset((LMDB_DATA, LMDB_LOCK))
_LOCK_TAG = b"gluon_data lock"  # the first bytes of every lock file we write


def is_lmdb_dir(path: str) -> bool:
    """Whether ``path`` is a directory holding a ``data.mdb``, of any file type: an LMDB
    environment (reading it refuses a ``data.mdb`` that is not a regular file, naming it: a
    FIFO there is a damaged LMDB, not a folder of images)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, LMDB_DATA))


def holds_only_lmdb(path: str) -> bool:
    """Whether ``path`` is a real directory (not a link) holding nothing but LMDB's own files
    (``data.mdb``, ``lock.mdb``): what may be replaced as an LMDB environment."""
    try:
        st = os.lstat(path)
        return stat.S_ISDIR(st.st_mode) and set(os.listdir(path)) <= _LMDB_FILES
    except OSError:
        return False


def open_new(path: str, mode: str = "wb", **kwargs: Any) -> IO[Any]:
    """Open ``path`` for writing as a fresh file, never through a symbolic link.

    A stale regular file there (a leftover temporary of ours) is removed first; a link or a
    directory raises :class:`OutputError` and is left as it is.
    """
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputError("is in the way of a temporary file gluon-data writes (it is a %s,"
                              " not a regular file); remove it" % (
                                  "symbolic link" if stat.S_ISLNK(st.st_mode) else
                                  "directory" if stat.S_ISDIR(st.st_mode) else "special file"),
                              path)
        os.remove(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    # the file object owns the descriptor from the moment it exists: opened through
    # ``opener``, never ``os.fdopen`` of a descriptor closed again on failure (a Ctrl-C that
    # lands once the file object exists has it closed already, and a second close raised
    # "Bad file descriptor" in place of the interrupt, or closed another file's)
    return open(path, mode, opener=lambda p, _: os.open(p, flags, 0o644), **kwargs)


def fsync_dir(path: str) -> None:
    """Make a rename in directory ``path`` durable (best effort where unsupported)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes, *, suffix: str = ".partial",
                 sync_dir: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: a fresh temporary sibling (never through a
    link), fsync, rename over ``path``, fsync of the directory (unless ``sync_dir=False``:
    the caller records that the rename happened first, then calls :func:`fsync_dir`). The
    caller decides first whether ``path`` may be replaced (:func:`check_replaceable`)."""
    path = os.fspath(path)
    tmp = path + suffix
    try:
        with open_new(tmp) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            if os.path.isfile(tmp) and not os.path.islink(tmp):
                os.remove(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def default_cache_dir() -> str:
    """``$GLUON_DATA_CACHE_DIR``, else ``~/.cache/gluon_data``: where gluon_data keeps what it
    derives (downloaded objects, parsed indexes), never beside a user's files."""
    return os.environ.get("GLUON_DATA_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "gluon_data")


def kind_of(st: os.stat_result) -> str:
    """What an ``lstat`` result is, in words ("a symbolic link", "a directory", ...)."""
    return ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory"
            if stat.S_ISDIR(st.st_mode) else "a regular file" if stat.S_ISREG(st.st_mode)
            else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a special file")


def kind_of_path(path: str) -> str:
    """:func:`kind_of` of ``path`` (``lstat``), or "missing"."""
    try:
        return kind_of(os.lstat(path))
    except OSError:
        return "missing"


class CacheLock:
    """An ``flock`` on a file in the cache directory (shared or exclusive). ``flock``
    locks belong to the open file, so threads and processes (forked workers included)
    all take part; lock files are never deleted (an unlinked lock file would let two
    holders believe they hold the same lock).

    Examples
    --------
    >>> import fcntl
    >>> with CacheLock("/tmp/gd-example.lock", fcntl.LOCK_EX):   # doctest: +SKIP
    ...     pass  # fill the cache entry once; others wait here
    """

    def __init__(self, path: str, mode: int, blocking: bool = True):
        import fcntl
        self.fd = None
        try:  # never through a link, never a FIFO (a planted one would block the open)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENOTDIR):
                raise CacheError("is %s, in the way of a lock file of the cache (a regular "
                                 "file); it was left untouched: remove it"
                                 % kind_of_path(path), path) from None
            raise
        self.fd = fd
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CacheError("is %s, in the way of a lock file of the cache (a regular "
                                 "file); it was left untouched: remove it" % kind_of(st), path)
            fcntl.flock(self.fd, mode | (0 if blocking else fcntl.LOCK_NB))
        except BaseException:
            self.fd = None
            os.close(fd)
            raise

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def remove_partial_dir(path: str) -> None:
    """Remove a leftover partial LMDB directory, only if it holds nothing but LMDB files."""
    if not os.path.lexists(path):
        return
    if not holds_only_lmdb(path):
        raise OutputError("is in the way of the partial LMDB environment gluon-data builds, "
                          "and is not one (a link, a file, or a directory holding other "
                          "files); it was left untouched: remove it", path)
    shutil.rmtree(path)


_RENAME_EXCHANGE = 2
_libc = None


def _get_libc():
    """The C library (``ctypes``), or ``None`` where it cannot be loaded."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    return _libc


def exchange_dirs(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` when the
    system cannot (then nothing happened)."""
    try:
        fn = _get_libc().renameat2
    except AttributeError:  # no libc, or no renameat2 in it
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


def map_readonly(fd: int, size: int) -> Any:
    """A read-only, shared mapping of the first ``size`` bytes of ``fd`` as a buffer (for
    ``np.frombuffer``), unmapped when the last object over it is gone, advised for random
    access. Unlike :class:`mmap.mmap` (which keeps a duplicate of the descriptor until
    closed) it holds no descriptor: a thousand open datasets hold none. Where ``mmap(2)``
    cannot be called through ``ctypes``, :class:`mmap.mmap` is used."""
    import mmap
    import weakref
    libc = _get_libc()
    fn = getattr(libc, "mmap", None)
    if fn is None:  # pragma: no cover - not a POSIX libc
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_RANDOM)
        return mm
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    addr = fn(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    libc.madvise(addr, size, getattr(mmap, "MADV_RANDOM", 1))  # a cold page read alone
    buf = (ctypes.c_char * size).from_address(addr)
    weakref.finalize(buf, libc.munmap, addr, size)
    return buf


class OutputLock:
    """Exclusive, non-blocking lock on one or more outputs, held from start to publish.

    Each output ``P`` gets a lock file ``P.lock`` holding the holder's pid, locked with
    ``flock``; the kernel drops the lock if the holder dies, so a crashed run never blocks
    the next one. A second writer fails at once with :class:`ConversionError` naming the
    output and the holder's pid. The lock files are removed on release.

    Examples
    --------
    >>> with OutputLock(["out.rec"]):              # doctest: +SKIP
    ...     pass  # write out.rec, out.idx, out.meta.json
    """

    SUFFIX = ".lock"

    def __init__(self, outputs: Iterable[str]):
        self.paths = sorted({os.fspath(p).rstrip("/") for p in outputs})
        #: ``(lock file, descriptor)`` per lock held; None: closed, being dropped
        self._held: List[Optional[Tuple[str, int]]] = []

    def _lock_one(self, output: str) -> None:
        import fcntl
        path = output + self.SUFFIX
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC",
                                                                                 0)
        for _ in range(100):  # a releasing holder unlinks the file: retry on the new one
            try:
                fd = os.open(path, flags, 0o644)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise OutputError("is in the way of the lock file gluon-data uses for %s "
                                      "(not a regular file); it was left untouched: remove it"
                                      % output, path) from None
                raise
            ours = False  # the lock taken, on a lock file of ours at ``path``
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OutputError("is in the way of the lock file gluon-data uses for %s "
                                      "(not a regular file); remove it" % output, path)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pid = self._holder(fd)
                    raise ConversionError("another gluon-data process (pid %s) is writing this "
                                          "output; wait for it to finish (or stop it) and run "
                                          "again" % pid, output) from None
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    fd, stale = -1, fd  # (closed once, whatever interrupts it)
                    os.close(stale)
                    continue
                head = os.pread(fd, 64, 0)
                if head and not head.startswith(_LOCK_TAG):
                    raise OutputError("is in the way of the lock file gluon-data uses for %s "
                                      "and is not one; it was left untouched: remove it"
                                      % output, path)
                ours = True
                os.ftruncate(fd, 0)
                os.pwrite(fd, b"%s pid=%d\n" % (_LOCK_TAG, os.getpid()), 0)
            except BaseException:  # (a Ctrl-C too) the lock file of ours goes with the lock
                if fd >= 0:
                    try:
                        if ours:
                            os.remove(path)
                    except OSError:
                        pass
                    finally:
                        os.close(fd)
                raise
            self._held.append((path, fd))
            return
        raise ConversionError("could not lock the output (its lock file keeps changing)",
                              output)

    @staticmethod
    def _holder(fd: int) -> str:
        """The pid written in a held lock file (the holder writes it just after locking:
        wait a moment for it)."""
        import time
        for _ in range(100):  # at most a second
            holder = os.pread(fd, 200, 0).decode("ascii", "replace")
            if holder.endswith("\n"):  # written whole (one pwrite)
                return holder.strip().rpartition("pid=")[2] or "unknown"
            time.sleep(0.01)
        return "unknown"

    def acquire(self) -> "OutputLock":
        path = None
        try:
            for path in self.paths:
                self._lock_one(path)
        except BaseException as e:
            self.release()
            if isinstance(e, OSError) and not isinstance(e, ResourceError):  # (a full disk)
                raise OutputError("cannot take the lock file gluon-data uses for this output: "
                                  "%s" % (e.strerror or e), "%s%s" % (path, self.SUFFIX)) from e
            raise
        return self

    def release(self) -> None:
        """Remove each lock file, then close its descriptor (which drops the lock). A Ctrl-C
        landing in here (a second one, during the clean-up of the first) still releases every
        lock, then is raised: a descriptor left open would hold its lock for as long as this
        process lives, and refuse every later conversion of that output in it."""
        interrupted: Optional[BaseException] = None
        while True:
            try:
                if not self._held:
                    break
                entry = self._held[-1]
                if entry is None:  # closed, then interrupted before it was dropped
                    self._held.pop()
                    continue
                path, fd = entry
                try:
                    os.remove(path)  # still holding the lock: nobody else owns this file
                except OSError:  # (gone: removed already, before an interrupt)
                    pass
                self._held[-1] = None  # marked before the close: never closed twice
                os.close(fd)
            except BaseException as e:  # (KeyboardInterrupt) the other locks first
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def sha256_file(path: str) -> str:
    """The SHA-256 of a file's bytes (hex): :func:`file_facts`' digest, one read of the file
    under the one input rule (a FIFO is refused, never waited on)."""
    with GrowingDigest(path) as digest:
        return digest.facts()["sha256"]


def file_facts(path: str) -> Optional[dict]:
    """What the done rule (:mod:`gluon_data.convert.done`) records of the file at ``path``:
    ``{"bytes": n, "sha256": s}`` (``None`` when it is missing). Reads the file once."""
    try:
        with GrowingDigest(path) as digest:
            return digest.facts()
    except FileNotFoundError:
        return None


class GrowingDigest:
    """The one pass that hashes a file, whole (:func:`file_facts`, :func:`sha256_file`) or
    while it is still being written, its bytes hashed as they become final: :meth:`advance`
    takes them up to an offset the caller knows no write will change again, and
    :meth:`facts` the rest, then gives ``{"bytes", "sha256"}``. A conversion's output is so
    hashed while its later records are still written, instead of read once more at the
    end. The file is opened under the one input rule
    (:func:`~gluon_data.storage.fileio.open_or_explain`: a FIFO is refused, never waited
    on) and read in 4 MB pieces; each range hashed is also handed to the device
    (:func:`start_writeback`), so a writer's ``fsync`` after it has little left to wait
    for (where the pages are written already, that costs nothing)."""

    def __init__(self, path: str):
        self.path = path
        self.pos = 0  # the bytes hashed so far
        self._fd = open_or_explain(path)
        self._sha = hashlib.sha256()

    def advance(self, upto: int) -> None:
        """Hash the bytes from where the last call stopped up to offset ``upto``. A file
        that ends before is a :class:`~gluon_data.errors.FormatError` naming it."""
        while self.pos < upto:
            data = os.pread(self._fd, min(upto - self.pos, 4 << 20), self.pos)
            if not data:
                raise FormatError("the file ends at byte %d, before the %d its writer has "
                                  "written" % (self.pos, upto), self.path)
            self._sha.update(data)
            start_writeback(self._fd, self.pos, len(data))
            self.pos += len(data)

    def facts(self, size: Optional[int] = None) -> dict:
        """The file's facts, its first ``size`` bytes hashed (:meth:`advance`; None: as
        long as it is now); it must be no longer (a longer one is a
        :class:`~gluon_data.errors.FormatError`)."""
        if size is None:
            size = os.fstat(self._fd).st_size
        self.advance(size)
        have = os.fstat(self._fd).st_size
        if have != size:
            raise FormatError("the file has %d bytes, its writer wrote %d" % (have, size),
                              self.path)
        return {"bytes": size, "sha256": self._sha.hexdigest()}

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "GrowingDigest":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Have the system start writing the ``nbytes`` bytes of ``fd`` from ``offset`` to the
    device now, without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``): a later
    ``fsync`` then waits for less. Durability still needs that ``fsync``. Returns whether
    it was started: False where the system has no such call, or refused it."""
    try:
        fn = _get_libc().sync_file_range
    except AttributeError:  # no libc, or no sync_file_range in it (macOS)
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    return fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0
