"""The benchmark harness runs end to end on a tiny dataset (numbers are not asserted: only
that every measurement ran and the report holds every row)."""
import io
import math

import pytest


@pytest.mark.slow
def test_bench_smoke(tmp_path):
    from gluon_data.bench import run_bench
    out = io.StringIO()
    res = run_bench(str(tmp_path / "b"), n=24, workers=2, out=out, quick=True,
                    index_records=2000, epochs=1)
    rates = res["rates"]
    for key in ("raw copy of the files, 1 process", "ours convert pass-through, 2 workers",
                "im2rec pass-through, 2 threads", "decode limit, OpenCV, 2 processes",
                "gluoncv VOCSegmentation train", "ours .rec train", "ours LMDB train",
                "stock ImageRecordDataset", "ours ImageRecordDataset",
                "stock ImageRecordIter (crop 224)", "cat .rec (cold)",
                "ours sequential reads (cold)", "ours random reads (warm)",
                "stock read_idx random reads (warm)", "small files, read each (cold)"):
        assert key in rates, key
    assert all(v > 0 and math.isfinite(v) for v in rates.values())
    assert set(res["ratios"]) >= {"ours .rec train / gluoncv train",
                                  "ours cls / stock ImageRecordIter",
                                  "sequential reads / cat (cold)",
                                  "convert pass-through / raw copy"}
    assert res["index"]["ours bytes/record"] < res["index"]["stock bytes/record"]
    assert len(res["rss"]) == 3 and all(len(e) == 2 and all(p > 0 for p, _ in e)
                                        for e in res["rss"])
    text = out.getvalue()
    assert "ratio (same run)" in text and ("met" in text or "MISSED" in text)
