"""The record-store protocol: "record i" of a dataset, wherever its bytes live.

A *store* is a read-only, random-access sequence of record payloads (the exact bytes a
``.rec`` frame holds, as :mod:`gluon_data.format.codec` packs them) plus the dataset's metadata.
Datasets, ``verify``, ``stats``, ``show`` and the converters' copy path see only this
protocol, so one ``.rec``, one LMDB split, a legacy LMDB, N shards behind a manifest or
objects in S3 are the same thing to them. Adding a backend means one class that satisfies
:class:`RecordStore` and one :func:`register_opener` call; nothing above this layer branches
on the container.

This module imports no MXNet (nor anything above it), so a numpy-level reader works in any
framework, and backends may import it without creating a cycle: they register themselves,
and :func:`open_store` imports the modules that hold the built-in backends lazily.

Built in: :class:`~gluon_data.stores.recordio.RecordFile` (a local ``.rec``; ``split`` is ``None``),
:class:`~gluon_data.stores.lmdbio.LMDBFile` (one split of an LMDB; ``offset`` is ``None``) and, with
``layout='raw-lmdb'`` / ``'caffe-lmdb'``, the legacy LMDB layouts
(:mod:`gluon_data.stores.legacy`). The contract every store meets is ``tests/test_contract.py``.
"""
from __future__ import annotations

import os
from typing import (TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple,
                    Union)

if TYPE_CHECKING:  # annotations only: numpy is imported where it is used
    import numpy as np

from ..storage.fileio import read_input
from ..storage.fsutil import LMDB_DATA, LMDB_LOCK
from ..storage.remotefs import is_uri
from ..errors import FormatError

try:  # Python >= 3.8
    from typing import Protocol, runtime_checkable
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol, runtime_checkable  # type: ignore

__all__ = ["RecordStore", "open_store", "store_splits", "register_opener", "is_uri", "will_need",
           "read_bytes", "register_reader", "dataset_part", "refuse_part"]

Buffer = Union[bytes, memoryview]


@runtime_checkable
class RecordStore(Protocol):
    """What every backend provides. Positions ``i`` run over ``range(len(store))``.

    Attributes
    ----------
    location : str
        The path or URI the store was opened from (what errors name).
    split : str or None
        The split it holds (LMDB environments hold several; a ``.rec`` holds one: ``None``).
    meta : dict or None
        The dataset's metadata (``None`` for stock files that carry none).

    Notes
    -----
    One method is optional, and so not a member :func:`isinstance` checks: a store whose
    records live on a local block device may define ``will_need(indices)``, which starts
    fetching those records' bytes into the page cache *asynchronously* and returns at once
    (``posix_fadvise(POSIX_FADV_WILLNEED)`` on each record's exact byte range, for
    :class:`~gluon_data.stores.recordio.RecordFile` and :class:`~gluon_data.stores.lmdbio.LMDBFile`), so
    the device holds many requests at once instead of one synchronous read at a time. It is
    only a hint: it reads nothing into process memory, verifies nothing (the reads that
    follow do, as always), ignores positions out of range and never changes what a read
    returns. A remote store's ``will_need`` starts downloading, in the background, the
    objects that hold those records into the cache (``will_need(indices, wait=True)``
    returns once they are there); a sharded store hands each shard its positions.
    Callers go through :func:`will_need`, which does nothing for stores that cannot
    (legacy). One driver decides what to hint ahead of the reads
    (:class:`gluon_data.sampling.hints.HintAhead`): ``gluon_data.DataLoader`` hints each
    batch through it, ``PrefetchSampler`` the sampler's next indices.
    """

    location: str
    split: Optional[str]
    meta: Optional[dict]

    def __len__(self) -> int:
        """Number of records."""

    def key(self, i: int) -> int:
        """The record's key (the ``.idx`` key, the LMDB position) at position ``i``."""

    def offset(self, i: int) -> Optional[int]:
        """Byte offset of record ``i`` in its container where that means something (errors
        name it), else ``None``."""

    def read(self, i: int) -> bytes:
        """Payload of record ``i`` as an owned ``bytes``."""

    def view(self, i: int) -> Buffer:
        """Payload of record ``i``, possibly a zero-copy view valid only until the calling
        thread's next read from this store: parse or copy it before then."""

    def scan(self) -> Iterator[Buffer]:
        """Every payload in position order, read sequentially (views as :meth:`view`)."""

    def identity(self) -> str:
        """A stamp of the bytes this store was opened on (the metadata's ``conversion_id``
        and the file's device/inode/size/mtime, or a remote object's version): the store
        compares it whenever it opens its handle anew (in a forked or spawned worker, after
        unpickling) and raises :class:`~gluon_data.errors.FormatError` naming the location
        when the dataset was replaced underneath it."""

    def __getstate__(self) -> dict:
        """Pickles carry the location, the options and at most what was already read (e.g.
        the index), never an OS handle; the copy reopens lazily and checks
        :meth:`identity`."""


