"""The subcommands: thin functions over the library, one per command."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile

import numpy as np
from typing import Optional, cast

from ..format import codec
from ..convert.options import ConvertOptions, cli_fields
from ..errors import FormatError
from ..storage.fileio import require_regular
from ..storage.remotefs import parse_storage_options
from ..stores.shards import is_manifest, read_manifest
from ..stores.base import is_uri, open_store, refuse_part, store_splits


def _input(path: str) -> None:
    """A command's dataset or source, under the one input-kind rule before anything opens
    it: a local path must be a regular file or a directory; a FIFO, a device or a socket
    (or a link to one) is refused, a :class:`FormatError` naming it (nothing blocks, nothing
    is written); so is a file of a dataset named instead of the dataset (an ``.idx``, an
    LMDB's ``data.mdb``: :func:`~gluon_data.stores.base.refuse_part`), saying which path to
    give. A URI, or nothing at all, is left to the command's own message."""
    if not is_uri(path):
        require_regular(path, directory=True)
        refuse_part(path)


def _remote(a) -> dict:
    """RemoteStore options from ``--storage-option`` (empty for local paths)."""
    path = getattr(a, "path", None) or getattr(a, "output", None)
    if path is None or not is_uri(path):
        return {}
    return {"storage_options": parse_storage_options(getattr(a, "storage_option", None))}


def _source_options(a) -> Optional[dict]:
    """Remote store options for a dataset SOURCE at a URI (``--storage-option``)."""
    if not is_uri(a.source):
        return None
    return {"storage_options": parse_storage_options(getattr(a, "storage_option", None))}


def convert_options(a):
    """The :class:`~gluon_data.convert.options.ConvertOptions` of ``gluon-data convert``: each
    flag's value under its field's name (read through its
    :class:`~gluon_data.convert.options.Flag`), and the storage options of
    ``--storage-option`` for a SOURCE or OUTPUT at a URI (refused where both are local: it
    would configure nothing). ``$GLUON_DATA_CHECKPOINT_EVERY`` is read by the library, where
    checkpoints are taken."""
    if getattr(a, "storage_option", None) and not (is_uri(a.source) or is_uri(a.output)):
        raise ValueError("--storage-option applies to a SOURCE or OUTPUT at a URI (s3://...); "
                         "both are local here, so it would be ignored")
    named = {field.name: flag.read(getattr(a, field.name)) if flag.read
             else getattr(a, field.name) for field, flag in cli_fields()}
    named.update(source_options=_source_options(a), **_remote(a))
    return ConvertOptions(**named)


def cmd_convert(a) -> int:
    """``gluon-data convert``: the one entry (:func:`gluon_data.convert`) decides which
    conversion runs: shards, a legacy LMDB import, a copy between containers, a source
    layout, locally or into object storage."""
    from ..convert.driver import convert
    _input(a.source)
    report = convert(a.source, a.output, a.layout, convert_options(a))
    for e in getattr(report, "shards", None) or ():
        print("  %-6s shard %3d  %-36s %7d records %11d bytes  %s"
              % (e["split"], e["index"], e["name"], e["records"], e["bytes"],
                 "kept (already done)" if e.get("reused") else "written"))
    print(report)
    return 0  # skips (--on-error skip) are listed; nothing written raises ConversionError


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


def describe(path: str, remote: Optional[dict] = None, split: Optional[str] = None) -> dict:
    """What ``gluon-data info`` reports about a dataset (any store :func:`open_store` opens;
    a URI with ``remote`` options, read by ranged GETs: the metadata and, for a stock file,
    the index and a few records); ``split``: of an LMDB, only that split (a ``.rec`` holds
    one, and is checked to be that one, as by the other commands)."""
    _input(path)
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
    if split is not None:
        open_store(path, split, **opts)  # a split the dataset does not hold: its own message
        splits = [split] if splits != [None] else splits
    if splits != [None]:
        out = {}
        for s in splits:  # an LMDB's split names; each split's store has its metadata
            st = open_store(path, s, **opts)
            out[cast(str, s)] = dict(_summary(cast(dict, st.meta)), records=len(st))
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) \
            if os.path.isdir(path) else getattr(first, "file_size", None)
        return {"path": path, "container": "lmdb",
                "records": sum(v["records"] for v in out.values()), "bytes": size,
                "splits": out}
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
    _input(path)
    opts = dict(remote or {}, reads="ranged") if is_uri(path) else {}
    meta = open_store(path, split, **opts).meta
    if meta is None:
        raise FormatError("no metadata: a stock RecordIO file has no statistics", path)
    return meta


