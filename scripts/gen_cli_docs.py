"""Render ``gluon-data --help`` and every subcommand's ``--help`` into docs/cli.md.

    python scripts/gen_cli_docs.py           # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check   # exit 1 if docs/cli.md is out of date

The page is the same on every machine: help is wrapped at COLUMNS=100, ``bench`` (listed only
where the benchmark harness is found) is rendered from the checkout's harness, defaults that
depend on the machine are shown by what they mean, and the heading Python 3.9 calls "optional
arguments" is written as 3.10+ writes it ("options"). tests/test_docs.py regenerates the page in
memory and fails when docs/cli.md differs.
"""
import argparse
import contextlib
import io
import os
import sys
from unittest import mock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "cli.md")
COLUMNS = "100"
#: (subcommand, option) -> what its machine-dependent default is, as shown on the page
MACHINE_DEFAULTS = {("convert", "--workers"): "the CPU count"}

HEADER = """# Command-line reference

Generated from `gluon-data --help` by `python scripts/gen_cli_docs.py`; do not edit by hand
(`pytest tests/test_docs.py` fails when this page and the command differ). A default that
depends on the machine is named here for what it is: `--help` shows its value there (`convert
--workers`: "the CPU count").
`gluon-data bench` is a source-checkout tool: an installed wheel does not list it (see
[Performance](performance.md#running-it)).
"""


def _environment():
    """COLUMNS fixed, and the checkout's harness found, for the time of the rendering."""
    return mock.patch.dict(os.environ, {"COLUMNS": COLUMNS, "GLUON_DATA_BENCH": os.path.join(
        ROOT, "benchmarks", "bench.py")})


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    raise SystemExit("gen_cli_docs: gluon-data has no subcommands")


def _fix_defaults(name, sub):
    for action in sub._actions:
        for option in action.option_strings:
            if (name, option) in MACHINE_DEFAULTS:
                action.default = MACHINE_DEFAULTS[(name, option)]


def _bench_help():
    from gluon_data.cli import load_bench
    bench = load_bench()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            bench.main(["--help"])
        except SystemExit:
            pass
    return out.getvalue()


def _section(title, text):
    text = text.replace("optional arguments:", "options:").rstrip()
    return "\n## %s\n\n```text\n%s\n```\n" % (title, text)


def render():
    """The page, as a string."""
    sys.path.insert(0, ROOT)
    from gluon_data.cli import build_parser
    with _environment():
        parser = build_parser()
        subs = _subparsers(parser)
        missing = [k for k in MACHINE_DEFAULTS if k[0] not in subs]
        if missing:
            raise SystemExit("gen_cli_docs: MACHINE_DEFAULTS names %s, which gluon-data lacks"
                             % missing)
        parts = [HEADER, _section("gluon-data", parser.format_help())]
        for name, sub in subs.items():
            if name == "bench":
                parts.append(_section("gluon-data bench", _bench_help()))
                continue
            _fix_defaults(name, sub)
            parts.append(_section("gluon-data " + name, sub.format_help()))
    return "".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only check docs/cli.md")
    a = p.parse_args(argv)
    text = render()
    if a.check:
        with open(OUT, encoding="utf-8") as f:
            ok = f.read() == text
        print("docs/cli.md is %s" % ("up to date" if ok else
                                     "out of date: run python scripts/gen_cli_docs.py"))
        return 0 if ok else 1
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %s" % os.path.relpath(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
