"""The text of an MXNet ``.idx`` (``key<TAB>offset`` lines) as ``(keys, offsets)`` arrays:
:func:`parse_index`, strict (a line that is not two integers is a :class:`FormatError`
naming it) and exact (a value the vectorised int64 parser would saturate is read again as a
Python int, never clamped). :mod:`gluon_data.format.recindex` reads and caches indexes
through it; :class:`~gluon_data.mx_recordio.MXIndexedRecordIO` parses with it.
"""
from __future__ import annotations

import warnings
from typing import List, Optional, Tuple

import numpy as np

from ..errors import FormatError

__all__ = ["parse_index", "parse_index_prefix"]


#: what to do about an index that does not parse
_REBUILD = "gluon-data salvage rebuilds the index from the .rec"


def _bad_line(lines, path: str, reason_for) -> FormatError:
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        reason = reason_for(line)
        if reason:
            return FormatError("line %d (%r): %s; %s" % (lineno, line[:80].decode("latin-1"),
                                                         reason, _REBUILD), path)
    return FormatError("unparsable index; " + _REBUILD, path)


def _line_problem(line: bytes) -> Optional[str]:
    fields = line.split()
    if len(fields) != 2:
        return "expected 'key<TAB>offset', found %d fields" % len(fields)
    for f in fields:
        try:
            int(f)
        except ValueError:
            return "%r is not an integer" % f.decode("latin-1")
    return None


_INDEX_BYTES = np.zeros(256, bool)
_INDEX_BYTES[list(b"0123456789+-\t\n\r ")] = True


def _int_tokens(raw: bytes) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.fromstring(raw, dtype=np.int64, sep=" ")


def _parse_strict_index(raw: bytes, b: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The common case, as MXNet and we write it (``key<TAB>offset<LF>`` on every line), in
    three vectorised passes; ``None`` for anything else (blank lines, CRLF, spaces, errors),
    which the general parser then accepts or blames on a line."""
    nl = np.flatnonzero(b == 10)
    tabs = np.flatnonzero(b == 9)
    n = nl.size
    if n == 0 or tabs.size != n or nl[-1] != b.size - 1:
        return None
    line_starts = np.concatenate(([0], nl[:-1] + 1))
    # one tab per line, with a digit (or sign) right after the line start and the tab...
    if not ((line_starts < tabs) & (tabs < nl - 1)).all():
        return None
    first = np.concatenate((b[line_starts], b[tabs + 1]))
    if not (((first >= 48) & (first <= 57)) | (first == 45)).all():
        return None
    # ...so each field holds >= 1 token; exactly 2n integers then means exactly one each.
    flat = _int_tokens(raw)
    if flat.size != 2 * n:
        return None
    values = flat.reshape(-1, 2)
    return values[:, 0].copy(), values[:, 1].copy()


def parse_index(raw: bytes, idx_path: str,
                wide_keys: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """The text of an ``.idx`` as ``(keys, offsets)``; :class:`FormatError` naming the line
    that is not two integers. Never clamped: an offset or (without ``wide_keys``) a key
    outside int64 is a :class:`FormatError` naming the line; ``wide_keys`` keeps such keys,
    as Python ints in an object array (``mx.recordio`` reads ``int(key)``)."""
    keys, offsets = _parse_index_int64(raw, idx_path)
    if any((a == v).any() for a in (keys, offsets) for v in _I64_LIMITS):  # saturated?
        return _parse_index_exact(raw, idx_path, wide_keys)
    return keys, offsets


def parse_index_prefix(raw: bytes) -> List[Tuple[int, int]]:
    """``(key, offset)`` of the lines of an ``.idx`` up to the first that is not two integers
    (blank lines skipped, as :func:`parse_index` does): what can still be read of an index
    a writer left mid-line or that is damaged from some line on."""
    out: List[Tuple[int, int]] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        if _line_problem(line):
            break
        key, offset = line.split()
        out.append((int(key), int(offset)))
    return out


_I64_LIMITS = (-(1 << 63), (1 << 63) - 1)


def _parse_index_exact(raw: bytes, idx_path: str,
                       wide_keys: bool) -> Tuple[np.ndarray, np.ndarray]:
    """The exact parse of an index holding a value at a limit of int64 (where the C parser
    saturates): Python ints, refused (naming the line) where they do not fit."""
    lo, hi = _I64_LIMITS

    def problem(line: bytes) -> Optional[str]:
        key, offset = (int(t) for t in line.split())
        if not lo <= offset <= hi:
            return "offset %d is outside the 64-bit range of a file offset" % offset
        if not wide_keys and not lo <= key <= hi:
            return ("key %d does not fit a 64-bit integer (this reader keeps int64 keys; "
                    "gluon_data.mx_recordio.MXIndexedRecordIO reads any integer key)" % key)
        return None

    if any(problem(line) for line in raw.splitlines() if line.strip()):
        raise _bad_line(raw.splitlines(), idx_path, problem)
    tokens = [int(t) for t in raw.split()]
    keys, offsets = tokens[0::2], np.array(tokens[1::2], np.int64)
    if all(lo <= k <= hi for k in keys):
        return np.array(keys, np.int64), offsets
    wide = np.empty(len(keys), object)
    wide[:] = keys
    return wide, offsets


def _parse_index_int64(raw: bytes, idx_path: str) -> Tuple[np.ndarray, np.ndarray]:
    b = np.frombuffer(raw, dtype=np.uint8)
    # only digits, signs and white space: the C parser would stop quietly at "16x" and keep
    # 16 (all of these are <= "9"; those below "0" are checked where there are few of them)
    if not (b <= 57).all() or not _INDEX_BYTES[b[b < 48]].all():
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    fast = _parse_strict_index(raw, b)
    if fast is not None:
        return fast
    # Vectorised and strict: every non-blank line must hold exactly two tokens, and the C
    # parser must consume every token as an integer; otherwise find the line to blame.
    ws = (b == 32) | (b == 9) | (b == 10) | (b == 13)
    starts = np.flatnonzero(~ws & np.concatenate(([True], ws[:-1])))
    if starts.size == 0:
        raise FormatError("index lists no records (empty file)", idx_path)
    line_of = np.searchsorted(np.flatnonzero(b == 10), starts)
    per_line = np.bincount(line_of)
    if np.any(per_line[per_line > 0] != 2):
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    flat = _int_tokens(raw)
    if flat.size != starts.size:
        raise _bad_line(raw.splitlines(), idx_path, _line_problem)
    values = flat.reshape(-1, 2)
    return values[:, 0].copy(), values[:, 1].copy()
