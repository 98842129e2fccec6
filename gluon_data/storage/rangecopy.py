"""Copying byte ranges from one file into another at given offsets: ``os.copy_file_range``
(a kernel copy, the bytes never in this process), or a read and a write where the system
has none or it copies nothing (as some filesystems' does). The record writer appends
segments with it, and a conversion worker copies the segments of earlier chunks into the
output with :func:`copy_segment`, which is why this module is light: a worker imports it
without the store modules."""
from __future__ import annotations

import errno
import os
from typing import Sequence, Tuple, Union

from ..errors import FormatError

__all__ = ["copy_runs", "copy_segment", "pwrite_all"]

#: copy_file_range's refusals that mean "not here" (another filesystem on an old kernel,
#: a filesystem without it): the bytes are then read and written
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}


def pwrite_all(fd: int, data: Union[bytes, bytearray, memoryview], offset: int) -> None:
    """Write all of ``data`` to ``fd`` at ``offset`` (``os.pwrite`` may write less)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n == 0:  # (a regular file never takes nothing; never loop on it)
            raise OSError(errno.EIO, "write took no byte at offset %d" % offset)
        view, offset = view[n:], offset + n


def copy_runs(src: int, dst: int, runs: Sequence[Tuple[int, int, int]], path: str) -> None:
    """Copy runs ``(offset, nbytes, dst_offset)`` of ``src`` into ``dst``. A source that
    ends before a run does is a :class:`~gluon_data.errors.FormatError` naming ``path``
    (the caller's choice: the segment, or the output a writer fills)."""
    for offset, nbytes, dst_offset in runs:
        _copy_range(src, dst, offset, nbytes, dst_offset, path)


def _copy_range(src: int, dst: int, offset: int, count: int, dst_offset: int,
                path: str) -> None:
    """Copy ``count`` bytes of ``src`` from ``offset`` to ``dst`` at ``dst_offset``."""
    kernel = hasattr(os, "copy_file_range")
    while count > 0:
        n = 0
        if kernel:
            try:
                n = os.copy_file_range(src, dst, count, offset, dst_offset)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                kernel = False
                continue
            if n == 0:  # the end, or a filesystem that copies nothing: a read tells which
                kernel = False
                continue
        else:
            data = os.pread(src, min(count, 16 << 20), offset)
            if data:
                pwrite_all(dst, data, dst_offset)
            n = len(data)
        if n == 0:
            raise FormatError("a segment ended %d bytes before the records it announced"
                              % count, path)
        offset, dst_offset, count = offset + n, dst_offset + n, count - n


def copy_segment(segment: str, dest: str, runs: Sequence[Tuple[int, int, int]]) -> None:
    """Copy runs ``(offset, nbytes, dest_offset)`` of the ``segment`` file into ``dest`` (a
    record writer's partial ``.rec``, at the offsets its ``reserve_segment`` gave), then
    remove the segment. Any process may run it: conversion workers copy the segments of
    earlier chunks while they encode."""
    src = os.open(segment, os.O_RDONLY)
    try:
        dst = os.open(dest, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            copy_runs(src, dst, runs, segment)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.remove(segment)
