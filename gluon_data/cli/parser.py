"""The command line: one parser per command, options several commands share declared once
(parent parsers)."""
from __future__ import annotations

import argparse
import functools
from typing import cast

from .._version import __version__
from ..convert.options import GROUPS, cli_fields, flag_name

from .bench import bench_path
from .commands import cmd_convert, cmd_demo, cmd_info, cmd_salvage, cmd_show, cmd_stats, cmd_verify


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    def _get_help_string(self, action):
        """``(default: X)`` appended once: not to a help that states its own default, nor for
        a default that says nothing (a flag's False, an option's None)."""
        help = action.help or ""
        if ("(default" in help or action.default is None or action.default is False
                or action.nargs == 0):  # a switch: its default is its absence
            return help
        return super()._get_help_string(action)


def _parent(*parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False, parents=list(parents), allow_abbrev=False)


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
    """A command's parser. No parser takes an abbreviation of an option (``--worker`` is not
    ``--workers``): a mistyped flag is a usage error, never another option."""
    return sub.add_parser(name, formatter_class=_Formatter, allow_abbrev=False, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gluon-data", formatter_class=_Formatter, allow_abbrev=False,
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
    _convert_option_flags(c)
    c.set_defaults(func=cmd_convert)


def _convert_option_flags(c) -> None:
    """One flag per :class:`~gluon_data.convert.options.ConvertOptions` field that has one,
    spelled, typed and explained by the field itself (its help text and
    :class:`~gluon_data.convert.options.Flag`); the value lands under the field's name."""
    groups = {title: c.add_argument_group(title, text) for title, text in GROUPS.items()}
    for field, flag in cli_fields():
        # cli_fields gives the fields that have a flag: flag_name is never None here
        where, name = groups[flag.group] if flag.group else c, cast(str, flag_name(field.name))
        kwargs = dict(dest=field.name, help=flag.help or field.metadata["help"],
                      default=flag.command_default(field))
        if field.type == "bool":
            kwargs["action"] = "store_false" if flag.negate else "store_true"
        else:  # named after the flag (--root ROOT); a choice's is its choices
            kwargs.update(type=_argument_type(flag.type), choices=flag.choices,
                          metavar=flag.metavar or (None if flag.choices else
                                                   name[2:].replace("-", "_").upper()))
        where.add_argument(name, **kwargs)


def _argument_type(parse):
    """``parse`` as argparse's ``type``: the message of its ``ValueError`` is the usage error
    (argparse itself would say only "invalid parse_shape value"); the built-in types as
    they are, so their usage errors read as before."""
    if parse is None or parse in (int, float, str):
        return parse

    @functools.wraps(parse)
    def typed(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return typed


def _add_info(sub) -> None:
    i = _command(sub, "info", parents=[_dataset_parser(), _split_parser("LMDB: only this split"),
                                       _json_parser()],
                 help="task, record count, classes, image sizes, format version")
    i.set_defaults(func=cmd_info)


def _add_stats(sub) -> None:
    st = _command(sub, "stats", parents=[_dataset_parser(), _split_parser(),
                                         _json_parser(" (weights as lists)")],
                  help="class pixel counts, image counts, class weights, mean/std")
    st.set_defaults(func=cmd_stats)


def _add_show(sub) -> None:
    sh = _command(sub, "show", parents=[_dataset_parser(), _split_parser()],
                  help="write a PNG of a sample: image, mask overlay and class legend (a "
                       "dataset without masks: the image, its label printed)")
    sh.add_argument("--index", type=int, default=0, help="record position (-1: the last)")
    sh.add_argument("--out", default="sample.png",
                    help="output image: PNG, or JPEG, BMP, TIFF, WebP by its extension")
    sh.add_argument("--overwrite", action="store_true",
                    help="replace an existing --out, if it is a preview gluon-data show wrote "
                         "(any other file is left untouched)")
    sh.add_argument("--alpha", type=float, default=0.55, help="overlay opacity, 0 to 1")
    sh.set_defaults(func=cmd_show)


def _add_verify(sub) -> None:
    v = _command(sub, "verify",
                 parents=[_dataset_parser(), _split_parser("LMDB: only this split")],
                 help="check structure, index, counts and every checksum (--deep: decode)")
    v.add_argument("--deep", action="store_true",
                   help="also decode every image and mask and check mask ids")
    v.set_defaults(func=cmd_verify)


def _add_salvage(sub) -> None:
    sv = _command(sub, "salvage", help="rebuild a lost or short .idx by scanning the .rec")
    sv.add_argument("path", help=".rec file (a shard manifest, an LMDB, a URI or a folder is "
                                 "refused, nothing touched: salvage each shard's .rec)")
    sv.add_argument("--overwrite", action="store_true",
                    help="replace an existing .idx (kept as .idx.bak)")
    sv.set_defaults(func=cmd_salvage)


def _add_bench(sub) -> None:
    if bench_path() is not None:  # a source checkout; an installed wheel has no harness
        sub.add_parser("bench", help="benchmark our loaders against the baselines (see "
                                     "`gluon-data bench --help`)", add_help=False,
                       allow_abbrev=False)


def _add_demo(sub) -> None:
    d = _command(sub, "demo",
                 help="generate a VOC-style sample, pack it and read it back (through "
                      "Gluon's DataLoader where MXNet is installed, else as numpy arrays in "
                      "worker processes)")
    d.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    d.add_argument("--num-images", type=int, default=96, help="images to generate")
    d.add_argument("--workers", type=int, default=2, help="conversion and reading workers")
    d.add_argument("--batch-size", type=int, default=8, help="batch size")
    d.add_argument("--epochs", type=int, default=2, help="passes over the data")
    d.set_defaults(func=cmd_demo)
