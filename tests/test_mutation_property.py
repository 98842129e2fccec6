"""Property: damage to an index (.idx, .idx.gdx) or the metadata (.meta.json) of a dataset,
not only to its records, gives a typed error or exactly the original samples."""
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gluon_data import SegmentationRecordDataset, convert, verify
from gluon_data.errors import GluonDataError
from gluon_data.sample import make_voc

pytestmark = pytest.mark.reliability

FILES = (".idx", ".idx.gdx", ".meta.json")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = make_voc(str(tmp_path_factory.mktemp("pvoc") / "VOC2012"), num_images=8,
                    size_range=(16, 24), seed=5)
    out = str(tmp_path_factory.mktemp("prec") / "p.rec")
    convert(root, out, "voc", split="trainval")
    ds = SegmentationRecordDataset(out)
    ref = [tuple(x.asnumpy() for x in ds[i]) for i in range(len(ds))]
    return out, ref


def _lines(b):
    return b.split(b"\n")


def mutate(data: bytes, kind: str, a: int, b: int, byte: int) -> bytes:
    """One edit of ``data``; positions ``a``/``b`` are taken modulo the size."""
    n = max(len(data), 1)
    a, b = a % n, b % n
    if kind == "flip":
        out = bytearray(data)
        if out:
            out[a] ^= byte or 1
        return bytes(out)
    if kind == "set":
        out = bytearray(data)
        if out:
            out[a] = byte
        return bytes(out)
    if kind == "truncate":
        return data[:a]
    if kind == "delete":
        lo, hi = sorted((a, b))
        return data[:lo] + data[hi + 1:]
    if kind == "insert":
        return data[:a] + bytes([byte]) + data[a:]
    lines = _lines(data)
    i, j = a % len(lines), b % len(lines)
    if kind == "swap_lines":
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "dup_line":
        lines.insert(j, lines[i])
    elif kind == "drop_line":
        del lines[i]
    return b"\n".join(lines)


KINDS = ("flip", "set", "truncate", "delete", "insert", "swap_lines", "dup_line", "drop_line")
edit = st.tuples(st.sampled_from(FILES), st.sampled_from(KINDS), st.integers(0, 1 << 16),
                 st.integers(0, 1 << 16), st.integers(0, 255))


def _apply(src, edits):
    d = tempfile.mkdtemp(prefix="gd-prop-")
    rec = os.path.join(d, "p.rec")
    for ext in (".rec",) + FILES:
        shutil.copy(src[:-4] + ext, rec[:-4] + ext)
    for ext, kind, a, b, byte in edits:
        path = rec[:-4] + ext
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(mutate(data, kind, a, b, byte))
    return d, rec


@settings(max_examples=int(os.environ.get("GLUON_DATA_PROP_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(idx_edits=st.lists(edit.filter(lambda e: e[0] != ".meta.json"), max_size=3),
       meta_edit=st.one_of(st.none(), edit.filter(lambda e: e[0] == ".meta.json")))
def test_damaged_indexes_and_metadata_give_typed_errors_or_the_exact_samples(
        small, idx_edits, meta_edit):
    src, ref = small
    edits = idx_edits + ([meta_edit] if meta_edit else [])
    d, rec = _apply(src, edits)
    try:
        try:
            ds = SegmentationRecordDataset(rec)
            got = [tuple(x.asnumpy() for x in ds[i]) for i in range(len(ds))]
        except GluonDataError:
            assert not verify(rec, deep=True).ok  # what the reader refuses, verify reports
            return
        assert len(got) == len(ref)
        for (gi, gm), (ri, rm) in zip(got, ref):
            assert np.array_equal(gi, ri) and np.array_equal(gm, rm)
        # exact samples: verify finds nothing, or (after an edit of an index) that the
        # binary index readers now ignore is damaged or stale, never a record
        report = verify(rec, deep=True)
        gdx = rec[:-4] + ".idx.gdx"
        assert report.ok or (any(e[0] != ".meta.json" for e in edits)
                             and all(p["where"] == gdx for p in report.problems))
    finally:
        shutil.rmtree(d)