def will_need(store: RecordStore, indices: Union[np.ndarray, Sequence[int]], *,
              wait: bool = False) -> None:
    """Tell ``store`` that the records at positions ``indices`` are about to be read: its
    ``will_need(indices)`` starts fetching them asynchronously where it has one (see the
    notes of :class:`RecordStore`); other stores are left alone. Never raises for a
    position out of range (the read that follows does).

    ``wait=True`` is the one way to wait for a hint (tests, benchmarks): a store that fetches
    in the background (remote, or sharded over remote shards) returns once the downloads the
    hint started or found in flight are done, raising the error of one that failed; a local
    store returns at once as always (the kernel's read-ahead is not waited for).

    Examples
    --------
    >>> store = open_store("voc_train.rec")
    >>> batch = [7, 3, 11]
    >>> will_need(store, batch)                  # returns at once; the device works meanwhile
    >>> payloads = [store.read(i) for i in batch]
    """
    hint = getattr(store, "will_need", None)
    if hint is not None:
        if wait:
            hint(indices, wait=True)
        else:
            hint(indices)


def valid_positions(indices: Union[np.ndarray, Sequence[int]], n: int) -> np.ndarray:
    """The ints (or :class:`~gluon_data.sampling.sampler.SampleKey`) of ``indices`` that are positions
    ``0 <= i < n`` of a store of ``n`` records, as an ``int64`` numpy array (for
    ``will_need``: the others are the later read's to report)."""
    import numpy as np
    pos = np.fromiter((int(i) for i in indices), np.int64)
    return pos[(pos >= 0) & (pos < n)]


# (priority, predicate(location) -> bool, opener(location, split, **options) -> RecordStore,
#  splits(location) -> list of split names, or None: the location holds one (split None))
_OPENERS: List[Tuple[int, Callable[[str], bool], Callable[..., RecordStore],
                     Optional[Callable[[str], List[str]]]]] = []
# modules whose import registers the built-in backends (imported on first open_store)
# (predicate(location) -> bool, reader(location, **options) -> bytes): who reads a small
# document (a shard manifest) at a location that is not a local path (the remote backend)
_READERS: List[Tuple[Callable[[str], bool], Callable[..., bytes]]] = []


def register_opener(predicate: Callable[[str], bool], opener: Callable[..., RecordStore],
                    priority: int = 0,
                    splits: Optional[Callable[[str], List[str]]] = None) -> None:
    """Make :func:`open_store` hand locations for which ``predicate(location)`` is true to
    ``opener(location, split, **options)``. Higher ``priority`` is asked first. A container
    that holds several splits also gives ``splits(location)`` (their names, for
    :func:`store_splits`)."""
    _OPENERS.append((priority, predicate, opener, splits))
    _OPENERS.sort(key=lambda t: -t[0])


