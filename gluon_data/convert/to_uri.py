"""Converting into a URI: bucket checks, then convert into staging, then upload by the
uploaders of :mod:`.upload` (the one commit protocol: marker, objects, commit document last)."""
from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
from typing import Optional


from ..storage.credentials import forward_options
from ..stores.remote.commit import Commit, check_bucket, probe_writable
from ..storage.remotefs import _Remote
from ..storage.objects import _default_cache_dir
from .upload import ShardUploader, upload_dataset
from ..stores.shards import is_manifest
from .local import convert_local
from .options import ConvertOptions, _deprecated_retries
from .sharded import convert_sharded


def convert_to_uri(source: str, output: str, layout: Optional[str] = None,
                   options: Optional[ConvertOptions] = None, **overrides):
    """:func:`gluon_data.convert.convert` into object storage. Returns the
    :class:`~gluon_data.convert.ConversionReport` with URIs as outputs.

    A ``.rec`` or an ``.lmdb`` environment is converted into a local staging folder
    (``CACHE_DIR/staging/<hash of output>/``, kept until the upload completes, so ``resume``
    continues an interrupted conversion or upload), then uploaded by :func:`upload_dataset`
    (an LMDB as ``NAME.lmdb/data.mdb`` and its commit document ``NAME.lmdb/meta.json``, last).

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
    o = ConvertOptions.merge(options, _deprecated_retries(overrides, "remote_retries"))
    output = os.fspath(output).rstrip("/")
    storage_options, overwrite, resume = o.storage_options, o.overwrite, o.resume
    if o.forward_credentials:  # this machine's credentials, for the tasks (in memory only)
        storage_options = forward_options(output, storage_options)
    remote = _Remote(storage_options, o.remote_retries)
    check_bucket(remote, output)
    # refuse an existing output before any work (the split names are checked again later)
    if not resume and remote.exists(output):
        Commit(remote, output).refuse([output], overwrite)
    cache_root = os.path.abspath(o.cache_dir or _default_cache_dir())
    staging = os.path.join(cache_root, "staging",
                           hashlib.sha256(output.encode("utf-8")).hexdigest()[:24])
    sharded = is_manifest(os.fspath(source)) or o.sharded
    if not (resume or sharded):  # (sharded: the upload marker, put before any task, probes)
        probe_writable(remote, output)
    if not resume and os.path.isdir(staging):
        shutil.rmtree(staging)  # our own staging folder: a fresh conversion starts clean
    os.makedirs(staging, exist_ok=True)
    local = os.path.join(staging, posixpath.basename(output) or "out.rec")
    # the local conversion into staging: the object-storage options are this function's
    staged = o.replace(overwrite=True, storage_options=None, cache_dir=None,
                       remote_retries=None)
    if sharded:
        # the tasks stage and upload their own shards: on a Dask worker under its own cache
        # directory (this machine's paths mean nothing there), locally under this one's
        dask = o.engine == "dask"
        sink = ShardUploader(output, remote, staging=None if dask else os.path.join(
            cache_root, "staging", "shards"), overwrite=overwrite, resume=resume)
        try:  # shards resume from their receipts: the client's staging is never kept
            report = convert_sharded(source, local, layout,
                                     staged.replace(resume=False, checkpoint_every=None),
                                     sink=sink)
            report.outputs = sink.finish(report)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return report
    report = convert_local(source, local, layout, staged)
    uris = upload_dataset([report.outputs[s] for s in sorted(report.outputs)], output,
                          storage_options=storage_options, overwrite=overwrite, resume=resume,
                          journal=os.path.join(staging, "upload.json"),
                          retries=o.remote_retries)
    report.outputs = {s: uris[p] for s, p in report.outputs.items()}
    shutil.rmtree(staging, ignore_errors=True)
    return report
