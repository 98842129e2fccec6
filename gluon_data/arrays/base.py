"""The base of the task datasets: a map-style dataset over one record store, without MXNet.

:class:`StoreDataset` holds what :class:`~gluon_data.arrays.datasets.ClassificationDataset` and
:class:`~gluon_data.arrays.datasets.SegmentationDataset` share (and through them the Gluon
datasets of :mod:`gluon_data.gluon.taskdatasets`, which subclass them): the store and its
metadata (the task checked), the checksum policy, positions of a ``shard()``, sample keys and
the per-sample random context, read-ahead hints, one record read and unpacked with its file,
key and offset named in every error, and pickling for loader workers.

Where a sample's arrays come from and what they are returned as is four small hooks, so one
code path makes every sample: :meth:`StoreDataset._buffer` (an output buffer),
:meth:`StoreDataset._emit` (a filled buffer as the caller's array), :meth:`StoreDataset._out`
(any other array as the caller's array) and :meth:`StoreDataset._task_class` (the class
to name when a store holds the other task). Here they give numpy arrays; the Gluon datasets
give NDArrays over pooled buffers.

:func:`as_store` opens a path or URI (``split``, and ``remote``: the
:class:`~gluon_data.storage.options.RemoteOptions` of a URI) or takes a store as it is;
:func:`open_location` is what the Gluon public views open with.
"""
from __future__ import annotations

import copy
import errno
import os
import threading
from typing import Any, Callable, Iterable, List, Optional, Tuple, TypeVar, Union, cast

import cv2
import numpy as np

from ..errors import CorruptRecordError, DecodeError, FormatError
from ..format import codec
from ..format.meta import ids_are_keys, wrong_record
from ..sampling.sampler import SampleKey, split_key
from ..sampling.seeding import loader_round
from ..storage.options import RemoteOptions, refuse_unknown, take_grouped
from ..storage.perprocess import PerProcess, ProcessMark, reuse_freed_memory
from ..stores.base import RecordStore, is_uri, open_store, will_need
from ..format.layout import missing_rec_hint
from . import transforms as T

__all__ = ["as_store", "open_location", "container_of", "in_worker", "remote_options",
           "MASK_DTYPES"]

#: The mask dtypes a :class:`SegmentationDataset` returns (``mask_dtype``); int32 by default.
MASK_DTYPES = ("uint8", "int16", "int32")

#: a dataset of :meth:`StoreDataset.shard`'s own type
_D = TypeVar("_D", bound="StoreDataset")

# Whether this process is a loader's worker, decided (and OpenCV set up) on its first read.
_SETUP: PerProcess = PerProcess()


def in_worker(made_in: ProcessMark) -> bool:
    """Whether this process is a loader's worker for a dataset made in ``made_in``: any
    process other than the one that made it (a Gluon or PyTorch ``DataLoader`` worker, a
    ``Pool`` process, forked or spawned, reads a copy). A training process started by
    :mod:`multiprocessing` (``torch.multiprocessing.spawn``) that makes its own dataset is
    that dataset's main process."""
    return not made_in.here()


def _setup_process(made_in: ProcessMark) -> bool:
    """Once per process, on a dataset's first read: in a worker (:func:`in_worker`) OpenCV
    runs single-threaded, so N workers do not each start a thread pool of their own that
    competes with the others and with the training process. The main process keeps what
    its user set. ``setNumThreads(0)`` (sequential, no pool) and not ``1``: a forked child
    that reconfigures a pool whose threads it did not inherit waits forever on their
    condition variables (OpenCV 4 and 5), and the parent's pool is often running when a
    loader forks its workers. Its allocator keeps the pages of freed sample buffers for the
    next sample (:func:`~gluon_data.storage.perprocess.reuse_freed_memory`)."""
    worker = in_worker(made_in)
    if worker:
        cv2.setNumThreads(0)
        reuse_freed_memory()  # the per-sample buffers reuse their pages (no page faults)
    return worker


def container_of(store: RecordStore) -> str:
    """``'lmdb'`` for a store of one split of an LMDB environment, ``'rec'`` otherwise."""
    return "lmdb" if store.split is not None else "rec"


