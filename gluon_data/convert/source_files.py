"""What a source may read: paths confined to the source root (symbolic links leaving it
refused unless followed on purpose), and files read whole under the one input-kind rule and a
size limit (:func:`read_regular`)."""
from __future__ import annotations

import os
import stat
from typing import List, Optional

from ..errors import FormatError, SourceError
from ..storage.fileio import open_or_explain

__all__ = ["DEFAULT_MAX_FILE_BYTES", "confine", "read_regular"]

#: Largest source file read (``--max-file-bytes``).
DEFAULT_MAX_FILE_BYTES = 1 << 28


def _realpath(path: str, dirs: Optional[dict]) -> str:
    """``os.path.realpath(path)``; with ``dirs`` (a dict kept for one listing), each folder
    is resolved once and a file in it costs one ``lstat`` (a symlink is resolved in full)."""
    head, tail = os.path.split(path)
    if dirs is None or tail in ("", ".", ".."):
        return os.path.realpath(path)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return os.path.realpath(path)
    except OSError:  # missing: realpath resolves what exists
        return os.path.realpath(path)
    return os.path.join(_realdir(head, dirs), tail)


def _realdir(path: str, dirs: dict) -> str:
    real = dirs.get(path)
    if real is None:
        real = dirs[path] = os.path.realpath(path or os.curdir)
    return real


def _inside(root: str, path: str, dirs: Optional[dict] = None) -> bool:
    root_real = os.path.realpath(root) if dirs is None else _realdir(root, dirs)
    real = _realpath(path, dirs)
    return real == root_real or real.startswith(root_real + os.sep)


def _abs(root: str, dirs: Optional[dict]) -> str:
    """``os.path.abspath(root)``, kept in ``dirs`` (beside the folders it resolves)."""
    key = ("lexical", root)
    root_abs = dirs.get(key) if dirs is not None else None
    if root_abs is None:
        root_abs = os.path.abspath(root)
        if dirs is not None:
            dirs[key] = root_abs
    return root_abs


def _lexically_inside(root: str, path: str, dirs: Optional[dict] = None) -> bool:
    root_abs = _abs(root, dirs)
    p = os.path.abspath(path)  # (normalised too)
    return p == root_abs or p.startswith(root_abs.rstrip(os.sep) + os.sep)


def _plainly_inside(root: str, path: str, follow_symlinks: bool, dirs: dict) -> bool:
    """The common case of :func:`confine` in one ``lstat``: ``path`` names a file (not a
    symlink, unless they are followed) in a folder that lies inside the root (or is it) both
    as spelled and resolved, a verdict kept in ``dirs`` per folder. False says "look in
    full", never "refused"."""
    head, tail = os.path.split(path)
    if tail in ("", ".", ".."):
        return False
    key = ("inside", head)
    verdict = dirs.get(key)
    if verdict is None:
        spelled = _within(_abs(root, dirs), os.path.abspath(head or os.curdir))
        verdict = dirs[key] = (spelled, _within(_realdir(root, dirs), _realdir(head, dirs)))
    if not verdict[0]:
        return False
    if follow_symlinks:
        return True
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # missing: its read says so
        link = False
    return verdict[1] and not link


def _within(root: str, folder: str) -> bool:
    """Whether the normalised ``folder`` is the normalised ``root`` or lies under it."""
    return folder == root or folder.startswith(root.rstrip(os.sep) + os.sep)


def confine(root: str, path: str, follow_symlinks: bool = False,
            dirs: Optional[dict] = None) -> Optional[str]:
    """The one rule every layout applies to every file it lists: why ``path`` may not be
    read as part of the source rooted at ``root``, or ``None`` when it may.

    A path spelled outside the root (``..``, an absolute path in a split file or ``.lst``) is
    always refused. A path inside it that resolves, through symlinks, to a file outside it
    is refused unless ``follow_symlinks`` (trees that link to shared storage on purpose).
    ``dirs``: a dict shared by the calls of one listing, so each folder is resolved once.
    """
    if dirs is not None and _plainly_inside(root, path, follow_symlinks, dirs):
        return None
    if not _lexically_inside(root, path, dirs):
        return "path leaves the image root %s" % root
    if not follow_symlinks and not _inside(root, path, dirs):
        return ("symlink leaves the source root %s (points to %s); pass --follow-symlinks "
                "(follow_symlinks=True) if the tree links out on purpose"
                % (root, os.path.realpath(path)))
    return None


def read_regular(path: str, what: str, max_bytes: Optional[int] = DEFAULT_MAX_FILE_BYTES,
                 allow_empty: bool = False) -> bytes:
    """The bytes of a *regular* file of at most ``max_bytes``, else :class:`SourceError`.

    The file is opened under the one input-kind rule
    (:func:`gluon_data.storage.fileio.open_or_explain`), so a FIFO never blocks, and a device
    (``/dev/zero``), a socket or a directory is refused instead of being read until memory
    runs out.
    """
    try:  # the one input-kind rule (storage.fileio): checked before and after a
        fd = open_or_explain(path)  # non-blocking open, so a FIFO never blocks
    except FileNotFoundError:
        raise SourceError("%s file not found" % what, path) from None
    except FormatError as e:  # a directory, a FIFO, a device, a socket (or a link to one)
        raise SourceError("%s is %s" % (what, e.reason), path) from None
    except OSError as e:
        raise SourceError("cannot read %s: %s" % (what, e.strerror or e), path) from None
    try:
        st = os.fstat(fd)
        if max_bytes and st.st_size > max_bytes:
            raise SourceError("%s of %d bytes exceeds max_file_bytes=%d (--max-file-bytes)"
                              % (what, st.st_size, max_bytes), path)
        limit = (max_bytes or st.st_size) + 1  # a file growing while read stops here
        chunks, got = [], 0
        while got < limit:
            b = os.read(fd, min(limit - got, max(st.st_size - got, 0) + 1, 16 << 20))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        data = b"".join(chunks)
    except OSError as e:
        raise SourceError("cannot read %s: %s" % (what, e.strerror or e), path) from None
    finally:
        os.close(fd)
    if max_bytes and len(data) > max_bytes:
        raise SourceError("%s grew past max_file_bytes=%d while being read" % (what, max_bytes),
                          path)
    if not data and not allow_empty:
        raise SourceError("%s is an empty (0-byte) file" % what, path)
    return data


def read_source_text(path: str, what: str) -> List[str]:
    """Lines of a small text file of the source (a split list, a ``.lst``)."""
    raw = read_regular(path, what, allow_empty=True)
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise SourceError("%s is not UTF-8 text (%s)" % (what, e), path) from None
