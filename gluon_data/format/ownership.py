"""What a path holds and whether we may replace it: the kinds of output gluon_data writes,
how each is recognised (sniffers, :func:`register_sniffer`), :func:`classify_location`,
:func:`check_disjoint` (no output inside an input) and :func:`check_replaceable` (the
``--overwrite`` rule: only our own output of the same kind, never a link).
:func:`location_ownership` is the one rule of "is this ours" for a document, at a path or a
URI alike: the caller brings the bytes (this layer opens no remote object)."""
from __future__ import annotations

import os
import stat
from typing import Callable, Dict, Iterable, NamedTuple, Optional

from ..errors import FormatError, GluonDataError, OutputError
from .codec import RECORDIO_MAGIC
from .headers import JPEG_SOI, PNG_SIGNATURE
from .layout import MANIFEST_SUFFIX, SEGMENT_SUFFIX
from .documents import KINDS as DOCUMENTS, NUMBER, Doc, F, load_document, parse_json, register
from ..storage.fileio import FILE_ID, open_regular, path_stamp
from ..storage.fsutil import LMDB_DATA, holds_only_lmdb, is_lmdb_dir
from ..storage.remotefs import is_uri

__all__ = ["check_replaceable", "is_ours", "register_sniffer", "KINDS", "classify_location",
           "LOCATIONS", "check_disjoint", "location_ownership", "Ownership", "DOCUMENT_LIMIT",
           "PREVIEW_MARK"]

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
    "preview": "a preview",  # (of gluon-data show: what its refusal's reason says)
    "checkpoint": "a gluon_data resume checkpoint (.resume.json)",
    "manifest": "a shard manifest (.shards.json)",
    "segments": "a gluon_data segment folder (a directory holding only .seg files)",
}

#: The mark a preview of ``gluon-data show`` carries near its start (a PNG's ``Software``
#: text, a JPEG's comment): what makes an image file ours to replace.
PREVIEW_MARK = b"gluon-data show"

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


def _head(path: str, n: int) -> bytes:
    with open_regular(path) as f:  # (checked regular by the caller; swapped since: refused)
        return f.read(n)


# --------------------------------------------------------------------------- documents
#: No document of ours is larger: a bigger one is not read, and not ours.
DOCUMENT_LIMIT = 64 << 20

#: The upload marker of a dataset at a URI (``PREFIX.uploading.json``, ``NAME.lmdb/
#: uploading.json``; FORMAT.md section 8): an upload of ours began and has not committed.
register("upload_marker", Doc("gluon_data upload marker", {"started": F(NUMBER)},
                              marker=("writer", "gluon_data"), noun="upload marker"))

# output kind -> the document kind (gluon_data.format.documents) its content must pass
_DOCUMENT_OF = {"meta": "meta", "manifest": "manifest", "checkpoint": "checkpoint"}


class Ownership(NamedTuple):
    """The verdict of :func:`location_ownership`: ``ours``, and if not, ``reason`` (what is
    wrong, for the refusal's message) and ``where`` (the document it is about, if any)."""
    ours: bool
    reason: str = ""
    where: Optional[str] = None

    @property
    def why(self) -> str:
        """``"WHERE: REASON"`` (or the reason alone)."""
        return "%s: %s" % (self.where, self.reason) if self.where else self.reason


