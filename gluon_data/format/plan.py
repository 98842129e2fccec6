"""The identity of a conversion plan: one digest over what it reads and how.

A plan's digest covers a header (source, layout, options, shard ranges...) and, per split,
every item it reads: its name, its paths relative to the source root, label and key, and the
*stamp* of each file: ``[size, mtime_ns, inode, ctime_ns]`` (``st_size``, ``st_mtime_ns``,
``st_ino``, ``st_ctime_ns``), what one ``stat`` gives. The same names with other content give
another digest, so nothing written from one state of a source is ever resumed with, or kept
beside, records of another: a file rewritten in place (even within the same second, even with
its mtime set back: the kernel sets the ctime on every write and on ``utime`` itself, and no
user can set it back) or replaced by another file (another inode) is caught. Not caught: a
change the filesystem does not show in these four numbers (a filesystem that does not keep a
ctime, a disk edited under the filesystem, a clock set back before a rewrite at the same size).
A tree copied elsewhere (another inode for every file) is another source: its stamps differ, so
a resume over it is refused and a sharded rerun redoes every shard. The unsharded ``--resume`` checkpoint, each shard of a sharded conversion and
each upload receipt carry such a digest.

``stamps=False`` leaves the stamps out: the digest of the plan's *names* (which files, which
options), the one earlier versions recorded, used to tell "the same plan over a changed
source" from "another plan".
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..storage.fileio import path_stamp

__all__ = ["plan_digest", "part_digest", "conversion_id", "source_head", "changed_files",
           "PlanDigest"]


_PLAN_STAMP = ("size", "mtime_ns", "ino", "ctime_ns")  # its order: digests already recorded


def _stamp(path: Optional[str]) -> Optional[List[int]]:
    """``[size, mtime_ns, inode, ctime_ns]`` of ``path`` (``None`` for no path or a file that
    is gone): what one ``stat`` tells of a file's content without reading it."""
    stamp = None if path is None else path_stamp(path, _PLAN_STAMP)
    return None if stamp is None else list(stamp)


def _changed_ns(st: List[int]) -> int:
    """When a stamped file last changed: its ctime (set by every write, and by a ``utime``
    setting its mtime back), or its mtime for a stamp without one."""
    return max(st[1], st[3]) if len(st) > 3 else st[1]


def _paths(item) -> Tuple[Optional[str], ...]:
    """The files an item reads: a plan item's image and mask, or a file read whole."""
    return (item,) if isinstance(item, str) else (item.image, item.mask)


def _relative(path: str, prefix: Optional[str], root: Optional[str]) -> str:
    """``os.path.relpath(path, root)``; ``prefix``: ``root`` + separator where ``root`` is
    spelled normalised, so a path spelled under it plainly (no ``.``/``..`` component, no
    doubled separator) is cut without the two ``abspath`` calls (the same result)."""
    if prefix is not None and path.startswith(prefix):
        rest = path[len(prefix):]
        probe = os.sep + rest + os.sep
        if rest and os.sep + "." not in probe and os.sep * 2 not in probe:
            return rest
    return os.path.relpath(path, root)


def _root_prefix(root: Optional[str]) -> Optional[str]:
    if not root:
        return None
    plain = root.rstrip(os.sep)
    return plain + os.sep if plain and os.path.normpath(plain) == plain else None


def _entry(item, root: Optional[str], stamps: bool, prefix: Optional[str] = None) -> list:
    entry: list  # names and paths (str or None), then label, key and stamps
    if isinstance(item, str):  # a file read whole (a dataset being copied)
        entry = [os.path.abspath(item)]
    else:  # relative: the same source spelled relative or absolute has the same digest
        entry = [item.name] + [None if p is None else _relative(p, prefix, root)
                               for p in (item.image, item.mask)] + [item.label, item.key]
    if stamps:
        entry += [_stamp(p) for p in _paths(item)]
    return entry


class PlanDigest(str):
    """A plan digest (a ``str``) that also knows its names-only digest (:attr:`names`), when
    its stamps were taken (:attr:`taken_ns`) and the files it stamped (:attr:`files`), so a
    mismatch can say which file changed."""

    names: str
    taken_ns: int
    files: List[Tuple[str, Optional[List[int]]]]
    stamped: Mapping[str, list]  # per split, each item's entry with its files' stamps

    def prefix(self, split: str, n: int) -> str:
        """The digest of the first ``n`` items of ``split`` with their stamps: what a
        checkpoint that has written them binds (later items may still change).

        It is :func:`_sha256` of ``{"items": [[entry, stamps]...], "names": names}`` (stamps,
        not paths as spelled), hashed as it grows: each checkpoint of a conversion hashes
        only the items written since the last one, not all of them again (a conversion's
        checkpoints would otherwise cost its parent time in the square of its size). The
        plan's entries (:attr:`stamped`) are fixed once the digest is made."""
        entries = self.stamped.get(split, [])
        n = len(range(len(entries))[:n])  # (as ``entries[:n]`` counts)
        run = self._runs.get(split)
        if run is None or run[1] > n:
            run = (hashlib.sha256(b'{"items": ['), 0)
        h, at = run
        for k in range(at, n):
            e, pairs = entries[k]
            h.update(((", " if k else "") + _json([e, [st for _, st in pairs]])).encode())
        self._runs[split] = (h, n)
        end = h.copy()
        end.update(('], "names": %s}' % _json(self.names)).encode())
        return end.hexdigest()

    @property
    def _runs(self) -> Dict[str, Tuple[Any, int]]:
        """Per split, the hash of the items' part of :meth:`prefix` so far and their count
        (kept out of the pickled state: a hash object does not pickle)."""
        runs = self.__dict__.get("_prefix_runs")
        if runs is None:
            runs = self.__dict__["_prefix_runs"] = {}
        return runs

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_prefix_runs"}

    def files_of(self, split: str, n: int) -> List[Tuple[str, Optional[List[int]]]]:
        """``(path, stamp)`` of the files the first ``n`` items of ``split`` read."""
        out: List[Tuple[str, Optional[List[int]]]] = []
        for e in self.stamped.get(split, [])[:n]:
            out.extend((p, st) for p, st in e[1] if p is not None)
        return out


