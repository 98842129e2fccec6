"""``ConvertOptions``: every option of a conversion in one documented object, read by the API
(:func:`gluon_data.convert`) and the command line (``gluon-data convert``) alike.

Each field carries its one help text and, where the command has a flag for it, a
:class:`Flag`: the parser adds ``gluon-data convert``'s option flags from these in one loop
(``gluon_data/cli/parser.py``), the command builds the object from the parsed flags in one
step, and the class docstring's parameters are written from the same texts."""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import re
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Union, cast

from ..format import codec
from ..storage.fileio import open_regular
from .sources import DEFAULT_MAX_FILE_BYTES

__all__ = ["ConvertOptions", "Flag", "LAYOUT_FIELDS", "SEGMENTATION_FIELDS", "SHARDED_READS",
           "LOCAL_READS", "COPY_READS", "reads_of",
           "check_layout_options", "checkpoint_every_default", "SHARD_FIELDS", "REMOTE_FIELDS", "LEGACY_FIELDS",
           "GROUPS", "cli_fields", "flag_name", "parse_shape", "read_classes", "refuse_unread",
           "deprecated_retries"]

#: The help sections of ``gluon-data convert`` other than its main one: title -> description.
GROUPS = {"sharding": "write N self-contained shards plus a manifest "
                      "OUTPUT_PREFIX.shards.json, one task per shard; a rerun skips finished "
                      "shards"}


class _Same:
    def __repr__(self) -> str:
        return "the field's default"


_SAME = _Same()


@dataclass(frozen=True)
class Flag:
    """How a :class:`ConvertOptions` field is spelled on ``gluon-data convert``.

    The field's own help text is the flag's help; a :class:`Flag` adds only what the command
    line needs besides it.

    Parameters
    ----------
    name : str, optional
        The flag (default: the field's name in dash-case, ``val_ratio`` -> ``--val-ratio``).
    type : callable, optional
        Text -> value, when the arguments are parsed (``int``, :func:`parse_shape`...); its
        ``ValueError`` is the usage error. Bool fields are switches and take none.
    choices : tuple of str, optional
        The valid values.
    metavar : str, optional
        The value's name in the usage line.
    default : optional
        The command's default where it differs from the field's; a callable is called when the
        parser is built (``--workers``: the CPU count).
    negate : bool
        A bool field the flag turns off (``--quiet`` sets ``progress`` to False, so the
        command's default is True).
    help : str, optional
        Only with ``negate``: what the flag does (the field's text says what the field does).
    group : str, optional
        The help section (a key of :data:`GROUPS`); the main one when omitted.
    read : callable, optional
        Applied to the parsed value when the command runs: for what may read files
        (``--classes``: :func:`read_classes`), whose errors are the command's, not usage
        errors.
    """

    name: Optional[str] = None
    type: Optional[Callable[[str], object]] = None
    choices: Optional[Tuple[str, ...]] = None
    metavar: Optional[str] = None
    default: object = _SAME
    negate: bool = False
    help: Optional[str] = None
    group: Optional[str] = None
    read: Optional[Callable[[Any], object]] = None

    def command_default(self, field: dataclasses.Field):
        """The command's default of ``field``: this flag's where it has one (called if
        callable; a negated switch's is True), else the field's."""
        if self.negate:
            return True
        default = field.default if self.default is _SAME else self.default
        return default() if callable(default) else default


