"""What a path holds and whether we may replace it: the kinds of output gluon_data writes,
how each is recognised (sniffers, :func:`register_sniffer`), :func:`classify_location`,
:func:`check_disjoint` (no output inside an input) and :func:`check_replaceable` (the
``--overwrite`` rule: only our own output of the same kind, never a link)."""
from __future__ import annotations

import os
import stat
from typing import Callable, Dict, Iterable

from ..errors import OutputError
from .codec import RECORDIO_MAGIC
from .headers import PNG_SIGNATURE
from .documents import parse_json
from ..storage.fsutil import _lmdb_dir_only
from ..storage.remotefs import is_uri

__all__ = ["check_replaceable", "is_ours", "register_sniffer", "KINDS", "classify_location",
           "LOCATIONS", "check_disjoint"]

_RECORDIO_MAGIC = RECORDIO_MAGIC.to_bytes(4, "little")
_INDEX_CHARS = frozenset(b"0123456789+-\t\n\r ")

#: What each kind of output looks like, in the words of the refusal message.
KINDS = {
    "rec": "a RecordIO data file (.rec)",
    "idx": "a RecordIO index (.idx)",
    "meta": "a gluon_data metadata document (.meta.json)",
    "gdx": "a gluon_data binary index (.idx.gdx)",
    "lmdb": "a gluon_data LMDB dataset (a directory holding only data.mdb with gluon_data "
            "metadata)",
    "png": "a PNG image",
    "image": "an image file (PNG, JPEG, BMP, TIFF, WebP)",
    "checkpoint": "a gluon_data resume checkpoint (.resume.json)",
    "manifest": "a shard manifest (.shards.json)",
}

#: What :func:`classify_location` can find at a location, in the words of error messages.
LOCATIONS = dict(KINDS, **{
    "rec": "a RecordIO data file (.rec)",
    "lmdb": "an LMDB environment (a directory holding data.mdb)",
    "uri": "a URI (a dataset in object storage)",
    "folder": "a folder (not a dataset: a source layout to convert)",
    "lst": "an im2rec list (.lst)",
    "file": "a file that is not a dataset",
    "missing": "nothing: no such file or folder",
})
_MANIFEST_SUFFIX = ".shards.json"  # gluon_data.stores.shards.MANIFEST_SUFFIX (shards imports us)


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)



# kind -> sniff(path): whether the content is our output of that kind, for the kinds whose
# content only their container's module can read (an LMDB's ``__meta__``): that module
# registers its sniffer when imported, so this layer knows no container format.
_SNIFFERS: Dict[str, Callable[[str], object]] = {}


def register_sniffer(kind: str, sniff: Callable[[str], object]) -> None:
    """Make :func:`is_ours` ask ``sniff(path)`` whether ``path`` holds our output of
    ``kind`` (one of :data:`KINDS`), after the checks made here (no link, the right file
    type). A true result means ours; a false one or any exception means not ours."""
    if kind not in KINDS:
        raise ValueError("unknown output kind %r" % (kind,))
    _SNIFFERS[kind] = sniff


def is_ours(path: str, kind: str) -> bool:
    """Whether ``path`` (which exists) is recognisably gluon_data output of ``kind``.

    Only content is trusted, never the name: a ``.rec`` must start with the RecordIO magic
    word, an index must be index text, metadata must say ``"format": "gluon_data"``, an LMDB
    directory must hold nothing but ``data.mdb``/``lock.mdb`` and carry our ``__meta__`` (read
    by the sniffer :mod:`gluon_data.stores.lmdbio` registers, see :func:`register_sniffer`).
    A symbolic link is never ours.
    """
    if kind not in KINDS:
        raise ValueError("unknown output kind %r" % (kind,))
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    if kind == "lmdb":
        if not _lmdb_dir_only(path) or not os.path.isfile(os.path.join(path, "data.mdb")):
            return False
        sniff = _SNIFFERS.get("lmdb")  # registered by gluon_data.stores.lmdbio (reads __meta__)
        if sniff is None:  # the module that could tell is not loaded: never assume ours
            return False
        try:
            return bool(sniff(path))
        except Exception:  # FormatError, lmdb.Error, OSError...: not a dataset of ours
            return False
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        if kind == "rec":
            return _head(path, 4) == _RECORDIO_MAGIC
        if kind == "idx":
            head = _head(path, 4096)
            return bool(head) and set(head) <= _INDEX_CHARS
        if kind == "gdx":
            return _head(path, 5) == b"GDIDX"
        if kind == "png":
            return _head(path, 8) == PNG_SIGNATURE
        if kind == "image":
            h = _head(path, 12)
            return (h.startswith((PNG_SIGNATURE, b"\xff\xd8\xff", b"BM", b"II*\x00", b"MM\x00*"))
                    or (h[:4] == b"RIFF" and h[8:12] == b"WEBP"))
        if st.st_size > 64 << 20:
            return False
        with open(path, "rb") as f:
            doc = parse_json(f.read(), "document", path)  # FormatError is a ValueError
        if kind == "meta":
            return isinstance(doc, dict) and doc.get("format") == "gluon_data"
        if kind == "manifest":
            return isinstance(doc, dict) and doc.get("format") == "gluon_data-shards"
        return isinstance(doc, dict) and "digest" in doc  # checkpoint
    except (OSError, ValueError):
        return False