def register_reader(predicate: Callable[[str], bool], reader: Callable[..., bytes]) -> None:
    """Make :func:`read_bytes` hand locations for which ``predicate(location)`` is true to
    ``reader(location, **options)`` (the remote backend registers URIs)."""
    _READERS.append((predicate, reader))


def read_bytes(location: str, **options: Any) -> bytes:
    """The bytes of the small document at ``location`` (a manifest): a local file, or an
    object read by the backend registered for it with the store ``options`` (the remote
    backend takes ``storage_options``, ``retries``, ``backoff`` and ignores the rest)."""
    location = os.fspath(location)
    for predicate, reader in _READERS:
        if predicate(location):
            return reader(location, **options)
    return read_input(location)


def open_store(location: Union[str, "os.PathLike[str]"], split: Optional[str] = None,
               **options: Any) -> RecordStore:
    """Open the store at ``location`` (a path or a URI) for ``split``.

    Parameters
    ----------
    location : str or os.PathLike
        A ``.rec``, an LMDB directory, a ``.shards.json`` manifest, or a URI.
    split : str, optional
        The split, for containers that hold several (LMDB); ``None`` takes the default.
    **options
        Backend options (e.g. ``storage_options`` for remote stores).

    Raises
    ------
    FileNotFoundError
        Nothing is at ``location``.
    FormatError
        Something is there, but no backend recognises it.
    """
    return _backend(location)[1](os.fspath(location), split, **options)


def store_splits(location: str) -> List[Optional[str]]:
    """The splits :func:`open_store` can open at ``location``: their names for containers
    that hold several (LMDB), ``[None]`` for one that holds one (a ``.rec``)."""
    splits = _backend(location)[2]
    return [None] if splits is None else list(splits(os.fspath(location)))


#: Files that belong to a dataset without being one: ``(suffix, what it is)``.
_PARTS = ((".idx.gdx", "the binary index"), (".idx", "the index"),
          (".meta.json", "the metadata"), (".resume.json", "a conversion's checkpoint"))
#: The files of an LMDB environment: ``(name, what it is)``.
_LMDB_PARTS = ((LMDB_DATA, "the LMDB data file"), (LMDB_LOCK, "the LMDB lock file"))


def dataset_part(location) -> Optional[Tuple[str, str]]:
    """``(what it is, the dataset to give)`` where ``location`` names a file of a dataset
    rather than the dataset (a ``.rec``'s index, binary index, metadata or checkpoint; an
    LMDB's ``data.mdb`` or ``lock.mdb``), else ``None``: the one check by which every
    command (info, stats, show, verify, salvage, convert) recognises such an input, and
    says which path to give instead of reporting a damaged dataset."""
    location = os.fspath(location)
    if is_uri(location):
        return None
    for suffix, what in _PARTS:
        if location.endswith(suffix):
            return what, location[:-len(suffix)] + ".rec"
    folder, name = os.path.split(location)
    for part, what in _LMDB_PARTS:
        if name == part and os.path.isfile(os.path.join(folder or ".", LMDB_DATA)):
            return what, folder or "."
    return None


def refuse_part(location) -> None:
    """A :class:`FormatError` naming ``location`` where it is a file of a dataset rather
    than the dataset (:func:`dataset_part`), saying what it is and which path to give."""
    part = dataset_part(location)
    if part is not None:
        what, dataset = part
        give = "the .rec" if dataset.endswith(".rec") else "the LMDB directory"
        raise FormatError("this is %s of a dataset, not a dataset: give %s (%s)"
                          % (what, give, dataset), os.fspath(location))


def _backend(location):
    location = os.fspath(location)
    refuse_part(location)  # a part of a dataset named instead of the dataset
    for _, predicate, opener, splits in _OPENERS:
        if predicate(location):
            return predicate, opener, splits
    if not is_uri(location) and not os.path.exists(location):
        raise FileNotFoundError("no dataset at %s" % location)
    raise FormatError("not a dataset gluon_data can read (expected a .rec with its .idx, an "
                      "LMDB directory, a .shards.json manifest or a supported URI)", location)
