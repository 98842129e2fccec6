"""The ``gluon-data`` command: thin subcommands over the library functions."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np
from typing import List, Optional

__all__ = ["main"]


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action):
        """``(default: X)`` appended once: not to a help that states its own default, nor for
        a default that says nothing (a flag's False, an option's None)."""
        help = action.help or ""
        if "(default" in help or action.default is None or action.default is False:
            return help
        return super()._get_help_string(action)


def _classes_arg(value: Optional[str]):
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return [ln.strip() for ln in f if ln.strip()]
    return [c.strip() for c in value.split(",") if c.strip()]


def _shape_arg(value: str):
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected a shape like 256,256,3, got %r" % value)
    if not 2 <= len(shape) <= 3 or min(shape) <= 0:
        raise argparse.ArgumentTypeError("expected 2 or 3 positive sizes, got %r" % value)
    return shape


def _remote(a) -> dict:
    """RemoteStore options from ``--storage-option`` (empty for local paths)."""
    from .store import is_uri
    path = getattr(a, "path", None) or getattr(a, "output", None)
    if path is None or not is_uri(path):
        return {}
    from .remote import parse_storage_options
    return {"storage_options": parse_storage_options(getattr(a, "storage_option", None))}


def _source_options(a) -> Optional[dict]:
    """Remote store options for a dataset SOURCE at a URI (``--storage-option``)."""
    from .store import is_uri
    if not is_uri(a.source):
        return None
    from .remote import parse_storage_options
    return {"storage_options": parse_storage_options(getattr(a, "storage_option", None))}


def _cmd_convert(a) -> int:
    """``gluon-data convert``: write shards (``--shards``...), import a legacy LMDB layout,
    copy a dataset between containers (``.rec`` <-> ``.lmdb``, or one container re-written),
    or convert a source layout."""
    from .shards import is_manifest
    if (a.shards is not None or a.shard_size is not None or a.shard_items is not None
            or is_manifest(a.source)):
        return _convert_sharded(a)
    if a.engine != "local" or a.scheduler or a.forward_credentials:
        raise ValueError("--engine/--scheduler/--forward-credentials are for shard tasks: add "
                         "--shards, --shard-size or "
                         "--shard-items")
    from .convert import convert, copy_dataset, import_lmdb, is_dataset
    every = os.environ.get("GLUON_DATA_CHECKPOINT_EVERY")  # unset: by time and bytes
    every = int(every) if every else None
    if a.layout in ("raw-lmdb", "caffe-lmdb"):
        report = import_lmdb(a.source, a.output, a.layout, split=a.split,
                             image_shape=a.image_shape, mask_shape=a.mask_shape,
                             channels_first=a.channels_first, bgr=a.bgr, encoding=a.encoding,
                             quality=a.quality, classes=_classes_arg(a.classes),
                             num_classes=a.num_classes, ignore_label=a.ignore_label,
                             format=a.format, overwrite=a.overwrite, on_error=a.on_error,
                             max_pixels=a.max_pixels, progress=not a.quiet, workers=a.workers,
                             resume=a.resume, checkpoint_every=every)
    elif is_dataset(a.source) and not _remote(a):
        report = copy_dataset(a.source, a.output, split=a.split, format=a.format,
                              overwrite=a.overwrite, progress=not a.quiet,
                              source_options=_source_options(a))
    else:  # a source layout, or any source into object storage (a dataset: copied there)
        if _remote(a):  # into object storage: converted locally, then uploaded (metadata last)
            from functools import partial
            from .remote import convert_to_uri
            convert = partial(convert_to_uri, **_remote(a))
        report = convert(a.source, a.output, a.layout, split=a.split, val_ratio=a.val_ratio,
                         shuffle=a.shuffle, seed=a.seed, encoding=a.encoding,
                         quality=a.quality, mask_encoding=a.mask_encoding, resize=a.resize,
                         workers=a.workers, overwrite=a.overwrite, on_error=a.on_error,
                         classes=_classes_arg(a.classes), num_classes=a.num_classes,
                         ignore_label=a.ignore_label, images_dir=a.images_dir,
                         masks_dir=a.masks_dir, lst_root=a.root, max_pixels=a.max_pixels,
                         format=a.format, resume=a.resume, progress=not a.quiet,
                         follow_symlinks=a.follow_symlinks, max_file_bytes=a.max_file_bytes,
                         checkpoint_every=every, source_options=_source_options(a))
    print(report)
    return 0  # skips (--on-error skip) are listed; nothing written raises ConversionError


def _convert_sharded(a) -> int:
    from .shards import convert_sharded
    if _remote(a):  # into object storage: each shard task uploads its shard, manifest last
        from functools import partial
        from .remote import convert_to_uri
        convert_sharded = partial(convert_to_uri, resume=a.resume, **_remote(a))
    if a.forward_credentials:
        from functools import partial
        convert_sharded = partial(convert_sharded, forward_credentials=True)
    report = convert_sharded(a.source, a.output, a.layout, shards=a.shards,
                             shard_size=a.shard_size, shard_items=a.shard_items,
                             engine=a.engine, scheduler=a.scheduler, workers=a.workers,
                             format=a.format, split=a.split, val_ratio=a.val_ratio,
                             shuffle=a.shuffle, seed=a.seed, encoding=a.encoding,
                             quality=a.quality, resize=a.resize, mask_encoding=a.mask_encoding,
                             on_error=a.on_error, classes=_classes_arg(a.classes),
                             num_classes=a.num_classes, ignore_label=a.ignore_label,
                             images_dir=a.images_dir, masks_dir=a.masks_dir, lst_root=a.root,
                             max_pixels=a.max_pixels, follow_symlinks=a.follow_symlinks,
                             max_file_bytes=a.max_file_bytes, overwrite=a.overwrite,
                             progress=not a.quiet, source_options=_source_options(a))
    for e in report.shards:
        print("  %-6s shard %3d  %-36s %7d records %11d bytes  %s"
              % (e["split"], e["index"], e["name"], e["records"], e["bytes"],
                 "kept (already done)" if e.get("reused") else "written"))
    print(report)
    return 0


def _summary(meta: dict) -> dict:
    out = dict(task=meta["task"], format="gluon_data v%d" % meta["format_version"],
               split=meta.get("split"), classes=meta.get("classes"),
               num_classes=meta.get("num_classes"), image_size=meta.get("image_size"),
               image_encoding=meta.get("image_encoding"), checksum=meta.get("checksum"),
               skipped=len(meta.get("skipped", [])), created_by=meta.get("created_by"))
    if meta["task"] == "segmentation":
        out["ignore_label"] = meta.get("ignore_label")
        out["class_pixels"] = meta.get("class_pixels")
    return out


def describe(path: str, remote: Optional[dict] = None) -> dict:
    """What ``gluon-data info`` reports about a dataset (any store :func:`open_store` opens;
    a URI with ``remote`` options, read by ranged GETs: the metadata and, for a stock file,
    the index and a few records)."""
    from . import codec
    from .shards import is_manifest, read_manifest
    from .store import is_uri, open_store, store_splits
    opts = dict(remote or {}, reads="ranged") if is_uri(path) else {}
    if is_manifest(path) and not is_uri(path):
        doc = read_manifest(path)
        out = {"path": path, "container": doc["container"] + " shards",
               "shards": len(doc["shards"]), "records": doc["num_records"],
               "bytes": sum(s["bytes"] for s in doc["shards"])}
        out.update(_summary(doc["meta"]))
        return out
    first = open_store(path, **opts) if is_uri(path) else None  # (a URI's options)
    splits = store_splits(path) if first is None else getattr(first, "splits", [None])
    if splits != [None]:
        out = {}
        for s in splits:
            st = open_store(path, s, **opts)
            out[s] = dict(_summary(st.meta), records=len(st))
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) \
            if os.path.isdir(path) else getattr(first, "file_size", None)
        return {"path": path, "container": "lmdb", "bytes": size, "splits": out}
    f = first or open_store(path, **opts)
    meta = f.meta
    out = {"path": path, "records": len(f), "bytes": getattr(f, "file_size", None)}
    if meta is None:
        out.update(task="classification", format="stock MXNet RecordIO (no metadata)")
        sizes = []
        for i in range(min(len(f), 32)):
            rec = codec.unpack(f.read(i), segmentation=False, verify=False)
            hw = codec.image_size(rec.image)
            if hw:
                sizes.append(hw)
        if sizes:
            out["image_size_of_first_%d" % len(sizes)] = {
                "min_hw": [min(s[0] for s in sizes), min(s[1] for s in sizes)],
                "max_hw": [max(s[0] for s in sizes), max(s[1] for s in sizes)]}
        return out
    out.update(_summary(meta))
    return out


def _load_meta(path: str, split=None, remote: Optional[dict] = None) -> dict:
    from .errors import FormatError
    from .store import is_uri, open_store
    opts = dict(remote or {}, reads="ranged") if is_uri(path) else {}
    meta = open_store(path, split, **opts).meta
    if meta is None:
        raise FormatError("no metadata: a stock RecordIO file has no statistics", path)
    return meta


def _cmd_stats(a) -> int:
    from .stats import class_statistics, format_statistics
    stats = class_statistics(_load_meta(a.path, a.split, _remote(a)), a.path)
    if a.json:
        out = dict(stats)
        out["weights"] = {k: [r[k] for r in stats["classes"]] for k in ("median_freq", "enet")}
        print(json.dumps(out, indent=1))
    else:
        print(format_statistics(stats))
    return 0


def _cmd_show(a) -> int:
    from .datasets import SegmentationDataset, open_segmentation
    from .preview import render_preview
    from .store import open_store
    remote = _remote(a)
    ds = (SegmentationDataset(open_store(a.path, a.split, **dict(remote, reads="ranged")),
                              ignore_value=None) if remote  # a URI: ranged reads
          else open_segmentation(a.path, a.split, ignore_value=None))
    if not -len(ds) <= a.index < len(ds):
        raise ValueError("--index %d out of range: the dataset has %d records"
                         % (a.index, len(ds)))
    img, mask = ds._arrays(a.index)
    pic = render_preview(img, mask, ds.palette, ds.classes, ds.ignore_label, alpha=a.alpha)
    _save_image(pic, a.out)
    print("wrote %s (record %d of %s: %dx%d, %d classes present)"
          % (a.out, a.index, a.path, img.shape[1], img.shape[0], len(np.unique(mask))))
    return 0


def _save_image(pic, out: str) -> None:
    """Save a picture atomically; an existing file is replaced only if it is an image
    (never a link, a dataset or any other file)."""
    import io

    from .fsutil import atomic_write, check_replaceable
    check_replaceable(out, "image", True)
    ext = os.path.splitext(out)[1].lower()
    buf = io.BytesIO()
    pic.save(buf, format={".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP", ".tif": "TIFF",
                          ".tiff": "TIFF", ".webp": "WEBP"}.get(ext, "PNG"))
    atomic_write(out, buf.getvalue())


def _cmd_verify(a) -> int:
    from .verify import verify
    report = verify(a.path, deep=a.deep, split=a.split, **({"remote": _remote(a)}
                                                            if _remote(a) else {}))
    print(report)
    return 0 if report.ok else 1


def _cmd_salvage(a) -> int:
    from .salvage import salvage
    report = salvage(a.path, overwrite=a.overwrite)
    print(report)
    return 0 if report.records else 1


def _cmd_info(a) -> int:
    info = describe(a.path, _remote(a))
    if a.json:
        print(json.dumps(info, indent=1))
        return 0
    def show(d, indent=""):
        for k, v in d.items():
            if k in ("class_pixels", "created_by") or v is None:
                continue
            if isinstance(v, dict) and k == "splits":
                for s, sub in v.items():
                    print("%ssplit %s:" % (indent, s))
                    show(sub, indent + "  ")
                continue
            print("%s%-16s %s" % (indent, k + ":", v))
    show(info)
    return 0


def run_demo(workdir: str, num_images: int = 96, workers: int = 2, batch_size: int = 8,
             epochs: int = 2, out=sys.stdout) -> dict:
    """Generate a VOC-like sample, pack it, and read it back through a multi-worker DataLoader."""
    import mxnet as mx

    from .batchify import SegmentationBatchify
    from .convert import convert
    from .datasets import SegmentationRecordDataset
    from .sample import make_voc

    def say(*args):
        print(*args, file=out, flush=True)

    voc = os.path.join(workdir, "VOCsample")
    say("1. generating a VOC-style sample of %d images in %s" % (num_images, voc))
    make_voc(voc, num_images=num_images, size_range=(96, 192))
    rec = os.path.join(workdir, "voc.rec")
    say("2. packing it: gluon-data convert %s %s --layout voc --split train,val --workers %d"
        % (voc, rec, workers))
    report = convert(voc, rec, "voc", split="train,val", workers=workers, overwrite=True)
    say("   " + str(report).replace("\n", "\n   "))
    ds = SegmentationRecordDataset(report.outputs["train"])
    say("3. reading %r" % ds)
    loader = mx.gluon.data.DataLoader(ds, batch_size=batch_size, shuffle=True,
                                      num_workers=workers, batchify_fn=SegmentationBatchify())
    result = {"records": len(ds), "epochs": []}
    for epoch in range(epochs):
        t0, seen, pixels = time.perf_counter(), 0, 0
        for imgs, masks in loader:
            seen += imgs.shape[0]
            pixels += int((masks >= 0).sum().asscalar())
        dt = time.perf_counter() - t0
        result["epochs"].append({"samples": seen, "seconds": dt})
        say("   epoch %d: %d samples in %d batches, %.0f samples/s, %d labelled pixels"
            % (epoch + 1, seen, len(loader), seen / dt, pixels))
    img, mask = ds[0]
    present = sorted(set(mask.asnumpy().ravel().tolist()) - {-1})
    say("4. sample 0: image %s %s, mask %s %s, classes %s"
        % (img.shape, img.dtype.__name__, mask.shape, mask.dtype.__name__,
           [ds.classes[i] for i in present]))
    ok = all(e["samples"] == len(ds) for e in result["epochs"])
    say("%s: %d records read %d times through DataLoader(num_workers=%d)"
        % ("OK" if ok else "MISMATCH", len(ds), epochs, workers))
    result["ok"] = ok
    return result


def _cmd_demo(a) -> int:
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
        res = run_demo(a.workdir, a.num_images, a.workers, a.batch_size, a.epochs)
    else:
        with tempfile.TemporaryDirectory(prefix="gluon-data-demo-") as d:
            res = run_demo(d, a.num_images, a.workers, a.batch_size, a.epochs)
    return 0 if res["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .codec import DEFAULT_MAX_PIXELS
    from .sources import DEFAULT_MAX_FILE_BYTES
    p = argparse.ArgumentParser(prog="gluon-data", formatter_class=_Formatter,
                                description="Pack image datasets into MXNet RecordIO or "
                                            "LMDB and inspect them.")
    p.add_argument("--version", action="version", version="gluon_data %s" % __version__)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    c = sub.add_parser("convert", formatter_class=_Formatter,
                       help="pack a folder or .lst into .rec/.idx/.meta.json",
                       description="Pack a source into RecordIO or LMDB. Layouts: pairs "
                                   "(images/ + masks/), voc, ade20k, cityscapes, imagefolder, lst (im2rec list), "
                                   "raw-lmdb (the classic <split>_data/<split>_label recipe), "
                                   "caffe-lmdb (convert_imageset). A .rec or .lmdb source is "
                                   "copied into the other container.")
    c.add_argument("source", help="source folder, .lst file (--layout lst), or a .rec / .lmdb "
                                  "/ .shards.json dataset to copy into the other container "
                                  "(also at a URI: s3://bucket/x.rec, read through the cache)")
    c.add_argument("output", help="output .rec (several splits: NAME_<split>.rec) or .lmdb, "
                                  "or a .rec / .lmdb URI (s3://bucket/out.rec: written locally, "
                                  "then uploaded, metadata last; with --shards each shard task "
                                  "uploads its own shard, the manifest last)")
    c.add_argument("--layout", choices=["pairs", "voc", "ade20k", "cityscapes", "imagefolder",
                                        "lst", "raw-lmdb", "caffe-lmdb"],
                   help="source layout (detected when omitted; the LMDB imports must be named)")
    c.add_argument("--format", choices=["rec", "lmdb"],
                   help="output container (default: lmdb if OUTPUT ends in .lmdb, else rec)")
    c.add_argument("--split", help="VOC split(s), or the splits of an .lmdb source, comma "
                                   "separated (default: train / all)")
    c.add_argument("--val-ratio", type=float, default=0.0,
                   help="move this fraction of the items into a 'val' split")
    c.add_argument("--shuffle", action="store_true", help="shuffle items (with --seed)")
    c.add_argument("--seed", type=int, default=0, help="seed for --shuffle")
    c.add_argument("--encoding", choices=["passthrough", "jpg", "png", "raw"],
                   default="passthrough",
                   help="keep the original image bytes, re-encode, or store decoded arrays "
                        "(raw: no decode cost, several times the disk)")
    c.add_argument("--quality", type=int, default=95, help="JPEG quality when re-encoding")
    c.add_argument("--mask-encoding", choices=["zraw", "png"], default="zraw",
                   help="masks as a zlib-compressed array (zraw: decodes ~3x faster than "
                        "PNG) or as single-channel PNG")
    c.add_argument("--resize", type=int, default=0,
                   help="resize the shorter side to this size (0: keep)")
    c.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                   help="encoding processes")
    c.add_argument("--overwrite", action="store_true",
                   help="replace existing outputs, only if gluon-data wrote them (a .rec with "
                        "its .idx/.meta.json, an .lmdb holding only its data); never a link")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted conversion or import (.rec or .lmdb "
                        "output) from its last checkpoint, or an interrupted upload to a URI "
                        "without sending again what is up (with --shards, finished shards "
                        "are kept on any rerun); the result equals an uninterrupted run")
    c.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="on a bad item: abort writing nothing, or skip it and report it")
    c.add_argument("--classes", help="class names: comma separated, or a file with one per line")
    c.add_argument("--num-classes", type=int, help="number of classes (mask ids 0..N-1)")
    c.add_argument("--ignore-label", type=int, default=255, help="mask value for 'unlabelled'")
    c.add_argument("--images-dir", default="images", help="pairs layout: images folder")
    c.add_argument("--masks-dir", default="masks", help="pairs layout: masks folder")
    c.add_argument("--root", help="lst layout: folder the listed paths are relative to "
                                  "(default: the .lst's folder)")
    c.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="refuse images larger than this many pixels (decoded, and after "
                        "--resize)")
    c.add_argument("--max-file-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES,
                   help="refuse source files larger than this (only regular files are read)")
    c.add_argument("--follow-symlinks", action="store_true",
                   help="read files through symlinks that lead outside the source folder "
                        "(refused by default, in every layout; '..' and absolute paths in "
                        "split files and .lst files are always refused)")
    c.add_argument("--image-shape", type=_shape_arg,
                   help="raw-lmdb: stored image shape, e.g. 256,256,3 (H,W,C) or 3,256,256 with "
                        "--channels-first")
    c.add_argument("--mask-shape", type=_shape_arg,
                   help="raw-lmdb: stored mask shape H,W (default: the image's H,W)")
    c.add_argument("--channels-first", action="store_true",
                   help="raw-lmdb: images are stored C,H,W")
    c.add_argument("--bgr", action="store_true", help="raw-lmdb: image channels are BGR")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    g = c.add_argument_group("sharding", "write N self-contained shards plus a manifest "
                                         "OUTPUT_PREFIX.shards.json, one task per shard; a "
                                         "rerun skips finished shards")
    g.add_argument("--shards", type=int, help="number of shards (equal item counts)")
    g.add_argument("--shard-size", help="close a shard at about this size, e.g. 1GB, 512MiB "
                                        "(estimated from the source files)")
    g.add_argument("--shard-items", type=int, help="items per shard")
    g.add_argument("--engine", choices=["local", "dask"], default="local",
                   help="where shard tasks run: a local process pool (--workers processes) "
                        "or Dask (pip install gluon-data[dask])")
    g.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://HOST:8786; "
                                       "none: a LocalCluster of --workers processes")
    g.add_argument("--forward-credentials", action="store_true",
                   help="send this machine's S3 credentials, endpoint and region (from its "
                        "environment or profile) to the shard tasks, in memory; by default "
                        "each worker uses its own environment")
    c.set_defaults(func=_cmd_convert)

    i = sub.add_parser("info", formatter_class=_Formatter,
                       help="task, record count, classes, image sizes, format version")
    i.add_argument("path", help=".rec file or URI (s3://...), .lmdb directory or .shards.json "
                                    "manifest")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    i.set_defaults(func=_cmd_info)

    st = sub.add_parser("stats", formatter_class=_Formatter,
                        help="class pixel counts, image counts, class weights, mean/std")
    st.add_argument("path", help=".rec file or URI (s3://...), .lmdb directory or .shards.json "
                                    "manifest")
    st.add_argument("--split", help="LMDB split (default: train)")
    st.add_argument("--json", action="store_true", help="print JSON (weights as lists)")
    st.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    st.set_defaults(func=_cmd_stats)

    sh = sub.add_parser("show", formatter_class=_Formatter,
                        help="write a PNG of a sample: image, mask overlay and class legend")
    sh.add_argument("path", help=".rec file or URI (s3://...), .lmdb directory or .shards.json "
                                    "manifest "
                                    "(segmentation)")
    sh.add_argument("--index", type=int, default=0, help="record position")
    sh.add_argument("--out", default="sample.png",
                    help="output PNG (an existing image file is replaced; any other file or a "
                         "link is refused)")
    sh.add_argument("--split", help="LMDB split (default: train)")
    sh.add_argument("--alpha", type=float, default=0.55, help="overlay opacity")
    sh.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    sh.set_defaults(func=_cmd_show)

    v = sub.add_parser("verify", formatter_class=_Formatter,
                       help="check structure, index, counts and every checksum (--deep: decode)")
    v.add_argument("path", help=".rec file or URI (s3://...), .lmdb directory or .shards.json "
                                    "manifest")
    v.add_argument("--deep", action="store_true",
                   help="also decode every image and mask and check mask ids")
    v.add_argument("--split", help="LMDB: only this split")
    v.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    v.set_defaults(func=_cmd_verify)

    sv = sub.add_parser("salvage", formatter_class=_Formatter,
                        help="rebuild a lost or short .idx by scanning the .rec")
    sv.add_argument("path", help=".rec file (a shard manifest, an LMDB, a URI or a folder is "
                                 "refused, nothing touched: salvage each shard's .rec)")
    sv.add_argument("--overwrite", action="store_true",
                    help="replace an existing .idx (kept as .idx.bak)")
    sv.set_defaults(func=_cmd_salvage)

    if bench_path() is not None:  # a source checkout; an installed wheel has no harness
        sub.add_parser("bench", help="benchmark our loaders against the baselines (see "
                                     "`gluon-data bench --help`)", add_help=False)

    d = sub.add_parser("demo", formatter_class=_Formatter,
                       help="generate a VOC-style sample, pack it, read it through a DataLoader")
    d.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    d.add_argument("--num-images", type=int, default=96, help="images to generate")
    d.add_argument("--workers", type=int, default=2, help="conversion and DataLoader workers")
    d.add_argument("--batch-size", type=int, default=8, help="DataLoader batch size")
    d.add_argument("--epochs", type=int, default=2, help="passes over the data")
    d.set_defaults(func=_cmd_demo)
    return p


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that the same clean-up runs."""


