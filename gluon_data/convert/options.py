"""``ConvertOptions``: every option of a conversion in one documented object, read by the API
(:func:`gluon_data.convert`) and the command line (``gluon-data convert``) alike."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from ..format import codec
from .sources import DEFAULT_MAX_FILE_BYTES

__all__ = ["ConvertOptions", "SHARD_FIELDS", "REMOTE_FIELDS", "LEGACY_FIELDS"]


@dataclass(frozen=True)
class ConvertOptions:
    """The options of one conversion: what to read, how to write, how to run, shards and
    object storage. Every field has the default ``gluon-data convert`` has; the CLI flag of a
    field is its name in dash-case (``val_ratio`` -> ``--val-ratio``).

    Parameters
    ----------
    split : str, optional
        Which splits to convert (``"train,val"``); the layout's default when omitted.
    val_ratio : float
        Hold out this fraction as ``val`` (layouts without their own splits).
    shuffle, seed : bool, int
        Shuffle the records (seeded) instead of keeping the source order.
    classes : sequence of str, optional
        Class names (segmentation ids in order; classification folder names).
    num_classes : int, optional
        Segmentation: the number of classes, when no names are given.
    ignore_label : int
        The stored mask value that means "ignore" (read back as -1).
    images_dir, masks_dir : str
        ``pairs`` layout: the image and mask folders.
    lst_root : str, optional
        ``lst`` layout: the folder the ``.lst`` paths are relative to.
    follow_symlinks : bool
        Follow links that leave the source folder (refused by default).
    max_file_bytes : int
        Refuse a source file larger than this.
    max_pixels : int
        Refuse an image with more pixels than this (a decompression bomb).
    on_error : {"fail", "skip"}
        Stop at the first bad item, or skip it and list it in the metadata.
    source_options : dict, optional
        Options of a dataset source at a URI (``storage_options``...).
    image_shape, mask_shape, channels_first, bgr
        Legacy raw-array LMDB imports (``layout="raw-lmdb"``): the arrays' shapes and order.
    format : {"rec", "lmdb"}, optional
        The container; from the output's name when omitted.
    encoding : {"passthrough", "jpg", "png", "raw"}
        Keep the source bytes, or re-encode every image.
    quality : int
        JPEG quality when re-encoding.
    resize : int
        Resize the shorter side to this (0: keep the size).
    mask_encoding : {"zraw", "png"}
        How masks are stored.
    overwrite : bool
        Replace an existing output of ours (never anything else).
    workers : int
        Encoding processes (local), or worker processes per shard task engine.
    resume : bool
        Continue an interrupted conversion of the same inputs and options.
    checkpoint_every : int, optional
        Records between checkpoints (default: by time and bytes).
    progress : bool
        Draw progress bars.
    shards, shard_size, shard_items : int, str or int, int, optional
        Write shards plus a manifest: this many shards, shards of about this size
        (``"1GB"``), or this many records per shard.
    engine : {"local", "dask"}
        Where shard tasks run.
    scheduler : str, optional
        A Dask scheduler address (``engine="dask"``).
    task_retries : int
        Times the engine retries a failed shard task.
    forward_credentials : bool
        Send this machine's object-storage credentials to the shard tasks.
    storage_options : dict, optional
        An output at a URI: fsspec storage options.
    cache_dir : str, optional
        An output at a URI: where the local staging copy is written.
    remote_retries : int, optional
        An output at a URI: retries of each remote call (the policy's default when omitted).

    Examples
    --------
    >>> from gluon_data.convert import ConvertOptions
    >>> opts = ConvertOptions(split="train,val", workers=4)
    >>> opts.replace(overwrite=True).overwrite
    True
    >>> ConvertOptions.merge(opts, {"seed": 3}).seed
    3
    """

    split: Optional[str] = None
    val_ratio: float = 0.0
    shuffle: bool = False
    seed: int = 0
    classes: Optional[Sequence[str]] = None
    num_classes: Optional[int] = None
    ignore_label: int = 255
    images_dir: str = "images"
    masks_dir: str = "masks"
    lst_root: Optional[str] = None
    follow_symlinks: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_pixels: int = codec.DEFAULT_MAX_PIXELS
    on_error: str = "fail"
    source_options: Optional[dict] = None
    image_shape: Optional[Sequence[int]] = None
    mask_shape: Optional[Sequence[int]] = None
    channels_first: bool = False
    bgr: bool = False
    format: Optional[str] = None
    encoding: str = "passthrough"
    quality: int = 95
    resize: int = 0
    mask_encoding: str = "zraw"
    overwrite: bool = False
    workers: int = 1
    resume: bool = False
    checkpoint_every: Optional[int] = None
    progress: bool = False
    shards: Optional[int] = None
    shard_size: object = None
    shard_items: Optional[int] = None
    engine: str = "local"
    scheduler: Optional[str] = None
    task_retries: int = 2
    forward_credentials: bool = False
    storage_options: Optional[dict] = None
    cache_dir: Optional[str] = None
    remote_retries: Optional[int] = None

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def merge(cls, options: Optional["ConvertOptions"] = None,
              overrides: Optional[Mapping[str, object]] = None) -> "ConvertOptions":
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
SHARD_FIELDS = ("shards", "shard_size", "shard_items", "engine", "scheduler", "task_retries",
                "forward_credentials")
#: The options only an output at a URI reads.
REMOTE_FIELDS = ("storage_options", "cache_dir", "remote_retries")
#: The options only a legacy LMDB import reads.
LEGACY_FIELDS = ("image_shape", "mask_shape", "channels_first", "bgr")


def _deprecated_retries(overrides: dict, meaning: str) -> dict:
    """The old ``retries=`` keyword of ``convert_sharded`` / ``convert_to_uri``, renamed."""
    if "retries" in overrides:
        warnings.warn("retries= is now %s=" % meaning, DeprecationWarning, stacklevel=3)
        overrides = dict(overrides)
        overrides[meaning] = overrides.pop("retries")
    return overrides


def _only(options: ConvertOptions, reads, what: str) -> None:
    """Refuse an option ``what`` does not read, set away from its default: it would be
    silently ignored."""
    default = ConvertOptions()
    extra = sorted(n for n in options.names()
                   if n not in reads and getattr(options, n) != getattr(default, n))
    if extra:
        raise ValueError("%s takes no %s" % (what, ", ".join(
            "%s (--%s, set to %r)" % (n, n.replace("_", "-"), getattr(options, n))
            for n in extra)))