def location_ownership(size: Callable[[str], Optional[int]], read: Callable[[str], bytes],
                       document: str, kind: str, marker: Optional[str] = None) -> Ownership:
    """The one rule of "is this location ours to replace", for a path and a URI alike.

    ``document`` names what says so (a local output's own file; the commit document of a
    dataset at a URI: its metadata, manifest or LMDB ``meta.json``), ``kind`` its document
    kind in :mod:`gluon_data.format.documents`. It is ours only if it passes
    :func:`~gluon_data.format.documents.load_document` with that kind's schema (its marker,
    version, fields and checksum): only content is trusted, never a name, and a document of
    ours that was damaged or altered is not recognisably ours. Where no document exists, an
    upload marker of ours at ``marker`` (an upload of ours that has not committed) makes the
    location ours.

    The caller reads: ``size(name)`` is the size of what is at ``name``, ``None`` where
    nothing is (a larger one than :data:`DOCUMENT_LIMIT` is not read); ``read(name)`` its
    bytes. Their errors (a remote call that failed) are the caller's: they propagate.
    """
    for where, doc_kind in ((document, kind), (marker, "upload_marker")):
        if where is None:
            continue
        n = size(where)
        if n is None:
            continue
        if n > DOCUMENT_LIMIT:
            return Ownership(False, "%d bytes, more than any %s of ours"
                             % (n, DOCUMENTS[doc_kind].title), where)
        raw = read(where)
        if len(raw) > DOCUMENT_LIMIT:  # (grew since it was measured)
            return Ownership(False, "larger than any %s of ours" % DOCUMENTS[doc_kind].title,
                             where)
        try:
            load_document(raw, doc_kind, where)
        except FormatError as e:  # not JSON, not ours, damaged or altered
            return Ownership(False, e.reason, where)
        return Ownership(True)  # (the document decides where there is one)
    return Ownership(False, "no %s at %s%s" % (
        DOCUMENTS[kind].title, document,
        ", nor an upload marker of ours at %s" % marker if marker is not None else ""))