#: the process whose ``main()`` installed :func:`_on_sigterm`: the only one it raises in
_handler_pid = None


def _on_sigterm(signum, frame):
    if os.getpid() != _handler_pid:  # a forked child that still has it: die as by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise _Terminated()


def _default_sigterm_in_child() -> None:
    """Run in every forked child (DataLoader and pool workers): SIGTERM ends it at once, as by
    default. Inherited, :func:`_on_sigterm` would raise inside multiprocessing's own clean-up
    (``Pool.terminate()`` sends SIGTERM to its workers), and a worker waiting in native code
    would not run it at all (Python handlers run between bytecodes), so never die, and the
    parent's join of it would hang."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except (ValueError, OSError):  # not the main thread: _on_sigterm's pid check acts
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


def _catch_sigterm():
    """Install :func:`_on_sigterm` in this process (from its main thread only: elsewhere
    nothing happens); returns the handler it replaced, or None."""
    global _handler_pid
    if threading.current_thread() is not threading.main_thread():
        return None
    _handler_pid = os.getpid()
    return signal.signal(signal.SIGTERM, _on_sigterm)


BENCH_MODULE = "gluon_data_bench"


def load_bench():
    """The benchmark harness, ``benchmarks/bench.py`` of the source tree (a tool, not part of
    the package): the file ``$GLUON_DATA_BENCH`` names, else the one next to this package
    (a checkout or an editable install). Loaded once as module ``gluon_data_bench``, so
    forked workers can unpickle what it defines. None where neither exists (a wheel)."""
    if BENCH_MODULE in sys.modules:
        return sys.modules[BENCH_MODULE]
    import importlib.util
    path = bench_path()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(BENCH_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[BENCH_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[BENCH_MODULE]
        raise
    return module


def bench_path() -> Optional[str]:
    """Where load_bench finds the harness: ``$GLUON_DATA_BENCH``, else ``benchmarks/bench.py``
    next to this package; None where neither is a file (an installed wheel)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (os.environ.get("GLUON_DATA_BENCH"),
                 os.path.join(here, "benchmarks", "bench.py")):
        if path and os.path.isfile(path):
            return path
    return None