def open_location(cls: str, location: Union[str, "os.PathLike[str]"],
                  split: Optional[str] = None, *, remote: Optional[RemoteOptions] = None,
                  **deprecated: Any) -> RecordStore:
    """``open_store(location, split)`` for the dataset class named ``cls``, with the
    :class:`~gluon_data.storage.options.RemoteOptions` that were given (or a dict of them;
    the old ``storage_options=``, ``cache_dir=``, ``cache_limit=`` still work, deprecated);
    for a local ``location`` any of them is a ``ValueError`` naming it (an empty
    ``storage_options`` configures nothing and counts as not given, as in pandas)."""
    remote = cast(RemoteOptions, take_grouped(RemoteOptions, remote, "open_location", "remote",
                                              deprecated))
    refuse_unknown("open_location", deprecated)
    given = remote.given()
    if given and not is_uri(location):
        one = len(given) == 1
        raise ValueError("%s(%r, %s=...): %s %s only to a dataset in object storage (a URI "
                         "such as s3://bucket/train.rec); a local path reads without %s"
                         % (cls, str(location), "=..., ".join(given), " and ".join(given),
                            "applies" if one else "apply", "it" if one else "them"))
    return open_store(location, split, **given)


def as_store(cls: str, source: Union[RecordStore, str, "os.PathLike[str]"],
             split: Optional[str] = None, *, remote: Optional[RemoteOptions] = None,
             **deprecated: Any) -> RecordStore:
    """The store a dataset named ``cls`` reads: ``source`` itself when it is a
    :class:`~gluon_data.stores.base.RecordStore` (then ``split`` and the remote options are a
    ``ValueError``: the store is open already), else :func:`open_location` of the path or
    URI. A local path that does not exist is a ``FileNotFoundError`` naming it, whatever
    container it would have been. ``remote`` as for :func:`open_location`."""
    remote = take_grouped(RemoteOptions, remote, "as_store", "remote", deprecated)
    refuse_unknown("as_store", deprecated)
    if isinstance(source, RecordStore):
        given = [k for k, v in [("split", split)] + [(n, getattr(remote, n))
                                                      for n in RemoteOptions.names()]
                 if v is not None]
        if given:
            raise ValueError("%s(store, %s=...): the store %s is open already; give %s to "
                             "open_store, or give the dataset its path instead"
                             % (cls, "=..., ".join(given), source.location,
                                " and ".join(given)))
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("%s needs a record store (gluon_data.stores.base.open_store) or the "
                        "path or URI of a dataset, got %r" % (cls, source))
    if not is_uri(source) and not os.path.exists(source):
        raise FileNotFoundError(errno.ENOENT, "%s: no dataset at this path%s"
                                % (cls, missing_rec_hint(os.fspath(source))), os.fspath(source))
    return open_location(cls, source, split, remote=remote)


def remote_options(owner: str, remote: Union[RemoteOptions, dict, None],
                   deprecated: dict) -> RemoteOptions:
    """The ``remote=`` of a dataset (or a dataset view) named ``owner``, or the separate
    keywords it took before (deprecated, the warning pointing at the caller's line: this is
    called from the dataset's ``__init__``); any other keyword is Python's ``TypeError``."""
    remote = cast(RemoteOptions, take_grouped(RemoteOptions, remote, owner, "remote", deprecated,
                                              stacklevel=4))
    refuse_unknown(owner, deprecated)
    return remote


def check_mask_dtype(name: str, ignore_value: Optional[int], ignore_label: Optional[int],
                     num_classes: Optional[int], filename: str) -> np.dtype:
    """The checked ``mask_dtype`` of a segmentation dataset (one of :data:`MASK_DTYPES`),
    and its ``ignore_value`` checked beside it: one that is a class id is refused (the
    ignored pixels would be returned, and trained, as that class)."""
    if name not in MASK_DTYPES:
        raise ValueError("unknown mask_dtype %r; valid: %s" % (name, ", ".join(MASK_DTYPES)))
    dtype = np.dtype(name)
    info = np.iinfo(dtype)
    returned = ignore_label if ignore_value is None else ignore_value
    if returned is not None and not info.min <= returned <= info.max:
        raise ValueError("mask_dtype=%r cannot hold the ignore value %d: give ignore_value=%s "
                         "(or ignore_value=None, the stored %s), or a wider mask_dtype"
                         % (name, returned, ignore_label if ignore_label is not None and
                            info.min <= ignore_label <= info.max else info.max, ignore_label))
    if num_classes is not None and int(num_classes) - 1 > info.max:
        raise ValueError("%s records %d classes, more than mask_dtype=%r holds; use 'int32'"
                         % (filename, int(num_classes), name))
    if (ignore_value is not None and num_classes is not None and ignore_value != ignore_label
            and 0 <= ignore_value < int(num_classes)):
        raise ValueError("ignore_value=%d is the id of class %d of the %d in %s: the ignored "
                         "pixels would train as that class; give -1 (gluoncv's), 255 (with "
                         "mask_dtype='uint8') or None (the stored value)"
                         % (ignore_value, ignore_value, int(num_classes), filename))
    return dtype