def _local_size(path: str) -> Optional[int]:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _local_read(path: str) -> bytes:
    return _head(path, DOCUMENT_LIMIT + 1)


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
    word, an index must be index text, metadata, a manifest and a checkpoint must pass their
    document's schema check (:func:`location_ownership`, the rule documents at a URI follow
    too), an LMDB directory must hold nothing but ``data.mdb``/``lock.mdb`` and carry our
    ``__meta__`` (read by the sniffer :mod:`gluon_data.stores.lmdbio` registers, see
    :func:`register_sniffer`). A symbolic link is never ours.
    """
    return _ownership(path, kind).ours


def _ownership(path: str, kind: str) -> Ownership:
    """:func:`is_ours`, with why not (for the refusal of :func:`check_replaceable`)."""
    if kind not in KINDS:
        raise ValueError("unknown output kind %r" % (kind,))
    try:
        st = os.lstat(path)
    except OSError:
        return Ownership(False, "nothing there")
    if stat.S_ISLNK(st.st_mode):
        return Ownership(False, "a symbolic link")
    if kind == "lmdb":
        if not holds_only_lmdb(path) or not os.path.isfile(os.path.join(path, LMDB_DATA)):
            return Ownership(False, "not a directory holding only data.mdb (and lock.mdb)")
        sniff = _SNIFFERS.get("lmdb")  # registered by gluon_data.stores.lmdbio (reads __meta__)
        if sniff is None:  # the module that could tell is not loaded: never assume ours
            return Ownership(False)
        try:
            return Ownership(bool(sniff(path)))
        except Exception as e:  # FormatError, lmdb.Error, OSError...: not a dataset of ours
            return Ownership(False, getattr(e, "reason", None) or str(e))
    if kind == "segments":  # a writer's folder of segment files, nothing else
        if not stat.S_ISDIR(st.st_mode):
            return Ownership(False, "not a directory")
        with os.scandir(path) as entries:
            other = [e.name for e in entries if not (e.name.endswith(SEGMENT_SUFFIX)
                                                     and e.is_file(follow_symlinks=False))]
        return Ownership(not other, "it holds %s" % other[0] if other else "")
    if not stat.S_ISREG(st.st_mode):
        return Ownership(False, "not a regular file")
    try:
        if kind in _DOCUMENT_OF:
            return location_ownership(_local_size, _local_read, path, _DOCUMENT_OF[kind])
        if kind == "rec":
            return Ownership(_head(path, 4) == _RECORDIO_MAGIC)
        if kind == "idx":  # (an empty one, a crash's or a shard's that lost its only
            # line, lists nothing: replacing it loses nothing, and it stays of its plan)
            return Ownership(set(_head(path, 4096)) <= _INDEX_CHARS)
        if kind == "gdx":
            return Ownership(_head(path, 5) == b"GDIDX")
        if kind == "png":
            return Ownership(_head(path, 8) == PNG_SIGNATURE)
        h = _head(path, 512)  # "preview": an image of any other origin is never replaced
        ours = h.startswith((PNG_SIGNATURE, JPEG_SOI)) and PREVIEW_MARK in h
        return Ownership(ours, "" if ours else "it carries no mark of gluon-data show, which "
                         "every PNG or JPEG preview it writes carries")
    except (OSError, FormatError) as e:  # (swapped for a FIFO since the lstat: refused)
        return Ownership(False, "unreadable (%s)" % e)


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
        return "lmdb" if is_lmdb_dir(real) else "folder"
    name = location.rstrip("/")
    if name.endswith(MANIFEST_SUFFIX):
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
        if _claims(real, kind):
            return kind
    return "file"


def _claims(path: str, kind: str) -> bool:
    """Whether the JSON file ``path`` says it is a document of output ``kind`` (its
    ``format`` marker; a checkpoint: its ``digest``), valid or not: what it is, for
    :func:`classify_location` (a damaged metadata file is still named as metadata, and its
    reader says what is wrong), never whether it is ours (:func:`is_ours`)."""
    try:
        if os.path.getsize(path) > DOCUMENT_LIMIT:
            return False
        doc = parse_json(_head(path, DOCUMENT_LIMIT + 1), "document", path)
    except (OSError, ValueError):
        return False
    marker = DOCUMENTS[_DOCUMENT_OF[kind]].marker or ("digest", None)
    return isinstance(doc, dict) and marker[0] in doc and (
        marker[1] is None or doc[marker[0]] == marker[1])


def _identity(path: str):
    """``(st_dev, st_ino)`` of what ``path`` leads to, or None where nothing is."""
    return path_stamp(path, FILE_ID)


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
    inodes: Dict[tuple, str] = {}  # (st_dev, st_ino) -> the input path
    real: Dict[str, str] = {}  # real path -> the input path
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
                      option: str = OVERWRITE_OPTION, plan: Optional[str] = None,
                      recorded: Optional[Callable[[str], Optional[str]]] = None) -> None:
    """Refuse to replace ``path`` unless that is safe; do nothing if it does not exist. The
    one rule of "is this ours / of this plan" for every output a command writes.

    ``plan`` (with ``recorded(path)``: the plan the output at ``path`` records, ``None``
    where it records none or cannot be read): an output of ours that records this ``plan``
    is this plan's own to replace (a rerun finishing or redoing it), without ``overwrite``.
    Anything else needs ``overwrite``, and even then only our own output of ``kind`` is
    replaced (its content checked: a damaged or edited document is not recognisably ours).

    Raises
    ------
    OutputError
        ``path`` is a symbolic link (never replaced nor written through), or it exists and
        is not gluon_data's own output of ``kind`` (``overwrite`` does not cover it).
    FileExistsError
        ``path`` is ours (or not) but of no plan given here, and ``overwrite`` is false.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    if os.path.islink(path):
        raise OutputError("is a symbolic link (to %s); gluon-data never replaces a link nor "
                          "writes through one: give the real path, or remove the link"
                          % os.readlink(path), path)
    verdict = None
    if plan is not None:
        verdict = _ownership(path, kind)
        if verdict.ours and _recorded(recorded, path) == plan:
            return
    if not overwrite:
        raise exists_refusal(path, " and was not written by this plan" if plan is not None
                             else "", option=option)
    verdict = verdict or _ownership(path, kind)
    if not verdict.ours:
        raise OutputError("exists and is not %s written by gluon-data%s; --overwrite only "
                          "replaces gluon-data's own outputs, so it was left untouched: move "
                          "it away or choose another output name"
                          % (KINDS[kind], " (%s)" % verdict.reason if verdict.reason else ""),
                          path)


def _recorded(recorded: Optional[Callable[[str], Optional[str]]], path: str) -> Optional[str]:
    """The plan ``recorded(path)`` says the output records; ``None`` when it cannot tell."""
    if recorded is None:
        return None
    try:
        return recorded(path)
    except (GluonDataError, OSError, KeyError, TypeError, AttributeError):
        return None
