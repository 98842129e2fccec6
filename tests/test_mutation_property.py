"""Property: damage to an index (.idx, .idx.gdx) or the metadata (.meta.json) of a dataset,
not only to its records, gives a typed error or exactly the original samples."""
import copy
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gluon_data import SegmentationRecordDataset
from gluon_data import convert
from gluon_data.tools import verify
from gluon_data.errors import GluonDataError
from gluon_data.convert.sample import make_voc

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


# --------------------------------------------------------------------------- manifests
@pytest.fixture(scope="module")
def small_sharded(tmp_path_factory):
    """8 records in 4 shards, the manifest's document and every record's bytes."""
    from gluon_data.convert.sample import make_imagefolder
    from gluon_data.stores.shardstore import ShardedStore
    from gluon_data.convert.sharded import convert_sharded
    root = make_imagefolder(str(tmp_path_factory.mktemp("pms") / "src"), classes=("a", "b"),
                            per_class=4, size_range=(16, 24), seed=2)
    man = convert_sharded(root, str(tmp_path_factory.mktemp("pmo") / "s.rec"), "imagefolder",
                          shards=4).outputs["train"]
    with open(man, "rb") as f:
        doc = json.loads(f.read())
    store = ShardedStore(man)
    return man, doc, [store.read(i) for i in range(len(store))]


def mutate_manifest(doc: dict, kind: str, a: int, b: int, value) -> dict:
    """One edit of a manifest document; entry positions ``a``/``b`` are taken modulo the
    number of shards."""
    doc = copy.deepcopy(doc)
    sh = doc["shards"]
    i, j = a % len(sh), b % len(sh)
    if kind == "drop":
        del sh[i]
    elif kind == "duplicate":
        sh.insert(j, dict(sh[i]))
    elif kind == "swap":
        sh[i], sh[j] = sh[j], sh[i]
    elif kind == "rename":  # another shard's name, or one digit of the index or count changed
        sh[i]["name"] = (sh[j]["name"] if value is None else
                         sh[i]["name"].replace("-0000", "-%04d" % (a % 3), 1))
    elif kind == "records":
        sh[i]["records"] += (b % 3) - 1
    elif kind == "total":
        doc["num_records"] += (b % 3) - 1
    elif kind == "meta_total":
        doc["meta"]["num_records"] += (b % 3) - 1
    elif kind == "retype":  # a field gets a value of another type, or goes missing
        field = ("name", "records", "bytes", "idx_sha256", "meta_sha256")[j % 5]
        if value is None:
            del sh[i][field]
        else:
            sh[i][field] = value
    elif kind == "retype_top":
        field = ("shards", "num_records", "meta", "container", "plan")[j % 5]
        if value is None:
            del doc[field]
        else:
            doc[field] = value
    return doc


MKINDS = ("drop", "duplicate", "swap", "rename", "records", "total", "meta_total", "retype",
          "retype_top")
values = st.one_of(st.none(), st.integers(-5, 10), st.text(max_size=4), st.just([]),
                   st.just({}), st.booleans())
medit = st.tuples(st.sampled_from(MKINDS), st.integers(0, 64), st.integers(0, 64), values)


@settings(max_examples=int(os.environ.get("GLUON_DATA_PROP_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edits=st.lists(medit, min_size=1, max_size=3), keep_checksum=st.booleans())
def test_damaged_manifests_give_typed_errors_or_the_exact_records(small_sharded, edits,
                                                                  keep_checksum):
    """Whatever is done to a manifest's entries, counts, names or field types, a reader
    (and verify) refuses it with a typed error, or it serves exactly the original records:
    the checksum is recomputed (``keep_checksum`` false) so only the schema and the
    invariants can tell."""
    from gluon_data.format.meta import dumps_meta
    from gluon_data.stores.shardstore import ShardedStore
    from gluon_data.tools.verify import verify_sharded
    man, doc, ref = small_sharded
    d = tempfile.mkdtemp(prefix="gd-propm-")
    try:
        for name in os.listdir(os.path.dirname(man)):
            shutil.copy(os.path.join(os.path.dirname(man), name), d)
        bad = doc
        for kind, a, b, value in edits:
            try:
                bad = mutate_manifest(bad, kind, a, b, value)
            except (TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError):
                break  # an earlier edit made this one meaningless: test what there is
        path = os.path.join(d, os.path.basename(man))
        with open(path, "wb") as f:
            f.write(json.dumps(bad, sort_keys=True).encode() if keep_checksum
                    else dumps_meta(bad))
        try:
            store = ShardedStore(path)
            got = [store.read(i) for i in range(len(store))]
        except GluonDataError as e:
            assert e.path is not None
            assert not verify_sharded(path).ok  # what the reader refuses, verify reports
            return
        assert got == ref  # every record, byte for byte, in order
        assert verify_sharded(path).ok
    finally:
        shutil.rmtree(d)