def _option(default, help: str, flag: Optional[Flag] = Flag()):
    """A :class:`ConvertOptions` field: its default, its one help text and its flag (``None``:
    the command has none; say why beside it)."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag})


def parse_shape(value: str) -> Tuple[int, ...]:
    """``"256,256,3"`` (or ``256x256x3``) -> ``(256, 256, 3)``: 2 or 3 positive sizes, else a
    ``ValueError`` saying what was expected."""
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        raise ValueError("expected a shape like 256,256,3, got %r" % value) from None
    if not 2 <= len(shape) <= 3 or min(shape) <= 0:
        raise ValueError("expected 2 or 3 positive sizes, got %r" % value)
    return shape


def read_classes(value: Optional[str]) -> Optional[List[str]]:
    """``--classes``: comma-separated names, or the path of a file with one name per line
    (read under the one input-kind rule: a FIFO or a device is refused, naming it)."""
    if value is None:
        return None
    if os.path.isfile(value):  # (utf-8-sig: a byte-order mark is not part of the first name)
        with open_regular(value, "r", encoding="utf-8-sig") as f:
            names = [ln.strip() for ln in f if ln.strip()]
    elif "," not in value and (set(value) & {os.sep, os.altsep or os.sep}
                               or os.path.splitext(value)[1] in _LIST_FILES):
        raise ValueError("--classes %s: no such file (give a file of one name per line, or "
                         "the names separated by commas)" % value)
    else:
        names = [c.strip() for c in value.split(",")]
        if "" in names[:-1] or names == [""]:  # (one trailing comma is forgiven)
            raise ValueError("--classes %r holds an empty name: a class's id is its position "
                             "in the list, so an empty one would shift the others" % value)
        names = names if names[-1] else names[:-1]
    return checked_names(names)


def checked_names(names: Sequence[str]) -> List[str]:
    """Class names as given, refused (ValueError) when one is empty or given twice: each
    class's id is its position in the list."""
    names = list(names)
    twice = sorted(n for n, k in collections.Counter(names).items() if k > 1)
    if twice or not all(n.strip() for n in names):
        raise ValueError("--classes (classes=) names %s: each class needs its own non-empty "
                         "name, its id is its position in the list" % (", ".join(twice)
                         + " more than once" if twice else "an empty class"))
    return names


#: The name endings of a class list file: a ``--classes`` value ending so names a file.
_LIST_FILES = (".txt", ".names", ".csv", ".json", ".lst")


