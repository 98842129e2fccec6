"""Converting into a URI: bucket checks, then convert into staging, then upload by the
uploaders of :mod:`.upload` (the one commit protocol: marker, objects, commit document last)."""
from __future__ import annotations

import os
import posixpath
from typing import List, Optional


from ..storage.cache import Cache
from ..storage.objects import staging_key
from ..storage.staging import Staging
from ..storage.credentials import forward_options
from ..stores.remote.commit import Commit, check_bucket, probe_writable
from ..storage.remotefs import Remote
from .engines import refuse_in_bootstrap
from .upload import ShardUploader, upload_dataset
from ..stores.shards import is_manifest
from ..format.layout import sibling_uri
from .local import convert_local
from .outputs import output_format, output_paths
from .planning import is_dataset
from .options import ConvertOptions, deprecated_retries, refuse_unread, reads_of
from .sharded import sharded_conversion


def convert_to_uri(source: str, output: str, layout: Optional[str] = None,
                   options: Optional[ConvertOptions] = None, **overrides):
    """:func:`gluon_data.convert.convert` into object storage. Returns the
    :class:`~gluon_data.convert.ConversionReport` with URIs as outputs.

    A ``.rec`` or an ``.lmdb`` environment is converted into a staging area of the cache
    (:meth:`gluon_data.storage.cache.Cache.staging`: ``CACHE_DIR/staging/<hash of output>/``,
    under the cache's trust rule and counted toward its ``cache_limit``, never evicted while
    the conversion runs), then uploaded by :func:`upload_dataset` (an LMDB as
    ``NAME.lmdb/data.mdb`` and its commit document ``NAME.lmdb/meta.json``, last). The area
    is removed once the upload completes; after a failure it is kept, so ``resume`` continues
    the interrupted conversion or upload (unless the cache's limit evicted it meanwhile: the
    conversion then starts over).

    With ``shards``, ``shard_size`` or ``shard_items`` (or a ``.shards.json`` source) the
    output is sharded (:func:`gluon_data.convert.sharded.convert_sharded`), and each shard task writes,
    verifies and uploads its own shard (:class:`ShardUploader`) where it runs: with
    ``engine='dask'`` on the worker, staged under the worker's own cache directory, so no
    shard passes through this machine. Each split's ``.shards.json`` manifest goes up last.

    ``options`` is a :class:`~gluon_data.convert.options.ConvertOptions` (or its fields as
    keywords): ``storage_options``, ``cache_dir`` (the staging folder's root) and
    ``remote_retries`` (retries of each remote call) are the object-storage ones.
    :func:`gluon_data.convert` calls this for an output at a URI.

    Examples
    --------
    >>> convert_to_uri("VOCdevkit", "s3://bucket/voc.rec", layout="voc",
    ...                storage_options={"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    """
    o = ConvertOptions.merge(options, deprecated_retries(overrides, "remote_retries"))
    sharded = is_manifest(os.fspath(source)) or o.sharded
    copying = not sharded and is_dataset(os.fspath(source))
    refuse_unread(o, reads_of(layout, sharded, True, copying), "a conversion into object storage")
    return uri_conversion(source, output, layout, o, sharded)


def uri_conversion(source: str, output: str, layout: Optional[str], o: ConvertOptions,
                   sharded: bool):
    """:func:`convert_to_uri` once its options are merged and checked and the conversion
    kind decided (by :func:`gluon_data.convert`): ``sharded``, or one staged dataset."""
    refuse_in_bootstrap()
    output = os.fspath(output).rstrip("/")
    storage_options, overwrite, resume = o.storage_options, o.overwrite, o.resume
    if o.forward_credentials:  # this machine's credentials, for the tasks (in memory only)
        storage_options = forward_options(output, storage_options)
    remote = Remote(storage_options, o.remote_retries)
    check_bucket(remote, output)
    if not resume:  # an existing output refused before any work: its own name and the split
        # outputs the options name (splits only the source names are checked before upload)
        for target in [output] + _named_outputs(output, o, sharded):
            if remote.exists(target):
                Commit(remote, target).refuse([target], overwrite)
    cache = Cache(o.cache_dir)
    if not (resume or sharded):  # (sharded: the upload marker, put before any task, probes)
        probe_writable(remote, output)
    # pinned while this runs; a fresh conversion (no resume) starts from an empty area
    with cache.staging(staging_key(output),
                       fresh=not resume) as area:
        return _convert_staged(source, output, layout, o, area, remote, sharded,
                               storage_options)


def _named_outputs(output: str, o: ConvertOptions, sharded: bool) -> List[str]:
    """The URIs of the split outputs a staged ``.rec`` conversion writes beside ``output``,
    as far as the options name its splits (``split="train,val"``, ``val_ratio``): each
    split is a ``NAME_<split>.rec`` of its own (one split: ``output`` itself)."""
    if sharded or output_format(output, o.format) != "rec":
        return []
    splits = o.split.split(",") if o.split else (["train", "val"] if o.val_ratio else [])
    if len(splits) < 2:
        return []
    names = output_paths(posixpath.basename(output), splits, "rec")
    return [sibling_uri(output, names[s]) for s in splits]


def _convert_staged(source, output: str, layout, o: ConvertOptions, area: Staging,
                    remote: Remote, sharded: bool, storage_options):
    """:func:`convert_to_uri` once the bucket is checked: convert into the staging
    ``area``, upload, remove the area (kept when this fails, for ``resume``)."""
    overwrite, resume = o.overwrite, o.resume
    local = os.path.join(area.path, posixpath.basename(output) or "out.rec")
    # the local conversion into staging: the object-storage options are this function's
    staged = o.replace(overwrite=True, storage_options=None, cache_dir=None,
                       remote_retries=None)
    if sharded:
        # the tasks stage and upload their own shards: on a Dask worker under its own cache
        # directory (this machine's paths mean nothing there), locally under this one's
        sink = ShardUploader(output, remote, cache_dir=None if o.engine == "dask" else
                             area.cache.cache_dir, overwrite=overwrite, resume=resume)
        try:  # shards resume from their receipts: the client's staging is never kept
            report = sharded_conversion(source, local, layout,
                                        staged.replace(resume=False, checkpoint_every=None),
                                        sink)
            report.outputs = sink.finish(report)
        finally:
            area.remove()
        return report
    report = convert_local(source, local, layout, staged)
    area.claim()  # the staged bytes counted: entries not in use make room for them
    kept: List[str] = []  # (a --resume of an upload that had finished: nothing sent)
    uris = upload_dataset([report.outputs[s] for s in sorted(report.outputs)], output,
                          storage_options=storage_options, overwrite=overwrite, resume=resume,
                          journal=os.path.join(area.path, "upload.json"),
                          retries=o.remote_retries, kept=kept)
    report.resumed.update((s, report.written[s]) for s, p in report.outputs.items()
                          if p in kept and s in report.written)
    report.outputs = {s: uris[p] for s, p in report.outputs.items()}
    area.remove()  # uploaded: nothing to resume
    return report
