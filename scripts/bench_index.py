#!/usr/bin/env python
"""Index cost per record: gluon_data's numpy index vs stock MXIndexedRecordIO, same files, one run.

    python scripts/bench_index.py --records 1000000

Writes N tiny records with our writer (byte-identical to MXNet's), then opens the pair with
both readers and prints load time, Python heap held by the index, and the ratios.
"""
import argparse
import gc
import os
import tempfile
import time
import tracemalloc

import mxnet as mx

from gluon_data.recordio import RecordFile, RecordWriter


def measure(fn, repeats=3):
    """Median load time (untraced), then the heap the loaded index holds (traced pass)."""
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        obj = fn()
        times.append(time.perf_counter() - t0)
        del obj
    gc.collect()
    tracemalloc.start()
    obj = fn()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return obj, sorted(times)[len(times) // 2], held


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rec = os.path.join(d, "x.rec")
        with RecordWriter(rec) as w:
            for i in range(a.records):
                w.write(i, b"abcd")
            w.finish()
            w.publish()
        ours, t_ours, m_ours = measure(lambda: RecordFile(rec))
        stock, t_stock, m_stock = measure(
            lambda: mx.recordio.MXIndexedRecordIO(rec[:-4] + ".idx", rec, "r"))
        assert ours.read(a.records - 1) == stock.read_idx(a.records - 1)
    n = a.records
    print("%-28s %12s %16s" % ("index of %d records" % n, "load s", "bytes/record"))
    print("%-28s %12.3f %16.1f" % ("gluon_data RecordFile", t_ours, m_ours / n))
    print("%-28s %12.3f %16.1f" % ("mx MXIndexedRecordIO", t_stock, m_stock / n))
    print("ratio (stock / ours):       %11.1fx %15.1fx" % (t_stock / t_ours, m_stock / m_ours))


if __name__ == "__main__":
    main()