def plan_digest(head: dict, plan: Optional[Mapping[str, Sequence]] = None,
                root: Optional[str] = None, stamps: bool = True) -> PlanDigest:
    """The digest of ``head`` (any JSON-able description: source, options...) and ``plan``
    (``{split: items}``; an item is a source :class:`~gluon_data.convert.sources.Item`, paths taken
    relative to ``root``, or the path of a file read whole), each file's stamp
    (``[size, mtime_ns, inode, ctime_ns]``) included unless ``stamps`` is false."""
    taken = time.time_ns()
    doc = dict(head)
    out_files: List[Tuple[str, Optional[List[int]]]] = []
    if plan is not None:
        prefix = _root_prefix(root)
        doc["plan"] = {s: [_entry(i, root, stamps, prefix) for i in items]
                       for s, items in plan.items()}
    out = PlanDigest(_sha256(doc))
    out.taken_ns, out.names, out.files, out.stamped = taken, str(out), out_files, {}
    if plan is not None and stamps:  # the same entries without their stamps
        for s, items in plan.items():
            out.stamped[s] = []
            for k, (e, i) in enumerate(zip(doc["plan"][s], items)):
                paths = _paths(i)
                pairs = list(zip(paths, e[-len(paths):]))
                out_files.extend((p, st) for p, st in pairs if p is not None)
                out.stamped[s].append((e[:-len(paths)], pairs))
                doc["plan"][s][k] = e[:-len(paths)]
        out.names = _sha256(doc)
    return out


def part_digest(head: Mapping, index: int, plan: Optional[Mapping[str, Sequence]] = None,
                root: Optional[str] = None, stamps: bool = True) -> PlanDigest:
    """The digest of part ``index`` (a shard) of a plan: :func:`plan_digest` of ``head``
    with ``"shard": index``, over the part's own items (``plan``) when it has them. A part
    with no items of its own names its whole plan in ``head`` (``{"plan": digest}``): its
    identity is then the plan's and its position. The one derivation of a shard's identity:
    the sharded conversion's tasks, their resume records and upload receipts carry it."""
    return plan_digest(dict(head, shard=index), plan, root, stamps)


def conversion_id(digest: str, split: str, count: int, nbytes: int,
                  stats: Optional[dict] = None) -> str:
    """The ``conversion_id`` readers compare on reopen (FORMAT.md): derived from a plan's
    (or a part's) names-only digest, the split and what was written (``count`` records,
    ``nbytes`` bytes, the running statistics' state), so equal inputs still give
    byte-identical outputs while a conversion that wrote anything else gets another id.
    32 hex digits."""
    return _sha256([digest, split, count, nbytes, stats])[:32]


def source_head(src, opts, options: dict) -> dict:
    """The header of a conversion's plan: its source (a :class:`~gluon_data.convert.sources.Source`),
    layout and encoding options."""
    return {"source": os.path.abspath(src.root), "layout": src.layout, "options": options,
            "opts": repr(opts)}


def _json(doc) -> str:
    return json.dumps(doc, sort_keys=True, default=str)


def _sha256(doc) -> str:
    return hashlib.sha256(_json(doc).encode()).hexdigest()


def changed_files(files: Iterable[Tuple[str, Optional[List[int]]]], since_ns: int,
                  limit: int = 3) -> Tuple[int, List[str]]:
    """How many of ``files`` (``(path, stamp)`` pairs) are gone or were changed after
    ``since_ns`` (written, or their mtime set: the ctime tells), and a description of the
    first ``limit``."""
    n = 0
    out: List[str] = []
    for path, st in files:
        if st is not None and _changed_ns(st) <= since_ns:
            continue
        n += 1
        if len(out) < limit:
            ctime = st[3] if st is not None and len(st) > 3 and st[3] > since_ns else None
            out.append("%s (%s)" % (path, "gone" if st is None else "now %d bytes, modified "
                                    "%s%s" % (st[0], _iso_ns(st[1]), "" if ctime is None else
                                              ", changed %s (ctime)" % _iso_ns(ctime))))
    return n, out


def _iso_ns(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + ".%09dZ" % (
        ns % 10**9)