def _stdout_closed() -> bool:
    """Whether the reader of our stdout has gone (``gluon-data info X | head -3``); if so,
    stdout is pointed at /dev/null, so that what is still buffered or printed is dropped
    quietly instead of failing again as the interpreter exits."""
    import select
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        closed = any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
        if closed:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        return closed
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced, closed)
        return False


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # its own parser: benchmarks/bench.py
        bench = load_bench()
        if bench is None:
            print("gluon-data: error: `gluon-data bench` runs from a source checkout (its "
                  "harness, benchmarks/bench.py, is not part of the installed package): "
                  "`bash scripts/run.sh gluon-data bench` there, or set GLUON_DATA_BENCH to "
                  "the harness's path", file=sys.stderr)
            return 2
        return bench.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    from .errors import GluonDataError
    old = _catch_sigterm()
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not as the interpreter exits
        return code
    except (GluonDataError, OSError, ValueError, ImportError) as e:
        if isinstance(e, BrokenPipeError) and _stdout_closed():
            return 141  # as a Unix tool stopped by SIGPIPE: quietly
        print("gluon-data: error: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print("gluon-data: %s%s" % ("terminated" if isinstance(e, _Terminated) else
                                    "interrupted",
                                    "; rerun the same command with --resume to continue"
                                    if args.command == "convert" else ""), file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


if __name__ == "__main__":
    sys.exit(main())
