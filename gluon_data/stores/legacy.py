"""Readers for LMDBs in layouts that predate gluon_data, for import with ``gluon-data convert``.

``raw-lmdb``
    The layout of the recipe this project started from: sub-databases ``<split>_data`` and
    ``<split>_label``, decimal-string keys (``b"0"``, ``b"1"``, ... ``b"10"``), values raw
    uint8 arrays whose shape is not stored (the user supplies it).
``caffe-lmdb``
    Caffe's ``convert_imageset``: the main database maps ``"%08d_<path>"`` keys to serialized
    ``caffe.Datum`` protobuf messages, either ``encoded`` (the image file's bytes) or raw
    ``channels x height x width`` uint8 data in BGR order.

Values are parsed as arrays or protobuf only; nothing is ever unpickled. Both iterators
yield ``(where, SourceError, None)`` for an item they cannot read, so the converter can skip
it (``--on-error skip``) and go on.

Read in place, both layouts are record stores (:class:`RecipeLMDBStore`,
:class:`CaffeLMDBStore`: ``open_store(path, split, layout="raw-lmdb", image_shape=...)``)
whose payloads are packed as :mod:`gluon_data.format.codec` records (raw arrays, or a Caffe
``Datum``'s encoded image bytes), so :class:`~gluon_data.RecipeLMDBDataset` and
:class:`~gluon_data.CaffeLMDBDataset` are the same datasets as the others over another
store. This module imports no MXNet.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple, Union  # noqa: F401

import functools
import os

import numpy as np

from ..format import codec
from ..errors import FormatError, SourceError
from ..storage.fileio import FILE_ID, stat_stamp
from ..storage.fsutil import LMDB_DATA
from .lmdbio import ProcessEnv, from_older_pickle, register_layout, shared_env
from .lmdb_env import env_stamp

__all__ = ["raw_lmdb_items", "caffe_lmdb_items", "datum_class", "LEGACY_LAYOUTS",
           "RecipeLMDBStore", "CaffeLMDBStore", "open_legacy_store"]

LEGACY_LAYOUTS = ("raw-lmdb", "caffe-lmdb")


def _subdbs(env) -> List[str]:
    with env.begin() as txn:
        return [bytes(k).decode("utf-8", "replace") for k, _ in txn.cursor()]


def _to_rgb(arr: np.ndarray, channels_first: bool, bgr: bool) -> np.ndarray:
    if arr.ndim == 2:
        arr = arr[:, :, None]
    elif channels_first:
        arr = arr.transpose(1, 2, 0)
    c = arr.shape[2]
    if c == 1:
        arr = np.repeat(arr, 3, axis=2)
    elif c == 4:
        arr = arr[:, :, :3]  # a 4th (alpha / extra) channel has no place in an RGB sample
    elif c != 3:
        raise ValueError("images must have 1, 3 or 4 channels, got %d" % c)
    if bgr:
        arr = arr[:, :, ::-1]
    return np.ascontiguousarray(arr)


def _reshape(value: bytes, shape: Sequence[int], where: str, what: str) -> np.ndarray:
    need = int(np.prod(shape))
    if len(value) != need:
        raise SourceError("%s holds %d bytes, but shape %s needs %d: wrong --%s-shape, or "
                          "not a raw uint8 array" % (what, len(value), tuple(shape), need, what),
                          where)
    return np.frombuffer(value, dtype=np.uint8).reshape(tuple(shape))


def raw_lmdb_items(path: str, split: str, image_shape: Sequence[int],
                   mask_shape: Optional[Sequence[int]] = None, channels_first: bool = False,
                   bgr: bool = False) -> Tuple[int, Iterator[Tuple[str, np.ndarray, np.ndarray]]]:
    """Count and iterate ``(where, rgb HxWx3, mask HxW)`` in numeric key order.

    ``image_shape`` is the stored shape: ``(H, W, C)``, or ``(C, H, W)`` with
    ``channels_first``, or ``(H, W)`` for grey. ``mask_shape`` defaults to ``(H, W)``.
    """
    if image_shape is None:
        raise SourceError("layout 'raw-lmdb' stores no shapes: pass --image-shape "
                          "(e.g. 256,256,3)", path)
    env = shared_env(path)
    names = _subdbs(env)
    dname, lname = split + "_data", split + "_label"
    if dname not in names:
        raise SourceError("no sub-database %r; found: %s (split = the part before _data)"
                          % (dname, ", ".join(names) or "none"), path)
    if lname not in names:
        raise SourceError("no sub-database %r beside %r: raw-lmdb imports image + mask pairs"
                          % (lname, dname), path)
    ddb = env.open_db(dname.encode(), create=False)
    ldb = env.open_db(lname.encode(), create=False)
    with env.begin(db=ddb) as txn:
        raw_keys = [bytes(k) for k in txn.cursor().iternext(values=False)]
    keyed = []
    for k in raw_keys:
        try:
            keyed.append((int(k.decode("ascii")), k))
        except (UnicodeDecodeError, ValueError):
            raise SourceError("key %r of %s is not a decimal record number" % (k, dname),
                              path) from None
    keyed.sort()
    shape = tuple(int(x) for x in image_shape)
    hw = (shape[1:3] if channels_first else shape[:2]) if len(shape) == 3 else shape
    mshape = tuple(int(x) for x in mask_shape) if mask_shape else hw

    def items():
        for _, k in keyed:
            where = "%s [%s/%s]" % (path, dname, k.decode())
            with env.begin() as txn:
                v = txn.get(k, db=ddb)
                lab = txn.get(k, db=ldb)
            try:
                img = _to_rgb(_reshape(v, shape, where, "image"), channels_first, bgr)
                if lab is None:
                    raise SourceError("no label under the same key in %s" % lname, where)
                mask = _reshape(lab, mshape, where, "mask")
                if mask.shape != img.shape[:2]:
                    raise SourceError("mask shape %s differs from image %s"
                                      % (mask.shape, img.shape[:2]), where)
            except SourceError as e:
                yield where, e, None  # the caller skips or fails; iteration goes on
                continue
            yield where, img, mask
    return len(keyed), items()


_DATUM = None


def datum_class():
    """The ``caffe.Datum`` message class, built from its descriptor (no protoc needed)."""
    global _DATUM
    if _DATUM is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        F = descriptor_pb2.FieldDescriptorProto
        fdp = descriptor_pb2.FileDescriptorProto(name="gluon_data/caffe_datum.proto",
                                                 package="caffe", syntax="proto2")
        msg = fdp.message_type.add(name="Datum")
        for name, num, typ, label in (("channels", 1, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("height", 2, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("width", 3, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("data", 4, F.TYPE_BYTES, F.LABEL_OPTIONAL),
                                      ("label", 5, F.TYPE_INT32, F.LABEL_OPTIONAL),
                                      ("float_data", 6, F.TYPE_FLOAT, F.LABEL_REPEATED),
                                      ("encoded", 7, F.TYPE_BOOL, F.LABEL_OPTIONAL)):
            msg.field.add(name=name, number=num, type=typ, label=label)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        _DATUM = message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe.Datum"))
    return _DATUM


def caffe_lmdb_items(path: str) -> Tuple[int, Iterator[Tuple[str, Union[bytes, np.ndarray],
                                                             float]]]:
    """Count and iterate ``(where, image, label)``: encoded bytes, or an RGB HxWx3 array."""
    env = shared_env(path)
    with env.begin() as txn:
        n = txn.stat()["entries"]

    def items():
        with env.begin() as txn:
            for k, v in txn.cursor():
                where = "%s [%s]" % (path, bytes(k).decode("utf-8", "replace"))
                try:
                    d = _parse_datum(v, where)
                    if d.encoded:
                        yield where, bytes(d.data), float(d.label)
                        continue
                    shape = (d.channels, d.height, d.width)
                    if min(shape) <= 0 or not d.data:
                        raise SourceError("Datum without pixel data (channels/height/width %s)"
                                          % (shape,), where)
                    arr = _reshape(bytes(d.data), shape, where, "image")
                    img = _to_rgb(arr, channels_first=True, bgr=d.channels == 3)
                except SourceError as e:
                    yield where, e, None  # the caller skips or fails; iteration goes on
                    continue
                yield where, img, float(d.label)
    return n, items()


def _parse_datum(value: bytes, where: str):
    from google.protobuf.message import DecodeError as PBDecodeError
    d = datum_class()()
    try:
        d.ParseFromString(bytes(value))
    except PBDecodeError as e:
        raise SourceError("value is not a caffe.Datum protobuf (%s)" % e, where) from None
    return d


class _LegacyStore:
    """Shared part of the legacy stores: lazy per-process environment, identity, scan."""

    meta: dict
    split: Optional[str]
    _n: int  # (set by each subclass's __init__)

    if TYPE_CHECKING:
        def read(self, i: int) -> bytes:
            """Payload of record ``i`` (each subclass defines it)."""

    def _init_env(self, path: str) -> None:
        """Bound, as an :class:`~gluon_data.stores.lmdbio.LMDBFile` is, to the environment
        as opened (:class:`ProcessEnv`: checked at the first read in each process, then at
        every read)."""
        self.path = os.fspath(path)
        self._identity = self._stamp()
        self._env = ProcessEnv(self.path, env_stamp(shared_env(self.path)))

    @property
    def location(self) -> str:
        return self.path

    def _stamp(self) -> str:
        try:
            st = os.stat(os.path.join(self.path, LMDB_DATA))
        except OSError as e:
            raise FormatError("cannot stat data.mdb (%s)" % e.strerror, self.path) from None
        return "-/%d:%d" % stat_stamp(st, FILE_ID)

    def identity(self) -> str:
        """Device and inode of ``data.mdb`` when opened (legacy layouts carry no id)."""
        return self._identity

    def __len__(self) -> int:
        return self._n

    def key(self, i: int) -> int:
        return int(i)

    def offset(self, i: int) -> Optional[int]:
        return None

    def view(self, i: int) -> bytes:
        return self.read(i)

    def scan(self) -> Iterator[bytes]:
        for i in range(self._n):
            yield self.read(i)

    def __setstate__(self, state):  # (a ProcessEnv pickles unresolved: checks on first read)
        state = from_older_pickle(state)
        state.pop("_checked", None)  # the dev:ino check of older versions: ProcessEnv's now
        self.__dict__.update(state)


class RecipeLMDBStore(_LegacyStore):
    """The recipe layout (``<split>_data`` / ``<split>_label``, keys ``str(i)``, raw uint8
    arrays of a shape the caller gives) as a segmentation record store.

    Each payload is a segmentation record holding the image as an RGB raw array and the
    mask as a raw array (no decode cost), unchecksummed.

    Parameters
    ----------
    path : str
    split : str, default 'train'
    image_shape : tuple of int
        Stored image shape, ``(H, W, C)`` or ``(C, H, W)`` with ``channels_first``.
    mask_shape : tuple of int, optional
        Stored mask shape (default: the image's ``(H, W)``).
    channels_first, bgr : bool
        Storage order of the image arrays.
    ignore_label : int, optional
        The mask value meaning "unlabelled" (recorded in :attr:`meta`).
    num_classes : int, optional
        Recorded in :attr:`meta` (``num_class`` of the dataset).

    Examples
    --------
    >>> s = RecipeLMDBStore("old.lmdb", "train", image_shape=(24, 32, 3))
    >>> codec.unpack(s.read(0)).mask[:4]
    b'GDRW'
    """

    def __init__(self, path: str, split: str = "train", *, image_shape=None, mask_shape=None,
                 channels_first: bool = False, bgr: bool = False,
                 ignore_label: Optional[int] = None, num_classes: Optional[int] = None):
        if image_shape is None:
            raise ValueError("image_shape is required: this layout does not store shapes")
        self.split = split
        path = os.fspath(path)
        env = shared_env(path)
        names = _subdbs(env)
        self._dname, self._lname = split + "_data", split + "_label"
        for name in (self._dname, self._lname):
            if name not in names:
                raise FormatError("no sub-database %r; found: %s" % (name, ", ".join(names)),
                                  path)
        counts = []
        for name in (self._dname, self._lname):
            with env.begin(db=env.open_db(name.encode(), create=False)) as txn:
                counts.append(txn.stat()["entries"])
        if counts[0] != counts[1]:
            raise FormatError("%s holds %d entries but %s holds %d"
                              % (self._dname, counts[0], self._lname, counts[1]), path)
        self._n = counts[0]
        self._shape = tuple(int(x) for x in image_shape)
        hw = ((self._shape[1:3] if channels_first else self._shape[:2])
              if len(self._shape) == 3 else self._shape)
        self._mshape = tuple(int(x) for x in mask_shape) if mask_shape else hw
        self._channels_first, self._bgr = channels_first, bgr
        self.meta = {"format": "gluon_data", "format_version": 1, "task": "segmentation",
                     "split": split, "num_records": self._n, "image_encoding": "raw",
                     "ignore_label": ignore_label, "num_classes": num_classes,
                     "layout": "raw-lmdb"}
        self._init_env(path)

    def _get(self, db: str, i: int) -> bytes:
        k = str(i).encode()
        v = self._env.get_value(k, db, record=i)
        if v is None:
            raise FormatError("key %r missing from %s: the recipe's keys are 0..%d"
                              % (k.decode(), db, self._n - 1), self.path, i)
        return v

    def read(self, i: int) -> bytes:
        i = int(i)
        if not -self._n <= i < self._n:  # as a list, and as the other stores
            raise IndexError("record %d out of range: %s holds %d records"
                             % (i, self.path, self._n))
        i %= self._n
        where = "%s [%s/%d]" % (self.path, self._dname, i)
        try:
            img = _to_rgb(_reshape(self._get(self._dname, i), self._shape, where, "image"),
                          self._channels_first, self._bgr)
            mask = _reshape(self._get(self._lname, i), self._mshape, where, "mask")
        except SourceError as e:
            raise FormatError(e.reason, self.path, i) from None
        return codec.pack_segmentation(codec.encode_raw(img), codec.encode_raw(mask), id=i,
                                       checksum=False)

    def __repr__(self):
        return "RecipeLMDBStore(%r, split=%r, %d records)" % (self.path, self.split, self._n)


class CaffeLMDBStore(_LegacyStore):
    """A Caffe ``convert_imageset`` LMDB as a classification record store.

    Payloads are classification records: an ``encoded`` Datum keeps its image bytes, raw BGR
    CHW data becomes an RGB raw array; the label is the Datum's. Keys are positions in the
    database's key order; errors name the Caffe key.

    Examples
    --------
    >>> s = CaffeLMDBStore("ilsvrc12_train_lmdb")
    >>> len(s), codec.unpack(s.read(0)).label
    (12, 0.0)
    """

    split = None

    def __init__(self, path: str):
        path = os.fspath(path)
        env = shared_env(path)
        with env.begin() as txn:
            self._keys = np.array([bytes(k) for k in txn.cursor().iternext(values=False)])
        if not len(self._keys):
            raise FormatError("the LMDB holds no records", path)
        self._n = len(self._keys)
        self.meta = {"format": "gluon_data", "format_version": 1, "task": "classification",
                     "num_records": self._n, "layout": "caffe-lmdb"}
        self._init_env(path)

    def caffe_key(self, i: int) -> str:
        """The Caffe key of record ``i`` (what errors name)."""
        return bytes(self._keys[int(i)]).decode("utf-8", "replace")

    def read(self, i: int) -> bytes:
        key = bytes(self._keys[int(i)])
        name = key.decode("utf-8", "replace")
        where = "%s [%s]" % (self.path, name)
        v = self._env.get_value(key, where=self.path, record=name)
        if v is None:
            raise FormatError("key vanished from the database", self.path, name)
        try:
            d = _parse_datum(v, where)
            if d.encoded:
                image = bytes(d.data)
            else:
                arr = _reshape(bytes(d.data), (d.channels, d.height, d.width), where, "image")
                image = codec.encode_raw(_to_rgb(arr, channels_first=True, bgr=d.channels == 3))
        except SourceError as e:
            raise FormatError(e.reason, self.path, name) from None
        return codec.pack_classification(float(d.label), image, id=int(i), checksum=False)

    def __repr__(self):
        return "CaffeLMDBStore(%r, %d records)" % (self.path, self._n)


def open_legacy_store(path: str, split: Optional[str] = None, *, layout: str, **options):
    """A legacy LMDB read in place: ``layout`` is ``'raw-lmdb'`` (options as
    :class:`RecipeLMDBStore`) or ``'caffe-lmdb'`` (no options, no split)."""
    if layout == "raw-lmdb":
        return RecipeLMDBStore(path, split or "train", **options)
    if layout == "caffe-lmdb":
        if options:
            raise TypeError("a caffe-lmdb store takes no options, got %s"
                            % ", ".join(sorted(options)))
        if split is not None:
            raise ValueError("a Caffe LMDB holds one split; got split=%r" % (split,))
        return CaffeLMDBStore(path)
    raise ValueError("unknown LMDB layout %r; valid: gluon_data, %s"
                     % (layout, ", ".join(LEGACY_LAYOUTS)))


for _layout in LEGACY_LAYOUTS:  # open_store(path, split, layout=...) reaches us through lmdbio
    register_layout(_layout, functools.partial(open_legacy_store, layout=_layout))