class StoreDataset:
    """Shared machinery: the store, metadata, checksum policy, sample keys, error context."""

    _task = "classification"

    def __init__(self, store: RecordStore, *, seed: Optional[int], verify: bool,
                 max_pixels: Optional[int]):
        super().__init__()
        if not isinstance(store, RecordStore):
            raise TypeError("expected a record store (see gluon_data.stores.base.open_store), "
                            "got %r" % (store,))
        self._file = store
        self._made_in = ProcessMark()  # (travels with a pickle: a worker's copy knows it)
        self.filename = store.location
        self.meta = store.meta
        if self.meta is None and self._task == "segmentation":
            raise FormatError("no metadata beside it (%s): not a gluon_data segmentation "
                              "dataset; create one with `gluon-data convert`"
                              % (os.path.splitext(self.filename)[0] + ".meta.json"),
                              self.filename)
        if self.meta is not None and self.meta["task"] != self._task:
            raise FormatError("this is a %s dataset; open it with %s"
                              % (self.meta["task"], self._task_class(self.meta["task"])),
                              self.filename)
        self._verify = verify
        self._checksummed = bool(self.meta and self.meta.get("checksum") == "crc32-id2")
        # a conversion that says so decoded every image strictly (or encoded it) before it
        # sealed the record: a record whose checksum is verified holds bytes proven to
        # decode, and a region decode may stop after the rows it needs (strict=False)
        self._proven = (self._checksummed and bool(verify)
                        and (self.meta or {}).get("images_checked") == "strict")
        self._ids_are_keys = ids_are_keys(self.meta, container_of(store))
        self._max_pixels = max_pixels
        self.seed = seed
        self._positions: Optional[np.ndarray] = None  # store positions of a shard()
        # per-index request counts of plain ints, with their lock: this process's own (a
        # forked worker starts afresh, as a spawned one does)
        self._passes: PerProcess = PerProcess()

    # ------------------------------------------------------------------ output hooks
    def _task_class(self, task: str) -> str:
        """The class to read a store of ``task`` with (named when the task is the other)."""
        return "gluon_data.arrays.%sDataset" % task.capitalize()

    def _buffer(self, shape, dtype) -> np.ndarray:
        """A writable, C-contiguous, uninitialised buffer for one output array."""
        return np.empty(shape, dtype)

    def _emit(self, buf: np.ndarray):
        """A buffer from :meth:`_buffer`, filled, as the array the sample returns."""
        return buf

    def _out(self, x: np.ndarray, dtype):
        """Any other array as the array the sample returns (writable, C-contiguous,
        ``dtype``; a copy only where ``x`` is not that already)."""
        x = np.ascontiguousarray(x, dtype=dtype)
        return x if x.flags.writeable else x.copy()

    def _tensor(self, fast, img: np.ndarray):
        """``fast(img)`` (an :class:`~gluon_data.arrays.tensorize.ImageCropNormalize`) into an
        output buffer, or ``None`` without ``fast`` or when its mean/std do not fit the
        image's channels (the caller's fallback then runs)."""
        if fast is None or fast.tensor.channels not in (1, img.shape[2]):
            return None
        buf = self._buffer(fast.out_shape(img.shape), np.uint8 if fast.uint8 else np.float32)
        return self._emit(fast(img, out=buf))

    # ------------------------------------------------------------------ the store
    @property
    def store(self) -> RecordStore:
        """The record store this dataset reads."""
        return self._file

    def __len__(self) -> int:
        return len(self._file) if self._positions is None else len(self._positions)

    def shard(self: _D, num_shards: int, index: int) -> _D:
        """Gluon's ``shard`` (the ``index``-th of ``num_shards`` contiguous parts), as a dataset
        of this same type with its options, fast paths and attributes. Random draws still use
        each sample's index in the whole store, so a sample is the same in any shard layout."""
        if not (isinstance(num_shards, int) and isinstance(index, int)
                and num_shards > 0 and 0 <= index < num_shards):
            raise ValueError("shard(num_shards, index) needs 0 <= index < num_shards, got "
                             "num_shards=%r, index=%r" % (num_shards, index))
        n = len(self)
        size, rest = divmod(n, num_shards)
        start = size * index + min(index, rest)
        end = start + size + (index < rest)
        positions = np.arange(n) if self._positions is None else self._positions
        clone = copy.copy(self)
        clone._positions = positions[start:end].copy()
        return clone

    @property
    def classes(self) -> Optional[List[str]]:
        """Class names from the metadata (``None`` for stock files)."""
        return None if self.meta is None else self.meta.get("classes")

    def _position(self, idx) -> Tuple[int, Optional[int]]:
        """``(position, epoch)`` of an int or a :class:`~gluon_data.sampling.sampler.SampleKey`."""
        i, epoch = split_key(idx)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("index %d out of range for %d records" % (int(idx), n))
        return (i if self._positions is None else int(self._positions[i])), epoch

    def will_need(self, indices: Iterable[Union[int, SampleKey]]) -> None:
        """Start fetching the records of the samples ``indices`` (ints or
        :class:`~gluon_data.sampling.sampler.SampleKey`, e.g. the batch about to be read) from the
        device asynchronously, where the store can (:func:`gluon_data.stores.base.will_need`);
        returns at once and changes nothing a read returns. ``gluon_data.DataLoader`` calls
        it with every batch."""
        n = len(self)
        pos = [i + n if i < 0 else i for i in (split_key(k)[0] for k in indices)]
        pos = [i for i in pos if 0 <= i < n]
        if self._positions is not None:
            pos = self._positions[pos].tolist()
        will_need(self._file, pos)

    def _sample(self, i: int, epoch: Optional[int]) -> T.sample_context:
        """The context a sample's random transforms draw in. A plain int (``epoch=None``)
        counts as epoch ``k`` on its ``k``-th request in this process (plus, in a worker of
        PyTorch's ``DataLoader``, :func:`~gluon_data.sampling.seeding.loader_round`): later
        passes are reproducible within one process (``num_workers=0``, ``thread_pool=True``)
        — give :class:`~gluon_data.sampling.sampler.SampleKey` for the rest."""
        if epoch is None:  # (in a new torch worker of each epoch, its loader's round too)
            lock, passes, round_ = self._passes.get(self._no_passes)
            with lock:
                epoch = int(passes[i]) + round_
                passes[i] += 1
        return T.sample_context(epoch, i)

    def _no_passes(self) -> Tuple[threading.Lock, np.ndarray, int]:
        """A process's first plain-int request: every record at pass 0, and the loader round
        this process serves (:func:`~gluon_data.sampling.seeding.loader_round`: a worker's
        for its life)."""
        return threading.Lock(), np.zeros(len(self._file), np.uint32), loader_round()

    def _record(self, i: int):
        _SETUP.get(lambda: _setup_process(self._made_in))
        key, offset = self._file.key(i), self._file.offset(i)
        payload = self._file.view(i)  # parsed (and image/mask copied out) before the next read
        rec = codec.unpack(payload, segmentation=self._task == "segmentation",
                           verify=self._verify, path=self.filename, key=key, offset=offset)
        if self._checksummed and self._verify and rec.checksum is None:
            raise CorruptRecordError("checksum missing: metadata promises a CRC-32 in every "
                                     "record's id2 field", self.filename, key, offset)
        if self._ids_are_keys and rec.id != key:
            raise CorruptRecordError(wrong_record(rec.id, key), self.filename, key, offset)
        return rec, key, offset

    def _decode(self, fn: Callable, buf, key, offset, what: str, **kw):
        try:
            return fn(buf, max_pixels=self._max_pixels, what=what, **kw)
        except DecodeError as e:
            raise DecodeError(e.reason, self.filename, key, offset) from None

    def __getstate__(self):
        """The store pickles its location (no index); the per-record request counts of
        plain-int access are this process's own (4 bytes a record, held by
        :class:`~gluon_data.storage.perprocess.PerProcess`): a copy starts afresh."""
        return self.__dict__.copy()

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_made_in", ProcessMark(0))  # (an older pickle: a copy)
        self.__dict__.setdefault("_proven", False)  # (an older pickle: decoded strictly)
        if not isinstance(state.get("_passes"), PerProcess):  # (an older pickle's None)
            self._passes = PerProcess()
        self.__dict__.pop("_passes_lock", None)

    def __repr__(self) -> str:
        classes = self.classes
        shown = "" if classes is None else ", classes=%s" % (
            classes if len(classes) <= 8 else classes[:8] + ["... %d more" % (len(classes) - 8)])
        split = "" if self._file.split is None else ", split=%r" % self._file.split
        return "%s(%r%s, %d records%s)" % (type(self).__name__, self.filename, split, len(self),
                                           shown)
