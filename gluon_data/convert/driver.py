"""The one entry of every conversion: :func:`convert` decides which conversion runs -- into
object storage (:mod:`.to_uri`), sharded (:mod:`.sharded`), or local and unsharded (a legacy
LMDB imported, a dataset copied, a source layout converted: :mod:`.local`) -- from the
source, the output and one :class:`~.options.ConvertOptions`, shared with the CLI."""
from __future__ import annotations

import os
from typing import Optional

from ..storage.remotefs import is_uri
from ..stores.shards import is_manifest
from .local import convert_local
from .loop import SplitJobs, drive  # noqa: F401  (importable from here, as before)
from .options import ConvertOptions, refuse_unread, reads_of
from .report import ConversionReport
from .planning import is_dataset
from .sharded import sharded_conversion
from .to_uri import uri_conversion

__all__ = ["convert"]


def convert(source: str, output: str, layout: Optional[str] = None,
            options: Optional[ConvertOptions] = None, **overrides) -> ConversionReport:
    """Convert ``source`` into ``output``: the one entry for every conversion.

    ``source`` is a source layout (a folder or an im2rec ``.lst``), a converted dataset
    (``.rec``, ``.lmdb``, ``.shards.json``; local or at a URI: copied, or re-sharded), or a
    legacy LMDB (``layout="raw-lmdb"`` / ``"caffe-lmdb"``: imported). ``output`` names the
    container (``.rec`` or ``.lmdb``, or ``format=``), locally or at a URI (``s3://...``:
    converted into local staging, then uploaded, the commit document last). With
    ``shards``, ``shard_size`` or ``shard_items`` (or a manifest source) the output is
    shards plus a manifest per split, one task per shard on ``engine``.

    ``options`` is a :class:`~gluon_data.convert.options.ConvertOptions`; any of its fields
    may be given as a keyword instead (or on top: keywords win), as ``gluon-data convert``'s
    flags are. An option the chosen conversion does not read is refused (a ``ValueError``),
    never silently ignored.

    Parameters
    ----------
    source : str
        Folder (``pairs``, ``voc``, ``imagefolder``), ``.lst`` file (``lst``), or a dataset
        to copy into the other container: a ``.rec`` or a ``.lmdb`` directory, or one at a
        URI (``s3://bucket/voc.rec``, ``s3://bucket/voc.lmdb``; see
        :func:`~gluon_data.convert.copy_dataset`).
    output : str
        The ``.rec`` to write (several splits: ``NAME_<split>.rec`` beside it), or a
        ``.lmdb`` directory holding every split.
    layout : str, optional
        One of ``pairs``, ``voc``, ``imagefolder``, ``lst``; detected when omitted.
    split : str, optional
        VOC split(s) to convert, comma separated (default ``train``).
    val_ratio : float
        Move this fraction of the (shuffled) items into a ``val`` split.
    shuffle, seed
        Shuffle the item order with ``random.Random(seed)``; output is deterministic.
    encoding : {'passthrough', 'jpg', 'png', 'raw'}
        ``passthrough`` stores JPEG/PNG bytes unchanged (other formats become PNG);
        ``raw`` stores decoded uint8 arrays with their shape (no decode cost, more disk).
    quality : int
        JPEG quality when re-encoding.
    resize : int
        Resize the shorter side to this many pixels (masks by nearest neighbour); 0 = keep.
    mask_encoding : {'rle', 'zraw', 'png'}
        How masks are stored: ``rle`` (default), run-length row blocks (15-45x faster to
        decode than PNG, and a crop reads only its rows; FORMAT.md); ``zraw``, the class ids
        as one zlib stream (the previous default); or a single-channel PNG.
    workers : int
        Processes that read, validate and encode; one ordered writer.
    overwrite : bool
        Replace existing outputs; otherwise an existing output is an error.
    on_error : {'fail', 'skip'}
        ``fail``: the first bad item aborts the conversion, nothing is written.
        ``skip``: bad items are skipped and listed in the report and the metadata.
    classes, num_classes
        Declared classes (names, or only their number). Mask ids outside them, other than
        ``ignore_label``, are errors. VOC declares its 21 classes.
    ignore_label : int
        Mask value meaning "not labelled" (VOC: 255).
    format : {'rec', 'lmdb'}, optional
        Output container; by default ``lmdb`` when ``output`` ends in ``.lmdb``.
    image_shape, mask_shape, channels_first, bgr
        Layout ``raw-lmdb`` only (see :mod:`gluon_data.stores.legacy`): the stored array shapes,
        whether images are stored CxHxW, and whether their channels are BGR.
    resume : bool
        Continue an interrupted conversion from its last checkpoint, taken every
        ``checkpoint_every`` items, or when None every 5 s or 256 MiB written, whichever
        comes first, and at most every 64 items (RecordIO: ``OUTPUT.resume.json`` after an fsync; LMDB:
        inside the partial environment, in the same transaction as the records). The result
        equals an uninterrupted run (RecordIO: byte for byte); a checkpoint made with other
        inputs or options is refused. A conversion that failed or was interrupted (Ctrl-C,
        SIGTERM, a full disk) after its first checkpoint keeps its partial files and the
        checkpoint for this; one that failed before leaves nothing behind.
    follow_symlinks : bool
        Read files through symlinks that resolve outside the source root (refused by
        default, as are listed paths with ``..`` or absolute paths, in every layout).
    max_file_bytes : int
        Refuse source files larger than this (only regular files are ever read).
    max_pixels : int
        Refuse images whose decoded size, or whose size after ``resize``, exceeds this.
    source_options : dict, optional
        A dataset source at a URI: the remote store's options (``storage_options``,
        ``cache_dir``...).
    shards, shard_size, shard_items, engine, scheduler, task_retries, forward_credentials
        Shards plus a manifest, one task per shard
        (:func:`~gluon_data.convert.sharded.convert_sharded`).
    storage_options, cache_dir, remote_retries
        An output at a URI (:func:`~gluon_data.convert.to_uri.convert_to_uri`).
    options : ConvertOptions, optional
        All of the above in one object (:class:`~gluon_data.convert.options.ConvertOptions`).

    Returns
    -------
    ConversionReport

    Raises
    ------
    ConversionError
        On a bad item (``on_error='fail'``), an empty source or a write failure.

    Examples
    --------
    >>> report = convert("VOCdevkit", "voc_train.rec", layout="voc", split="train")  # doctest: +SKIP
    >>> print(report)                                                                 # doctest: +SKIP
    wrote 1464 records to voc_train.rec
    """
    o = ConvertOptions.merge(options, overrides)  # the one merge
    source, output = os.fspath(source), os.fspath(output)
    # the one dispatch: which conversion runs, and so which options it reads
    sharded, uri = o.sharded or is_manifest(source), is_uri(output)
    copying = not sharded and is_dataset(source)
    refuse_unread(o, reads_of(layout, sharded, uri, copying),
                  "a conversion into object storage" if uri else "a sharded conversion" if sharded
                  else "a copy of a converted dataset (its records are copied byte for byte)"
                  if copying and layout not in ("raw-lmdb", "caffe-lmdb")
                  else "a conversion into a local, unsharded output")
    if uri:
        return uri_conversion(source, output, layout, o, sharded)
    if sharded:
        return sharded_conversion(source, output, layout, o)
    return convert_local(source, output, layout, o)