def classify_location(location) -> str:
    """What ``location`` holds, one key of :data:`LOCATIONS`: ``'uri'``, ``'missing'``,
    ``'lmdb'`` (a directory holding ``data.mdb``, ours or a legacy layout), ``'folder'``,
    ``'manifest'`` (a ``.shards.json`` name, or a manifest's content), ``'rec'`` (a ``.rec``
    name, or the RecordIO magic: a ``.rec`` whose head is damaged is still one), ``'gdx'``,
    ``'meta'``, ``'idx'``, ``'checkpoint'``, ``'lst'`` or ``'file'``. A link is classified by
    what it leads to. Every command that takes a location asks this, and refuses the kinds
    it cannot handle before it touches anything."""
    location = os.fspath(location)
    if is_uri(location):
        return "uri"
    if not os.path.exists(location):
        return "missing"
    real = os.path.realpath(location)
    if os.path.isdir(real):
        return "lmdb" if os.path.isfile(os.path.join(real, "data.mdb")) else "folder"
    name = location.rstrip("/")
    if name.endswith(_MANIFEST_SUFFIX):
        return "manifest"
    for kind in ("rec", "gdx"):  # (their magic: a few bytes read)
        if is_ours(real, kind):
            return kind
    if name.endswith(".rec"):
        return "rec"
    if name.endswith(".lst"):
        return "lst"
    if name.endswith(".idx") or is_ours(real, "idx"):
        return "idx"
    try:
        json_like = _head(real, 64).lstrip().startswith(b"{")
    except OSError:
        json_like = False
    for kind in ("manifest", "meta", "checkpoint") if json_like else ():
        if is_ours(real, kind):
            return kind
    return "file"


def _identity(path: str):
    """``(st_dev, st_ino)`` of what ``path`` leads to, or None where nothing is."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_disjoint(writes: Iterable[str], reads: Iterable[str]) -> None:
    """Refuse an output that is, or shares a file with, its input, before anything is
    written: none of the paths in ``writes`` (what a command would write or replace) may be
    one of the files in ``reads`` (what it reads), compared by real path and by
    ``(st_dev, st_ino)`` (so a symbolic or hard link to an input file is that file).

    Raises
    ------
    OutputError
        Naming the output path and the input file it is.
    """
    inodes, real = {}, {}
    for r in map(os.fspath, reads):
        ident = _identity(r)  # only files that exist are read
        if ident is not None:
            inodes.setdefault(ident, r)
            real.setdefault(os.path.realpath(r), r)
    for w in writes:
        w = os.fspath(w)
        same = real.get(os.path.realpath(w)) or inodes.get(_identity(w))
        if same is not None:
            what = "is a file of the input" if os.path.abspath(w) == os.path.abspath(same) \
                else "is the input's file %s (a link: the same file)" % same
            raise OutputError("the output %s, which the command reads: it would be replaced "
                              "while it is read; nothing was written: write the output to "
                              "another name or folder" % what, w)


#: How a refusal of an existing output names the way to replace it: the one wording, read
#: alike on the command line (the flag) and in Python (the ``overwrite`` option).
OVERWRITE_OPTION = "the overwrite option (--overwrite)"


def exists_refusal(path: str, detail: str = "", option: str = OVERWRITE_OPTION
                   ) -> FileExistsError:
    """The one refusal of an existing output without overwrite, raised before anything is
    written (and before a progress bar is drawn): ``"PATH already exists[DETAIL]; nothing was
    written: set the overwrite option (--overwrite) to replace it"``. The command line shows
    it as it is, so it names no Python keyword argument."""
    return FileExistsError("%s already exists%s; nothing was written: set %s to replace it"
                           % (path, detail, option))


def check_replaceable(path: str, kind: str, overwrite: bool, *,
                      option: str = OVERWRITE_OPTION) -> None:
    """Refuse to replace ``path`` unless that is safe; do nothing if it does not exist.

    Raises
    ------
    OutputError
        ``path`` is a symbolic link (never replaced nor written through), or it exists and
        is not gluon_data's own output of ``kind`` (``overwrite`` does not cover it).
    FileExistsError
        ``path`` is ours but ``overwrite`` is false.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    if os.path.islink(path):
        raise OutputError("is a symbolic link (to %s); gluon-data never replaces a link nor "
                          "writes through one: give the real path, or remove the link"
                          % os.readlink(path), path)
    if not overwrite:
        raise exists_refusal(path, option=option)
    if not is_ours(path, kind):
        raise OutputError("exists and is not %s written by gluon-data; --overwrite only "
                          "replaces gluon-data's own outputs, so it was left untouched: move "
                          "it away or choose another output name" % KINDS[kind], path)
