"""Typed exceptions: every failure names the file, the record and the reason."""
from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "GluonDataError",
    "FormatError",
    "CorruptRecordError",
    "DecodeError",
    "SourceError",
    "ConversionError",
    "EmptyOutputError",
    "ResourceError",
    "OutputError",
    "CacheError",
    "RemoteError",
    "WorkerPathError",
    "RemoteConnectionError",
    "RemoteNotFoundError",
    "TruncatedDownloadError",
    "ChecksumMismatchError",
    "CHECKPOINT_KEPT",
    "mark_interrupt",
]

#: The attribute a ``KeyboardInterrupt`` that stopped a conversion carries when the
#: conversion says what it kept: True where a checkpoint (and the partial output it
#: describes) is there for ``--resume`` to continue from, False where nothing was kept. The
#: command line's last line says which.
CHECKPOINT_KEPT = "gluon_data_checkpoint_kept"


def mark_interrupt(interrupt: BaseException, kept: bool) -> None:
    """Say on ``interrupt`` (a ``KeyboardInterrupt`` that stopped a conversion) whether a
    checkpoint was ``kept``: :data:`CHECKPOINT_KEPT`, for the command line's last line, and
    a note that Python (3.11+) prints under its traceback."""
    setattr(interrupt, CHECKPOINT_KEPT, kept)
    if hasattr(interrupt, "add_note"):
        interrupt.add_note("gluon-data: " + (
            "a checkpoint was kept: the same call with resume=True continues" if kept else
            "stopped before its first checkpoint: nothing was kept"))


def _where(path: Optional[str], key=None, offset: Optional[int] = None) -> str:
    parts = []
    if path is not None:
        parts.append(str(path))
    if key is not None:
        parts.append("record %s" % (key,))
    if offset is not None:
        parts.append("offset %d" % offset)
    return ", ".join(parts)


class GluonDataError(Exception):
    """Base class of all gluon_data errors.

    Attributes ``path``, ``key`` and ``offset`` say where the problem is (any may be
    ``None``) and ``reason`` says what is wrong.
    """

    def __init__(self, reason: str, path: Optional[str] = None, key: Any = None,
                 offset: Optional[int] = None):
        self.reason = reason
        self.path = None if path is None else str(path)
        self.key = key
        self.offset = offset
        where = _where(self.path, key, offset)
        super().__init__("%s: %s" % (where, reason) if where else reason)

    def __reduce__(self):  # keep the fields when sent back from a DataLoader worker
        return (type(self), (self.reason, self.path, self.key, self.offset))


class FormatError(GluonDataError, ValueError):
    """A file is not in the expected format (bad index, truncated data, unknown version)."""


class CorruptRecordError(FormatError):
    """A record's bytes do not match its checksum or its framing."""


class DecodeError(GluonDataError, ValueError):
    """Image or mask bytes could not be decoded (garbage, truncated, too large)."""


class SourceError(GluonDataError, ValueError):
    """A source file given to a converter is missing, unreadable or inconsistent."""


class ConversionError(GluonDataError):
    """A conversion failed; nothing was written under the output's final name."""


class EmptyOutputError(ConversionError):
    """A conversion would publish a split with no record: every item of it was skipped
    (``on_error='skip'``). Rerunning the same plan ends the same way, so no partial output
    or checkpoint is kept; the message names items skipped and why."""


class ResourceError(GluonDataError, OSError):
    """The process ran out of a resource it needs to read (file descriptors, ...); the
    message says which limit and how to raise it."""


class OutputError(GluonDataError):
    """An output path holds something a command must not replace or write through (a
    symbolic link, or a file or folder that is not gluon_data's own output); it was left
    untouched."""


class CacheError(OutputError):
    """The cache folder, or an entry in it, is not one gluon_data can trust (a folder writable
    by others or owned by someone else, a link, a FIFO, a file it did not make); it was left
    untouched."""


class WorkerPathError(GluonDataError, FileNotFoundError):
    """A path given to a cluster conversion does not name the same file or folder on the
    machine running a task (no shared filesystem there); ``path`` is the path."""


class RemoteError(GluonDataError):
    """An object in remote storage could not be read or written; ``path`` is its URI."""


class RemoteConnectionError(RemoteError, ConnectionError):
    """The storage service could not be reached (after the bounded retries)."""


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """No object at the URI."""


class TruncatedDownloadError(RemoteError):
    """A download ended before the object's size; the partial copy was discarded."""


class ChecksumMismatchError(RemoteError, CorruptRecordError):
    """A downloaded object's bytes differ from the checksum its metadata or manifest records;
    the copy was discarded."""