def _cpu_count() -> int:
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ConvertOptions:
    """The options of one conversion: what to read, how to write, how to run, shards and
    object storage. Every field has the default ``gluon-data convert`` has (but ``workers``,
    1 here and the CPU count there, and ``progress``, off here and on there); the CLI flag of
    a field is its name in dash-case (``val_ratio`` -> ``--val-ratio``), named beside each
    field below.

    Parameters
    ----------
    FIELDS

    Examples
    --------
    >>> from gluon_data.convert import ConvertOptions
    >>> opts = ConvertOptions(split="train,val", workers=4)
    >>> opts.replace(overwrite=True).overwrite
    True
    >>> ConvertOptions.merge(opts, {"seed": 3}).seed
    3
    """

    split: Optional[str] = _option(
        None, "VOC split(s), or the splits of an .lmdb source, comma separated (default: "
              "train / all)")
    val_ratio: float = _option(0.0, "move this fraction of the items into a 'val' split",
                               Flag(type=float))
    shuffle: bool = _option(False, "shuffle items (with --seed)")
    seed: int = _option(0, "seed for --shuffle", Flag(type=int))
    classes: Optional[Sequence[str]] = _option(
        None, "class names (segmentation: the mask ids in order; imagefolder: each class "
              "folder named once, its label its place in the list): comma separated, or a "
              "file with one per line",
        Flag(read=read_classes))
    num_classes: Optional[int] = _option(None, "number of classes (mask ids 0..N-1)",
                                         Flag(type=int))
    ignore_label: int = _option(255, "mask value for 'unlabelled'", Flag(type=int))
    images_dir: str = _option("images", "pairs layout: images folder")
    masks_dir: str = _option("masks", "pairs layout: masks folder")
    lst_root: Optional[str] = _option(
        None, "lst layout: folder the listed paths are relative to (default: the .lst's "
              "folder)", Flag(name="--root"))
    follow_symlinks: bool = _option(
        False, "read files through symlinks that lead outside the source folder (refused by "
               "default, in every layout; '..' and absolute paths in split files and .lst "
               "files are always refused)")
    max_file_bytes: int = _option(
        DEFAULT_MAX_FILE_BYTES, "refuse source files larger than this (only regular files "
                                "are read)", Flag(type=int))
    max_pixels: int = _option(
        codec.DEFAULT_MAX_PIXELS, "refuse images larger than this many pixels (decoded, and "
                                  "after --resize)", Flag(type=int))
    on_error: str = _option("fail", "on a bad item: abort writing nothing, or skip it and "
                                    "report it", Flag(choices=("fail", "skip")))
    # The command fills it from --storage-option when SOURCE is a URI.
    source_options: Optional[dict] = _option(
        None, "options of a dataset source at a URI (storage_options...)", None)
    image_shape: Optional[Sequence[int]] = _option(
        None, "raw-lmdb: stored image shape, e.g. 256,256,3 (H,W,C) or 3,256,256 with "
              "--channels-first", Flag(type=parse_shape))
    mask_shape: Optional[Sequence[int]] = _option(
        None, "raw-lmdb: stored mask shape H,W (default: the image's H,W)",
        Flag(type=parse_shape))
    channels_first: bool = _option(False, "raw-lmdb: images are stored C,H,W")
    bgr: bool = _option(False, "raw-lmdb: image channels are BGR")
    format: Optional[str] = _option(
        None, "output container (default: lmdb if OUTPUT ends in .lmdb, else rec)",
        Flag(choices=("rec", "lmdb")))
    encoding: str = _option(
        "passthrough", "keep the original image bytes, re-encode, or store decoded arrays "
                       "(raw: no decode cost, several times the disk)",
        Flag(choices=("passthrough", "jpg", "png", "raw")))
    quality: int = _option(95, "JPEG quality when re-encoding", Flag(type=int))
    resize: int = _option(0, "resize the shorter side to this size (0: keep)", Flag(type=int))
    mask_encoding: str = _option(
        "rle", "masks as run-length row blocks (rle: decodes 15-45x faster than PNG, a crop's "
               "rows alone), a zlib-compressed array (zraw, the previous default) or a "
               "single-channel PNG (png)", Flag(choices=codec.MASK_ENCODINGS))
    overwrite: bool = _option(
        False, "replace existing outputs, only if gluon-data wrote them (a .rec with its "
               ".idx/.meta.json, an .lmdb holding only its data); never a link")
    workers: int = _option(1, "encoding processes (with shards: the local engine's processes)",
                           Flag(type=int, default=_cpu_count))
    resume: bool = _option(
        False, "continue an interrupted conversion of any kind (.rec, .lmdb, shards, an "
               "upload to a URI) from its last checkpoint, keeping only what is provably done "
               "(sizes and digests as recorded; a damaged finished output is redone) and "
               "redoing the rest (with --shards, a rerun does so with or without it); the "
               "result equals an uninterrupted run")
    # The command reads $GLUON_DATA_CHECKPOINT_EVERY (a tuning knob of the tests, no flag).
    checkpoint_every: Optional[int] = _option(
        None, "records between checkpoints (default: by time and bytes)", None)
    progress: bool = _option(False, "draw progress bars",
                             Flag(name="--quiet", negate=True, help="no progress bar"))
    shards: Optional[int] = _option(None, "number of shards (equal item counts)",
                                    Flag(type=int, group="sharding"))
    shard_size: Optional[Union[int, str]] = _option(
        None, "close a shard at about this size, e.g. 1GB, 512MiB (estimated from the source "
              "files)", Flag(group="sharding"))
    shard_items: Optional[int] = _option(None, "items per shard",
                                         Flag(type=int, group="sharding"))
    engine: str = _option(
        "local", "where shard tasks run: a local process pool (--workers processes) or Dask "
                 "(pip install gluon-data[dask])",
        Flag(choices=("local", "dask"), group="sharding"))
    scheduler: Optional[str] = _option(
        None, "Dask scheduler address, e.g. tcp://HOST:8786; none: a LocalCluster of "
              "--workers processes", Flag(group="sharding"))
    scheduler_wait: float = _option(300.0, "seconds a --scheduler with no worker is given for "
                                    "one to join (an adaptive or queued cluster starts them "
                                    "now); 0: no limit", Flag(type=float, group="sharding"))
    # No flag yet: the engine's default serves the command.
    task_retries: int = _option(2, "times the engine retries a failed shard task", None)
    forward_credentials: bool = _option(
        False, "send this machine's S3 credentials, endpoint and region (from its environment "
               "or profile) to the shard tasks, in memory; by default each worker uses its own "
               "environment", Flag(group="sharding"))
    # The command fills it from --storage-option when OUTPUT is a URI.
    storage_options: Optional[dict] = _option(
        None, "an output at a URI: fsspec storage options", None)
    # No flag: the command stages in the default cache folder ($GLUON_DATA_CACHE_DIR).
    cache_dir: Optional[str] = _option(
        None, "an output at a URI: where the local staging copy is written", None)
    # No flag: the command uses the retry policy's default.
    remote_retries: Optional[int] = _option(
        None, "an output at a URI: retries of each remote call (the policy's default when "
              "omitted)", None)

    def __post_init__(self) -> None:
        # What the command line takes as a comma string, Python takes as one too, or as a
        # list: a string of classes is names (or a file of them), never its characters
        if isinstance(self.classes, str):
            object.__setattr__(self, "classes", read_classes(self.classes))
        elif self.classes is not None and (
                not isinstance(self.classes, Sequence)
                or not all(isinstance(c, str) for c in self.classes)):
            raise TypeError("classes must be a list of class names or a comma-separated "
                            "string of them, got %r" % (self.classes,))
        elif self.classes is not None:
            object.__setattr__(self, "classes", checked_names(self.classes))
        if isinstance(self.split, (list, tuple)) and all(isinstance(x, str)
                                                         for x in self.split):
            object.__setattr__(self, "split", ",".join(self.split))
        elif self.split is not None and not isinstance(self.split, str):
            raise TypeError("split must be a split name, a comma-separated string of them "
                            "or a list of them, got %r" % (self.split,))

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def merge(cls, options: Optional["ConvertOptions"] = None,
              overrides: Optional[Mapping[str, Any]] = None) -> "ConvertOptions":
        """``options`` (or the defaults) with ``overrides`` (keyword arguments) applied.

        Raises ``TypeError`` naming an unknown option and listing the valid ones.
        """
        if options is not None and not isinstance(options, cls):
            raise TypeError("options must be a ConvertOptions, got %r" % (options,))
        base = options if options is not None else cls()
        overrides = dict(overrides or {})
        if "retries" in overrides:  # meant two things: now task_retries / remote_retries
            raise TypeError("'retries' is ambiguous: pass task_retries= (Dask retries of a "
                            "shard task) or remote_retries= (retries of each remote call)")
        unknown = sorted(set(overrides) - set(cls.names()))
        if unknown:
            raise TypeError("unknown conversion option(s) %s; valid: %s"
                            % (", ".join(unknown), ", ".join(cls.names())))
        return dataclasses.replace(base, **overrides) if overrides else base

    def replace(self, **changes) -> "ConvertOptions":
        """A copy with ``changes`` applied (unknown names raise ``TypeError``)."""
        return self.merge(self, changes)

    @property
    def sharded(self) -> bool:
        """Whether these options ask for shards plus a manifest."""
        return any(getattr(self, f) is not None for f in ("shards", "shard_size", "shard_items"))

    def pick(self, names: Sequence[str]) -> dict:
        """The fields ``names`` as keyword arguments."""
        return {n: getattr(self, n) for n in names}


