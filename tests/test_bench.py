"""The benchmark harness runs end to end on a tiny dataset (numbers are not asserted)."""
import io
import math

import pytest


@pytest.mark.slow
def test_bench_smoke(tmp_path):
    from gluon_data.bench import run_bench
    out = io.StringIO()
    res = run_bench(str(tmp_path / "b"), n=24, workers=2, out=out)
    assert len(res["rates"]) == 14 and all(v > 0 and math.isfinite(v)
                                           for v in res["rates"].values())
    assert set(res["ratios"]) >= {"ours .rec train / gluoncv train",
                                  "ours cls / stock ImageRecordIter"}
    text = out.getvalue()
    assert "ratio (same run)" in text and ("met" in text or "MISSED" in text)
