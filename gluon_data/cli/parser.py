"""The command line: one parser per command, options several commands share declared once
(parent parsers)."""
from __future__ import annotations

import argparse
import os


from .._version import __version__
from ..format import codec
from ..convert.sources import DEFAULT_MAX_FILE_BYTES

from .bench import bench_path
from .commands import _cmd_convert, _cmd_demo, _cmd_info, _cmd_salvage, _cmd_show, _cmd_stats, _cmd_verify


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action):
        """``(default: X)`` appended once: not to a help that states its own default, nor for
        a default that says nothing (a flag's False, an option's None)."""
        help = action.help or ""
        if "(default" in help or action.default is None or action.default is False:
            return help
        return super()._get_help_string(action)


def _shape_arg(value: str):
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected a shape like 256,256,3, got %r" % value)
    if not 2 <= len(shape) <= 3 or min(shape) <= 0:
        raise argparse.ArgumentTypeError("expected 2 or 3 positive sizes, got %r" % value)
    return shape


def _parent(*parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, parents=list(parents))


def storage_option_parser() -> argparse.ArgumentParser:
    """``--storage-option KEY=VALUE`` (repeatable), as a parent parser: every command that
    reads or writes a URI declares it through this, and so does the training recipe
    (``ArgumentParser(parents=[storage_option_parser()])``). The values are read by
    :func:`gluon_data.storage.remotefs.parse_storage_options`."""
    p = _parent()
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="fsspec storage option for a URI (repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000; credentials come from the "
                        "standard environment or profile")
    return p


def _dataset_parser(note: str = "") -> argparse.ArgumentParser:
    """PATH, a dataset to read (local or at a URI), and the URI's ``--storage-option``."""
    p = _parent(storage_option_parser())
    p.add_argument("path", help=".rec file or URI (s3://...), .lmdb directory or .shards.json "
                                "manifest" + note)
    return p


def _split_parser(help: str = "LMDB split (default: train)") -> argparse.ArgumentParser:
    """``--split``: the LMDB split to read."""
    p = _parent()
    p.add_argument("--split", help=help)
    return p


def _json_parser(note: str = "") -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--json", action="store_true", help="print JSON" + note)
    return p


def _command(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=_Formatter, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gluon-data", formatter_class=_Formatter,
                                description="Pack image datasets into MXNet RecordIO or "
                                            "LMDB and inspect them.")
    p.add_argument("--version", action="version", version="gluon_data %s" % __version__)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in (_add_convert, _add_info, _add_stats, _add_show, _add_verify, _add_salvage,
                _add_bench, _add_demo):
        add(sub)
    return p


def _add_convert(sub) -> None:
    c = _command(sub, "convert", parents=[storage_option_parser()],
                 help="pack a folder or .lst into .rec/.idx/.meta.json",
                 description="Pack a source into RecordIO or LMDB. Layouts: pairs "
                             "(images/ + masks/), voc, ade20k, cityscapes, imagefolder, "
                             "lst (im2rec list), raw-lmdb (the classic <split>_data/<split>_label recipe), "
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
    _convert_writing(c)
    _convert_source(c)
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _convert_sharding(c)
    c.set_defaults(func=_cmd_convert)


def _convert_writing(c) -> None:
    """How ``convert`` encodes and writes: encodings, workers, replacing, resuming, errors."""
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


def _convert_source(c) -> None:
    """How ``convert`` reads its source: labels, layout folders, limits, raw-lmdb shapes."""
    c.add_argument("--classes", help="class names: comma separated, or a file with one per line")
    c.add_argument("--num-classes", type=int, help="number of classes (mask ids 0..N-1)")
    c.add_argument("--ignore-label", type=int, default=255, help="mask value for 'unlabelled'")
    c.add_argument("--images-dir", default="images", help="pairs layout: images folder")
    c.add_argument("--masks-dir", default="masks", help="pairs layout: masks folder")
    c.add_argument("--root", help="lst layout: folder the listed paths are relative to "
                                  "(default: the .lst's folder)")
    c.add_argument("--max-pixels", type=int, default=codec.DEFAULT_MAX_PIXELS,
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


def _convert_sharding(c) -> None:
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


def _add_info(sub) -> None:
    i = _command(sub, "info", parents=[_dataset_parser(), _json_parser()],
                 help="task, record count, classes, image sizes, format version")
    i.set_defaults(func=_cmd_info)


def _add_stats(sub) -> None:
    st = _command(sub, "stats", parents=[_dataset_parser(), _split_parser(),
                                         _json_parser(" (weights as lists)")],
                  help="class pixel counts, image counts, class weights, mean/std")
    st.set_defaults(func=_cmd_stats)


def _add_show(sub) -> None:
    sh = _command(sub, "show", parents=[_dataset_parser(" (segmentation)"), _split_parser()],
                  help="write a PNG of a sample: image, mask overlay and class legend")
    sh.add_argument("--index", type=int, default=0, help="record position")
    sh.add_argument("--out", default="sample.png",
                    help="output PNG (an existing image file is replaced; any other file or a "
                         "link is refused)")
    sh.add_argument("--alpha", type=float, default=0.55, help="overlay opacity")
    sh.set_defaults(func=_cmd_show)


def _add_verify(sub) -> None:
    v = _command(sub, "verify",
                 parents=[_dataset_parser(), _split_parser("LMDB: only this split")],
                 help="check structure, index, counts and every checksum (--deep: decode)")
    v.add_argument("--deep", action="store_true",
                   help="also decode every image and mask and check mask ids")
    v.set_defaults(func=_cmd_verify)


def _add_salvage(sub) -> None:
    sv = _command(sub, "salvage", help="rebuild a lost or short .idx by scanning the .rec")
    sv.add_argument("path", help=".rec file (a shard manifest, an LMDB, a URI or a folder is "
                                 "refused, nothing touched: salvage each shard's .rec)")
    sv.add_argument("--overwrite", action="store_true",
                    help="replace an existing .idx (kept as .idx.bak)")
    sv.set_defaults(func=_cmd_salvage)


def _add_bench(sub) -> None:
    if bench_path() is not None:  # a source checkout; an installed wheel has no harness
        sub.add_parser("bench", help="benchmark our loaders against the baselines (see "
                                     "`gluon-data bench --help`)", add_help=False)


def _add_demo(sub) -> None:
    d = _command(sub, "demo",
                 help="generate a VOC-style sample, pack it, read it through a DataLoader")
    d.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    d.add_argument("--num-images", type=int, default=96, help="images to generate")
    d.add_argument("--workers", type=int, default=2, help="conversion and DataLoader workers")
    d.add_argument("--batch-size", type=int, default=8, help="DataLoader batch size")
    d.add_argument("--epochs", type=int, default=2, help="passes over the data")
    d.set_defaults(func=_cmd_demo)