#: The options only a sharded conversion reads.
SHARD_FIELDS = ("shards", "shard_size", "shard_items", "engine", "scheduler", "scheduler_wait",
                "task_retries", "forward_credentials")
#: The options only an output at a URI reads.
REMOTE_FIELDS = ("storage_options", "cache_dir", "remote_retries")
#: The options only a legacy LMDB import reads.
LEGACY_FIELDS = ("image_shape", "mask_shape", "channels_first", "bgr")
#: The options a sharded conversion reads (``resume`` included: a rerun, with it or without,
#: keeps the shards the one rule of "done" proves finished and redoes the rest).
SHARDED_READS = frozenset((
    "shards", "shard_size", "shard_items", "engine", "scheduler", "scheduler_wait", "workers",
    "format", "split",
    "val_ratio", "shuffle", "seed", "encoding", "quality", "resize", "mask_encoding",
    "on_error", "classes", "num_classes", "ignore_label", "images_dir", "masks_dir",
    "lst_root", "max_pixels", "follow_symlinks", "max_file_bytes", "overwrite", "progress",
    "resume", "task_retries", "source_options", "forward_credentials"))
#: What a local, unsharded conversion of a source layout or a dataset reads: everything but
#: the shard, object-storage and legacy-import options.
LOCAL_READS = frozenset(f.name for f in dataclasses.fields(ConvertOptions)) - set(
    SHARD_FIELDS) - set(REMOTE_FIELDS) - set(LEGACY_FIELDS)


