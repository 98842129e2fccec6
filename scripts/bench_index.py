#!/usr/bin/env python
"""Index cost per record: gluon_data's index vs stock MXIndexedRecordIO, same files, one run.

    python scripts/bench_index.py --records 1000000

Writes N tiny records with our writer (byte-identical to MXNet's, plus the binary ``.idx.gdx``),
then opens the pair with our reader (binary copy, and text ``.idx`` only, as im2rec leaves it)
and with the stock one, and prints load time, Python heap held by the index and the private
memory a forked worker gains reading every entry, scaled to a million records. The same
numbers are part of ``gluon-data bench``.
"""
import argparse
import tempfile

from gluon_data.cli import load_bench

index_costs = load_bench().index_costs


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--workdir", help="keep the files here (default: a temporary folder)")
    a = ap.parse_args()
    if a.workdir:
        costs = index_costs(a.workdir, a.records)
    else:
        with tempfile.TemporaryDirectory() as d:
            costs = index_costs(d, a.records)
    for k, v in costs.items():
        print("%-44s %10.3f" % (k, v))
    print("stock / ours: %.1fx the load time, %.1fx the memory" % (
        costs["stock load s per 1M"] / costs["ours load s per 1M"],
        costs["stock bytes/record"] / costs["ours bytes/record"]))


if __name__ == "__main__":
    main()