def cmd_stats(a) -> int:
    from ..tools.stats import class_statistics, format_statistics
    stats = class_statistics(_load_meta(a.path, a.split, _remote(a)), a.path)
    if a.json:
        out = dict(stats)
        out["weights"] = {k: [r[k] for r in stats["classes"]] for k in ("median_freq", "enet")}
        print(json.dumps(out, indent=1))
    else:
        print(format_statistics(stats))
    return 0


def cmd_show(a) -> int:
    from ..arrays import SegmentationDataset  # numpy samples: no MXNet for a preview
    from ..tools.preview import render_preview, save_preview
    _input(a.path)
    remote = _remote(a)
    where = (open_store(a.path, a.split, **dict(remote, reads="ranged"))  # a URI: ranged reads
             if remote else open_store(a.path, a.split))
    meta = where.meta if where.meta is not None else {"task": "classification"}  # (im2rec's)
    if meta.get("task") == "classification" or meta.get("masks") is False:
        return _show_image(a, where, meta)
    ds = SegmentationDataset(where, ignore_value=None)
    index = _record_index(a.index, len(ds))
    img, mask = ds._arrays(index)
    # a converted dataset's ignore label is an int (only the legacy LMDB imports, which
    # open_store does not open without a layout, may have none)
    pic = render_preview(img, mask, ds.palette, ds.classes, cast(int, ds.ignore_label),
                         alpha=a.alpha)
    save_preview(pic, a.out, a.overwrite)
    print("wrote %s (record %d of %s: %dx%d, %d classes present)"
          % (a.out, index, a.path, img.shape[1], img.shape[0], len(np.unique(mask))))
    return 0


def _record_index(index: int, n: int) -> int:
    """``show --index`` as a position in ``n`` records (-1: the last, as ``ds[-1]``)."""
    if not -n <= index < n:
        raise ValueError("--index %d out of range: the dataset has %d records" % (index, n))
    return index % n


def _show_image(a, store, meta: dict) -> int:
    """``show`` of a dataset without masks (a classification dataset, a stock im2rec file,
    VOC's test split): the image itself, and its label or its file name."""
    from PIL import Image
    from ..arrays import ClassificationDataset, SegmentationDataset
    from ..tools.preview import save_preview
    classification = meta.get("task") == "classification"
    ds = ClassificationDataset(store) if classification else SegmentationDataset(store,
                                                                                 mode="test")
    index = _record_index(a.index, len(ds))
    img, what = ds[index]
    if classification:
        names = meta.get("classes") or []
        label = float(np.asarray(what).ravel()[0])
        what = "label %g%s" % (label, " (%s)" % names[int(label)]
                               if label.is_integer() and 0 <= label < len(names) else "")
    save_preview(Image.fromarray(img), a.out, a.overwrite)
    print("wrote %s (record %d of %s: %dx%d, %s; no mask)"
          % (a.out, index, a.path, img.shape[1], img.shape[0], what))
    return 0


def cmd_verify(a) -> int:
    from ..tools.verify import verify
    _input(a.path)
    report = verify(a.path, deep=a.deep, split=a.split, remote=_remote(a) or None)
    head, *problems = str(report).splitlines()
    print(head)  # the verdict is the command's output; each problem goes where errors go
    if problems:
        sys.stdout.flush()
        print("\n".join(problems), file=sys.stderr)
    return 0 if report.ok else 1


def cmd_salvage(a) -> int:
    from ..tools.salvage import salvage
    _input(a.path)
    report = salvage(a.path, overwrite=a.overwrite)
    print(report)
    return 0 if report.records else 1


def cmd_info(a) -> int:
    info = describe(a.path, _remote(a), a.split)
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
             epochs: int = 2, out=None) -> dict:
    """``gluon-data demo``: generate a VOC-like sample, pack it into ``workdir``, and read it
    back ``epochs`` times with ``workers`` worker processes -- through Gluon's ``DataLoader``
    (:mod:`gluon_data.gluon.demo`) where MXNet is importable, else as numpy arrays
    (:class:`gluon_data.arrays.SegmentationDataset`) in the converter's pool of worker
    processes (:mod:`gluon_data.convert.demo`). Only the chosen one is imported."""
    if importlib.util.find_spec("mxnet") is not None:
        from ..gluon.demo import run_demo as demo  # the Gluon layer: for this command only
    else:
        from ..convert.demo import run_demo as demo
    return demo(workdir, num_images, workers, batch_size, epochs,
                out=sys.stdout if out is None else out)


def cmd_demo(a) -> int:
    if a.workdir:
        os.makedirs(a.workdir, exist_ok=True)
        res = run_demo(a.workdir, a.num_images, a.workers, a.batch_size, a.epochs)
    else:
        with tempfile.TemporaryDirectory(prefix="gluon-data-demo-") as d:
            res = run_demo(d, a.num_images, a.workers, a.batch_size, a.epochs)
    return 0 if res["ok"] else 1