#: What an unsharded copy of a converted dataset (rec <-> lmdb) reads: records are copied
#: byte for byte, so no option of encoding or of a source layout applies (``workers``,
#: ``resume`` and ``checkpoint_every``: accepted, the copy runs in one pass).
COPY_READS = frozenset(("split", "format", "overwrite", "progress", "source_options",
                        "workers", "resume", "checkpoint_every"))


def reads_of(layout: Optional[str], sharded: bool, uri: bool,
             copying: bool = False) -> frozenset:
    """The options one kind of conversion reads: sharded or not, a copy of a converted
    dataset (``copying``) or not (a legacy LMDB import, ``layout`` ``raw-lmdb``/
    ``caffe-lmdb``, reads its own), into object storage or not."""
    legacy = layout in ("raw-lmdb", "caffe-lmdb")
    reads = SHARDED_READS if sharded else COPY_READS if copying and not legacy else \
        LOCAL_READS | (set(LEGACY_FIELDS) if legacy else set())
    if uri:
        reads = reads | set(REMOTE_FIELDS) | {"forward_credentials"}
    return frozenset(reads)


def deprecated_retries(overrides: dict, meaning: str) -> dict:
    """The old ``retries=`` keyword of ``convert_sharded`` / ``convert_to_uri``, renamed."""
    if "retries" in overrides:
        warnings.warn("retries= is now %s=" % meaning, DeprecationWarning, stacklevel=3)
        overrides = dict(overrides)
        overrides[meaning] = overrides.pop("retries")
    return overrides


def refuse_unread(options: ConvertOptions, reads, what: str) -> None:
    """Refuse an option ``what`` does not read, set away from its default: it would be
    silently ignored."""
    default = ConvertOptions()
    extra = sorted(n for n in options.names()
                   if n not in reads and getattr(options, n) != getattr(default, n))
    if extra:
        raise ValueError("%s takes no %s" % (what, ", ".join(
            "%s (%sset to %r%s)" % (n, "" if flag_name(n) is None else "%s, " % flag_name(n),
                                    getattr(options, n), _read_by(n))
            for n in extra)))


def _read_by(name: str) -> str:
    """What reads option ``name``, for a refusal, where only one kind of conversion does."""
    who = [w for fields, w in (
        (SHARD_FIELDS, "a sharded conversion (--shards, --shard-size or --shard-items)"),
        (REMOTE_FIELDS + ("forward_credentials",), "an output at a URI (s3://...)"),
        (LEGACY_FIELDS, "the raw-lmdb and caffe-lmdb imports")) if name in fields]
    return "; read only by %s" % " or ".join(who) if who else ""


#: Options only some source layouts read: an option set for another layout is refused.
LAYOUT_FIELDS = {"images_dir": ("pairs",), "masks_dir": ("pairs",), "lst_root": ("lst",)}
#: Options only a segmentation source (masks) reads.
SEGMENTATION_FIELDS = ("mask_encoding", "ignore_label")


def check_layout_options(options: ConvertOptions, layout: str, task: str) -> None:
    """Refuse an option the source ``layout`` (of ``task``) does not read, set away from
    its default (``images_dir`` for an ``imagefolder``, ``mask_encoding`` for a
    classification source...): it would be silently ignored."""
    ignored = {n for n, layouts in LAYOUT_FIELDS.items() if layout not in layouts}
    if task != "segmentation":
        ignored.update(SEGMENTATION_FIELDS)
    refuse_unread(options, set(options.names()) - ignored,
                  "the %s layout (a %s source)" % (layout, task))


def checkpoint_every_default(options: ConvertOptions) -> ConvertOptions:
    """``options`` with ``checkpoint_every`` from ``$GLUON_DATA_CHECKPOINT_EVERY`` when it
    is not set (a tuning knob of the tests; read only where checkpoints are taken, so the
    environment never sets an option on a conversion that takes none)."""
    every = os.environ.get("GLUON_DATA_CHECKPOINT_EVERY")
    if options.checkpoint_every is not None or not every:
        return options
    try:
        return options.replace(checkpoint_every=int(every))
    except ValueError:
        raise ValueError("GLUON_DATA_CHECKPOINT_EVERY must be a whole number of records, "
                         "got %r" % every) from None


def cli_fields() -> List[Tuple[dataclasses.Field, Flag]]:
    """The fields ``gluon-data convert`` has a flag for, with their :class:`Flag`, in the
    class's order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(ConvertOptions)
            if f.metadata["flag"] is not None]


def flag_name(name: str) -> Optional[str]:
    """The command-line flag of the field ``name`` (``lst_root`` -> ``--root``); ``None``
    where the command has none."""
    flag = {f.name: f.metadata["flag"] for f in dataclasses.fields(ConvertOptions)}[name]
    if flag is None:
        return None
    return flag.name or "--" + name.replace("_", "-")


def _document_fields(cls) -> None:
    """Write the ``Parameters`` of ``cls``'s docstring from each field's help text and
    flag, in place of its ``FIELDS`` line: the one text the command's ``--help`` shows too."""
    if cls.__doc__ is None:  # python -OO
        return
    # the docstring always has its FIELDS line
    place = cast("re.Match[str]", re.search(r"^([ \t]*)FIELDS\n", cls.__doc__, re.M))
    indent, lines = place.group(1), []  # (Python 3.13 dedents docstrings when compiling)
    for f in dataclasses.fields(cls):
        flag = flag_name(f.name)
        text = f.metadata["help"]
        if flag is not None:
            text += " (``%s``%s)" % (flag, ": off" if f.metadata["flag"].negate else "")
        choices = f.metadata["flag"] and f.metadata["flag"].choices
        kind = "{%s}" % ", ".join(map(repr, choices)) if choices else f.type
        lines.append("%s%s : %s, default %r" % (indent, f.name, kind, f.default))
        lines.extend(textwrap.wrap(text, 88, initial_indent=indent + "    ",
                                   subsequent_indent=indent + "    ", break_on_hyphens=False,
                                   break_long_words=False))
    cls.__doc__ = cls.__doc__[:place.start()] + "\n".join(lines) + "\n" + \
        cls.__doc__[place.end():]


_document_fields(ConvertOptions)


def _strict_init(init):
    """``ConvertOptions(bogus=1)``: a ``TypeError`` naming the unknown option(s) and listing
    the valid ones (the dataclass's own says only "unexpected keyword argument")."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(ConvertOptions.names()))
        if unknown:
            raise TypeError("unknown conversion option(s) %s; valid: %s"
                            % (", ".join(unknown), ", ".join(ConvertOptions.names())))
        init(self, *args, **kwargs)
    return __init__


setattr(ConvertOptions, "__init__", _strict_init(ConvertOptions.__init__))
